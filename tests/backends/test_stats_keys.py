"""Both sampling backends report the engine gauges under the same stats() keys (what /metrics
and the server's engine line read): running and queued requests, prefix cache hit rate, KV
usage, prompts counted when admitted and generated tokens as they are made, throughput over
busy time (issue 28)."""

from __future__ import annotations

import pytest
import torch

import lmprog as lp
from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams

SHARED = (
    "num_running",
    "num_waiting",
    "num_retractions",
    "constraint_lexer_renewals",
    "prompt_tokens",
    "cached_tokens",
    "cache_hit_rate",
    "kv_capacity",
    "kv_used",
    "kv_usage",
    "generated_tokens",
    "busy_seconds",
    "gen_tokens_per_s",
)


def _make(kind: str):
    if kind == "llamacpp":
        pytest.importorskip("llama_cpp")
        return lp.LlamaCpp()
    torch.set_num_threads(1)
    return lp.Runtime(device="cpu")


@pytest.mark.parametrize("kind", ["llamacpp", "runtime"])
def test_the_engine_gauges_share_their_names(kind):
    backend = _make(kind)
    try:
        assert set(SHARED) <= set(backend.stats()), kind
        prompt = "The quick brown fox jumps over the lazy dog. " * 4
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        seen, prompts = [], []

        def streamed(piece):  # prompt and generated tokens counted while the request runs
            stats = backend.stats()
            seen.append(stats["generated_tokens"])
            prompts.append(stats["prompt_tokens"])

        backend.generate(GenerateRequest(prompt, params), stream=streamed)
        backend.generate(GenerateRequest(prompt, params))  # the prompt again: a cache hit
        stats = backend.stats()
    finally:
        backend.shutdown()
    assert stats["generated_tokens"] == 12
    assert 0 < seen[-1] <= 6 and seen == sorted(seen)
    assert prompts[-1] > 0  # counted when admitted (the runtime: in its next snapshot)
    assert stats["cached_tokens"] > 0 and 0 < stats["cache_hit_rate"] <= 0.5
    assert 0 < stats["kv_used"] <= stats["kv_capacity"]
    assert stats["kv_usage"] == pytest.approx(stats["kv_used"] / stats["kv_capacity"])
    assert stats["busy_seconds"] > 0 and stats["gen_tokens_per_s"] > 0
    assert stats["num_running"] == stats["num_waiting"] == 0


def test_llamacpp_counts_a_shared_prefix_s_cells_once():
    from lmprog.backends.llamacpp import _gauges

    counts = {"busy_us": 2_000_000, "prompt_tokens": 10, "cached_tokens": 4, "generated_tokens": 8}
    gauges = _gauges(counts, [[1, 2, 3, 4], [1, 2, 3, 9, 9], [], [7]], n_ctx=100)
    assert gauges["kv_used"] == 4 + 2 + 1  # [1,2,3] once, then 4 | 9,9 | 7
    assert gauges["kv_usage"] == 0.07 and gauges["cache_hit_rate"] == 0.4
    assert gauges["busy_seconds"] == 2.0 and gauges["gen_tokens_per_s"] == 4.0
