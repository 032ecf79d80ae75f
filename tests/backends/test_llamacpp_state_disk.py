"""The llama.cpp backend's saved states with a disk tier (issue 34, section 3): sessions that
take turns on one sequence leave their states on disk when memory holds one, and get them
back as exactly as from memory (a damaged file: tests/backends/test_state_cache.py)."""

from __future__ import annotations

import pytest

from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams

llama_cpp = pytest.importorskip("llama_cpp")

from lmprog.backends.llamacpp import LlamaCpp  # noqa: E402

PARAMS = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)


def turns(backend):
    history = [
        f"Session {i}: a story about the number {i * 37}, told slowly. " * 4 for i in range(3)
    ]
    texts = []
    for turn in range(2):
        for i in range(3):
            text = backend.generate(GenerateRequest(history[i], PARAMS)).text
            texts.append(text)
            history[i] += text + f" And then {turn}: "
    return texts, backend.stats()


def make(**kw):
    return LlamaCpp(n_ctx=512, n_parallel=1, min_save_tokens=16, n_threads=1, **kw)


def test_states_come_back_from_disk_as_from_memory(tmp_path):
    roomy = make(state_cache_bytes=256 * 2**20)
    try:
        want, _ = turns(roomy)
    finally:
        roomy.shutdown()
    one = 2 * 2**20  # memory for one session's state (the default model's ~20 kB a token)
    small = make(state_cache_bytes=one, state_cache_disk_bytes=64 * 2**20,
                 state_cache_disk_dir=str(tmp_path))  # fmt: skip
    try:
        got, stats = turns(small)
    finally:
        small.shutdown()
    cache = stats["state_cache"]
    assert got == want
    assert cache["disk_writes"] > 0 and cache["disk_hits"] >= 2
    assert cache["disk_bytes"] <= 64 * 2**20 and cache["bytes"] <= one
