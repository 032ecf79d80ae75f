"""lp.Runtime(host_kv_cache_bytes=...) on the default model (issue 34): returning turns of
sessions evicted from a small KV pool load their prefix from the host tier, with the same
greedy text as recomputing it."""

from __future__ import annotations

import torch

import lmprog as lp
from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams


def _turns(host_bytes: int) -> tuple[list[str], dict]:
    torch.set_num_threads(1)
    runtime = lp.Runtime(
        device="cpu",
        max_total_tokens=96,
        max_running_requests=1,
        host_kv_cache_bytes=host_bytes,
        check_integrity=True,
    )
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    history = [f"Session {i}: the number {i * 37} and its friends are " * 3 for i in range(4)]
    texts = []
    try:
        for turn in range(2):
            for i in range(4):
                text = runtime.generate(GenerateRequest(history[i], params)).text
                texts.append(text)
                history[i] += text + f" Then turn {turn}: "
        return texts, runtime.stats()
    finally:
        runtime.shutdown()


def test_the_default_model_gives_the_same_text_with_the_host_tier():
    off, off_stats = _turns(0)
    on, on_stats = _turns(8 << 20)
    assert on == off
    assert on_stats["host_kv_hit_tokens"] > 60
    assert on_stats["prefill_tokens"] < off_stats["prefill_tokens"] - 60
