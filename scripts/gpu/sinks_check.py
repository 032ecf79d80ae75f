"""Attention sinks on the device path: the bundled model streaming past a small window with
the GPU's defaults (Triton attention, decode and piecewise CUDA graphs, overlap scheduling),
several requests at once, beside window attention without sinks.

    python3 scripts/gpu/sinks_check.py          # on the GPU (after stage.sh c)
    python3 scripts/gpu/sinks_check.py --cpu    # anywhere, smaller

For each variant: every request must end at max_tokens (never cut by the context), with
evictions, the bookkeeping checked after every step, KV use bounded by the windows; then the
same model with full attention scores each text: the mean logprob of the tokens sampled
before the first eviction, after it, and over the last quarter. Exit status 1 when a check
fails or the sinks' (greedy) text scores more than 0.5 below its own start after eviction
(0.75 over the last quarter).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lmprog as lp
from lmprog.core.sampling import SamplingParams as SP
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine

PROMPTS = [
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The history of the printing press begins",
    "Here is a long list of practical tips for learning a new language:",
    "Dear diary, today was the strangest day of my life. It started when",
]


def run(rt: lp.Runtime, n: int, requests: int, window: int) -> tuple[list, float, int]:
    prompts = [f"Story {i}. {PROMPTS[i % len(PROMPTS)]}" for i in range(requests)]
    params = SP(max_tokens=n, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    results = rt.generate(prompts, params)
    took = time.perf_counter() - start
    stats = rt.stats()
    assert all(r.finish_reason == "length" and len(r.token_ids) == n for r in results)
    assert stats["kv_evicted_tokens"] > 0 and stats["internal_errors"] == 0
    return [(rt._encode(p), r) for p, r in zip(prompts, results)], took, stats["kv_evicted_tokens"]


def score(full, runs: list, limit: int) -> tuple[float, float, float]:
    before, after, tail = [], [], []
    for ids, r in runs:
        req = EngineRequest(tuple(ids) + r.token_ids, SP(max_tokens=0), None, len(ids) - 1)
        lps = [lp.logprob for lp in full.submit(req).result(600).prompt_logprobs][
            -len(r.token_ids) :
        ]
        first = limit - len(ids) + 1
        before += lps[:first]
        after += lps[first:]
        tail += lps[-len(lps) // 4 :]
    return statistics.mean(before), statistics.mean(after), statistics.mean(tail)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="the CPU path, smaller")
    args = ap.parse_args()
    device = "cpu" if args.cpu else "cuda"
    n, requests, window = (150, 2, 60) if args.cpu else (1500, 16, 252)
    out = {}
    for sinks in (4, 0):
        rt = lp.Runtime(
            device=device,
            attention_sink_size=sinks,
            sliding_window_size=window + 4 - sinks,  # the same KV per request
            max_total_tokens=requests * (window + 4) * 2,
            check_integrity=True,
        )
        runs, took, evicted = run(rt, n, requests, window)
        full = launch_engine(
            rt.engine.runner.model,
            rt.tokenizer,
            eos_token_ids=rt.engine.eos_token_ids,
            max_total_tokens=requests * 2048,
        )
        out[sinks] = score(full, runs, window + 4)
        full.shutdown()
        rt.shutdown()
        print(
            f"sinks={sinks} window={window + 4 - sinks}: {requests} x {n} tokens in {took:.1f} s, "
            f"{evicted} evicted; full-attention logprob before/after first eviction/last "
            f"quarter: {out[sinks][0]:.3f} / {out[sinks][1]:.3f} / {out[sinks][2]:.3f}",
            flush=True,
        )
    before, after, tail = out[4]
    ok = after >= before - 0.5 and tail >= before - 0.75
    print("sinks fluent" if ok else "sinks NOT fluent", "(window attention:", out[0][1:], ")")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
