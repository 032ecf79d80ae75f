"""Hybrid batching under Poisson arrivals (issue 5): time per output token and throughput
when prefills and decodes share each step (lmprog's default, XY-Serve's hybrid batch) beside
prefill-first scheduling (a step with prompt work runs only prompt work; the decodes wait),
measured in the same run on the same model, workload and arrival times.

    python3 bench/bench_poisson.py                  # H200: Llama-3.1-8B shape, bf16, random weights
    python3 bench/bench_poisson.py --smoke          # the code path on the CPU, a toy model

Workload: N requests (default 500), input lengths uniform in [32, 1024], output lengths
uniform in [16, 512] (random token ids, seed 0, ignore_eos, greedy), arriving as a Poisson
process of `--rate` requests/s (seed 0), submitted to the engine at their arrival times
without waiting for each other. Per request: TTFT = first output token - submission; TPOT =
(finish - first token) / (output tokens - 1). Printed: p50/p99 of both, output and total
throughput (tokens / (last finish - first arrival)), and hybrid / prefill-first ratios.
Both modes use the same token budget per step (`--chunk`) and the decode CUDA graphs; a
prefill-first step is never a graph step, a hybrid step with prompt work is not either.
"""

from __future__ import annotations

import argparse
import gc
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import make_workload, smoke_config


def log(*args) -> None:
    print(*args, flush=True)


def build(args, hybrid: bool):
    import lmprog as lp

    return lp.Runtime(
        model=args.model,
        load_format="dummy",
        device=args.device,
        dtype=args.dtype,
        attention=args.attention,
        max_total_tokens=args.kv_tokens,
        context_length=args.context,
        max_running_requests=args.max_running,
        max_num_batched_tokens=args.chunk,
        hybrid_batching=hybrid,
    )


def submit_poisson(rt, prompts, out_lens, arrivals, handles: list) -> None:
    """Submit request i at arrivals[i] seconds from now, appending its handle to `handles`."""
    from lmprog.core.sampling import SamplingParams
    from lmprog.runtime.engine.io import EngineRequest

    t0 = time.perf_counter()
    for prompt, m, at in zip(prompts, out_lens, arrivals):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        params = SamplingParams(max_tokens=m, ignore_eos=True, temperature=0.0)
        handles.append(rt.engine.submit(EngineRequest(tuple(prompt), params), stream=False))


def run_mode(args, hybrid: bool, prompts, out_lens, arrivals) -> dict:
    name = "hybrid" if hybrid else "prefill-first"
    log(f"\n== {name}")
    t0 = time.perf_counter()
    rt = build(args, hybrid)
    warm_p, warm_o = make_workload(
        16, rt.model_config.vocab_size, args.in_range, args.out_range, seed=1
    )
    rt.generate_offline(
        warm_p, [{"max_tokens": m, "ignore_eos": True, "temperature": 0.0} for m in warm_o]
    )  # compiles kernels, captures nothing new
    rt.flush_cache()
    log(f"   built and warmed up in {time.perf_counter() - t0:.1f} s")
    before = rt.stats()
    done = threading.Event()
    handles: list = []

    def progress():
        while not done.wait(15.0):
            st = rt.stats()
            log(
                f"   ... {len(handles)} submitted, running {st['num_running']}, "
                f"waiting {st['num_waiting']}"
            )

    watcher = threading.Thread(target=progress, daemon=True)
    watcher.start()
    submit_poisson(rt, prompts, out_lens, arrivals, handles)
    results = [h.result() for h in handles]
    done.set()
    after = rt.stats()
    assert [r.completion_tokens for r in results] == out_lens, "exact output lengths"
    res = summarize(handles, prompts, out_lens)
    res["steps"] = after["steps"] - before["steps"]
    rt.shutdown()
    rt = None  # its KV pool goes before the next mode builds one
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    log(
        f"   TPOT p50 {res['tpot_p50'] * 1e3:.1f} ms, p99 {res['tpot_p99'] * 1e3:.1f} ms; "
        f"TTFT p50 {res['ttft_p50'] * 1e3:.0f} ms, p99 {res['ttft_p99'] * 1e3:.0f} ms; "
        f"{res['out_tok_s']:,.0f} output tok/s, {res['total_tok_s']:,.0f} total tok/s over "
        f"{res['span']:.1f} s, {res['steps']} steps"
    )
    return res


def summarize(handles, prompts, out_lens) -> dict:
    ttft, tpot = [], []
    for h, m in zip(handles, out_lens):
        first = h.first_token_at if h.first_token_at is not None else h.finished_at
        ttft.append(first - h.submitted_at)
        if m > 1:
            tpot.append((h.finished_at - first) / (m - 1))
    span = max(h.finished_at for h in handles) - min(h.submitted_at for h in handles)
    total_in, total_out = sum(len(p) for p in prompts), sum(out_lens)
    return {
        "ttft_p50": float(np.percentile(ttft, 50)),
        "ttft_p99": float(np.percentile(ttft, 99)),
        "tpot_p50": float(np.percentile(tpot, 50)),
        "tpot_p99": float(np.percentile(tpot, 99)),
        "span": span,
        "out_tok_s": total_out / span,
        "total_tok_s": (total_in + total_out) / span,
    }


def main() -> None:
    args = parse_args()
    if torch.cuda.is_available():
        log(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    from lmprog.runtime.models import PRESETS

    cfg = PRESETS[args.model]
    prompts, out_lens = make_workload(args.requests, cfg.vocab_size, args.in_range, args.out_range)
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1.0 / args.rate, args.requests)).tolist()
    log(
        f"{args.requests} requests at {args.rate}/s (last arrival {arrivals[-1]:.1f} s), "
        f"{sum(map(len, prompts)):,} input + {sum(out_lens):,} output tokens; token budget "
        f"{args.chunk}/step, up to {args.max_running} running"
    )
    hybrid = run_mode(args, True, prompts, out_lens, arrivals)
    first = run_mode(args, False, prompts, out_lens, arrivals)
    log("\n== summary (hybrid vs prefill-first; ratio < 1 is better for latencies)")
    log(f"  {'metric':26s} {'hybrid':>12s} {'prefill-first':>14s}  ratio")
    for key, unit, scale in (
        ("tpot_p50", "ms", 1e3),
        ("tpot_p99", "ms", 1e3),
        ("ttft_p50", "ms", 1e3),
        ("ttft_p99", "ms", 1e3),
        ("out_tok_s", "tok/s", 1),
        ("total_tok_s", "tok/s", 1),
    ):
        a, b = hybrid[key] * scale, first[key] * scale
        log(f"  {key + ' (' + unit + ')':26s} {a:12,.1f} {b:14,.1f}  {a / b:.2f}x")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="toy model on the CPU")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--rate", type=float, default=16.0, help="arrivals per second")
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--chunk", type=int, default=2048, help="max_num_batched_tokens")
    p.add_argument("--kv-tokens", type=int, default=400_000)
    p.add_argument("--context", type=int, default=2048)
    args = p.parse_args()
    args.in_range, args.out_range = (32, 1024), (16, 512)
    args.device, args.dtype, args.attention = "cuda", "bfloat16", "triton"
    if args.smoke:
        from lmprog.runtime.models import PRESETS

        PRESETS["smoke-tiny"] = smoke_config()  # a toy architecture, for this process only
        args.model, args.device, args.dtype, args.attention = (
            "smoke-tiny",
            "cpu",
            "float32",
            "torch",
        )
        args.requests, args.rate = min(args.requests, 24), 40.0
        args.max_running, args.chunk, args.kv_tokens, args.context = 8, 64, 4096, 256
        args.in_range, args.out_range = (4, 48), (2, 16)
    return args


if __name__ == "__main__":
    main()
