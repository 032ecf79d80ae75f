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
    # the tiers under the runtime's names, as /metrics and the engine line read them
    assert stats["host_kv_used_bytes"] == cache["bytes"] and stats["host_kv_capacity_bytes"] == one
    assert stats["disk_kv_used_bytes"] == cache["disk_bytes"]
    assert stats["host_kv_hit_tokens"] >= stats["disk_kv_hit_tokens"] > 0
    assert stats["disk_kv_write_failures"] == stats["host_kv_load_failures"] == 0
    from lmprog.serve.engine_log import EngineLog
    from lmprog.serve.metrics import ServerMetrics

    text = ServerMetrics(lambda: stats).render().decode()
    values = dict(line.split(" ") for line in text.splitlines() if not line.startswith("#"))
    assert float(values["lmprog_disk_kv_cache_hit_tokens_total"]) == stats["disk_kv_hit_tokens"]
    assert float(values["lmprog_host_kv_cache_used_bytes"]) == cache["bytes"]
    counters = ("prompt_tokens", "cached_tokens", "host_kv_hit_tokens", "disk_kv_hit_tokens")
    seen = [dict(stats, **dict.fromkeys(counters, 0)), stats]  # the counts from 0, then now
    log = EngineLog(lambda: seen.pop(0))
    log.line(now=0.0)
    line = log.line(now=10.0)
    assert "| host tier " in line and "| disk tier " in line
    assert line.count("MiB), ") == 2 and line.count("of prompt tokens loaded from it") == 2
