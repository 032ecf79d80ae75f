"""Tiered KV cache (issue 34): a multi-turn workload whose KV is several times the device
pool, with the host tier off (evicted prefixes recomputed), on, and on with predictive
staging, in one run.

    python3 bench/bench_tiered_kv.py          # GPU: Llama-3.1-8B shape, bf16, random weights
    python3 bench/bench_tiered_kv.py --smoke  # CPU: a toy model, every path (each row run
                                              # twice, in both orders: the CPU is shared)
    python3 bench/bench_tiered_kv.py --sessions 200 --turns 6 --history 2048

The workload: S sessions (default 128), each starting from H random tokens of history
(default 1,024) and taking T turns (default 6); a turn sends the session's history plus U new
tokens (default 128) and generates O tokens (default 64, greedy, ignore_eos), which join the
history. Turns go in rounds: every session's turn t, at most C requests outstanding at once
(default 64; the engine runs R = 32 together, so a queue waits for staging to work on), then
turn t + 1. Between two turns of a session all the others run, so with the KV pool at a
quarter of the sessions' final KV (--pool-fraction) a returning turn's history has left the
device. Rows, each with its own runtime (the previous one freed):

    recompute      host_kv_cache_bytes=0: an evicted prefix is prefilled again
    host tier      host_kv_cache_bytes = the sessions' whole KV, staging off
    host + staged  the same with predictive staging (host_kv_staging=True)
    host/4 + disk  a quarter of that in host RAM over a disk tier of the whole (--disk-dir;
                   --no-disk leaves this row out), with staging

Reported per row: cache hits per tier (device / host RAM / disk, and the tokens computed, as
shares of the prompt tokens at their first admission: they sum to 100%; staged tokens are
device hits, counted apart too), the tokens copied in at admission (a retracted request's
second admission too), partial loads (the pool took only part of a match), prefill tokens computed and saved against recompute, mean and p50/p90 time
to first token of returning turns (turn >= 1, from submission: queueing included), throughput (prompt + output tokens / wall time, and
output tokens/s), and the host tier's memory. On a GPU also the host-to-device copy rate:
a plain pinned-to-device copy (the link's limit) beside the tier's own load path.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported anywhere
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_gpu import smoke_config

ROWS = (  # name, host tier, staging, disk tier
    ("recompute", False, False, False),
    ("host tier", True, False, False),
    ("host + staged", True, True, False),
    ("host/4 + disk", True, True, True),
)


def log(*args) -> None:
    print(*args, flush=True)


def final_tokens(args) -> int:
    """The KV of every session after its last turn."""
    return args.sessions * (args.history + args.turns * (args.user + args.output))


def make_runtime(args, host: bool, staging: bool, disk: bool = False):
    import lmprog as lp

    tiers = {}
    if disk:  # a quarter of the host budget in RAM, the whole of it on disk
        tiers = dict(
            host_kv_cache_bytes=args.host_bytes // 4,
            disk_kv_cache_bytes=args.host_bytes,
            disk_kv_cache_dir=args.disk_dir,
        )

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
        host_kv_staging=staging,
        **(tiers or {"host_kv_cache_bytes": args.host_bytes if host else 0}),
    )


def run(rt, args) -> dict:
    """The rounds of turns; per request (session, turn, ttft, output ids)."""
    from lmprog.core.sampling import SamplingParams
    from lmprog.runtime.engine.io import EngineRequest

    vocab = rt.model_config.vocab_size
    rng = random.Random(0)
    history = [[rng.randrange(3, vocab) for _ in range(args.history)] for _ in range(args.sessions)]
    news = [
        [[rng.randrange(3, vocab) for _ in range(args.user)] for _ in range(args.turns)]
        for _ in range(args.sessions)
    ]
    params = SamplingParams(max_tokens=args.output, temperature=0.0, ignore_eos=True)
    engine = rt.engine
    records, lock = [], threading.Lock()

    def one(session: int, turn: int) -> None:
        prompt = history[session] + news[session][turn]
        handle = engine.submit(EngineRequest(tuple(prompt), params), stream=False)
        result = handle.result(timeout=3600)
        ttft = handle.first_token_at - handle.submitted_at
        history[session] = prompt + list(result.token_ids)
        with lock:
            records.append((session, turn, ttft, tuple(result.token_ids)))

    warm = [rng.randrange(3, vocab) for _ in range(args.history)]
    engine.submit(EngineRequest(tuple(warm), params), stream=False).result(timeout=3600)
    rt.flush_cache()  # compiled and warm; nothing cached
    before = rt.stats()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        for turn in range(args.turns):
            list(pool.map(lambda s, t=turn: one(s, t), range(args.sessions)))
            log(f"      turn {turn}: {time.perf_counter() - t0:.1f} s")
    wall = time.perf_counter() - t0
    after = rt.stats()
    delta = {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], (int, float))}
    prompt_tokens = (
        sum(args.history + (t + 1) * args.user + t * args.output for t in range(args.turns))
        * args.sessions
    )
    returning = [r[2] for r in records if r[1] >= 1]
    # the time a returning request waits for its blocks: the engine thread's admission
    # loads (a request admitted with host/disk blocks waits for their copy; staged blocks
    # were copied earlier, while it queued), per returning request
    load_wait = after.get("host_kv_load_seconds", 0.0) - before.get("host_kv_load_seconds", 0.0)
    return {
        "load_wait": load_wait / max(1, len(returning)),
        "wall": wall,
        "tok_s": (prompt_tokens + args.sessions * args.turns * args.output) / wall,
        "out_tok_s": args.sessions * args.turns * args.output / wall,
        "ttft_mean": statistics.fmean(returning),
        "ttft_p50": statistics.median(returning),
        "ttft_p90": statistics.quantiles(returning, n=10)[-1] if len(returning) > 1 else 0.0,
        "stats": delta,
        "host_used": after.get("host_kv_used_bytes", 0),
        "disk_used": after.get("disk_kv_used_bytes", 0),
        "outputs": {(s, t): out for s, t, _, out in records},
    }


def copy_rates(rt, tokens: int) -> tuple[float, float]:
    """GB/s of a plain pinned-to-device copy of `tokens` tokens' KV, and of the host tier's
    load of the same tokens into pool slots (CUDA only)."""
    import numpy as np

    from lmprog.runtime.executor.host_kv import HostKVMover

    mover = HostKVMover(rt.engine.runner.kv)
    nbytes = tokens * mover.bytes_per_token
    buffers = {
        "src": torch.empty(nbytes, dtype=torch.uint8, pin_memory=True),
        "dst": torch.empty(nbytes, dtype=torch.uint8, device="cuda"),
    }

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        return 5 * nbytes / (time.perf_counter() - t) / 1e9

    plain = timed(lambda: buffers["dst"].copy_(buffers["src"], non_blocking=True))
    buffers.clear()
    slots = np.arange(1, tokens + 1)
    handle = mover.save(slots)
    torch.cuda.synchronize()
    tier = timed(lambda: mover.load(handle, slots))
    return plain, tier


def free(rt) -> None:
    rt.shutdown()
    del rt
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> int:
    args = parse_args()
    total = final_tokens(args)
    if args.kv_tokens is None:
        args.kv_tokens = max(64, int(total * args.pool_fraction))
    log(
        f"model {args.model} ({args.dtype}, {args.device}); {args.sessions} sessions x "
        f"{args.turns} turns, history {args.history} + {args.user} per turn, {args.output} "
        f"out; final KV {total:,} tokens, device pool {args.kv_tokens:,} tokens "
        f"({args.kv_tokens / total:.0%}); engine runs {args.max_running}, client keeps "
        f"{args.concurrency} outstanding"
    )
    rows_run = [r for r in ROWS if args.disk_rows or not r[3]]
    order = rows_run if args.repeat == 1 else rows_run + rows_run[::-1]
    best: dict[str, dict] = {}
    for name, host, staging, disk in order:
        if args.host_bytes is None and host:
            from lmprog.runtime.executor.kv_pool import KVPool
            from lmprog.runtime.models import PRESETS

            per = KVPool.bytes_per_token(PRESETS[args.model], getattr(torch, args.dtype))
            args.host_bytes = total * per  # every session's whole KV
        rt = make_runtime(args, host, staging, disk)
        log(f"   {name} ...")
        result = run(rt, args)
        if host and args.device == "cuda" and name == "host tier":
            result["copy"] = copy_rates(rt, min(args.kv_tokens - 1, 16384))
        if args.device == "cuda":
            result["pinned"] = torch.cuda.host_memory_stats().get("allocated_bytes.current", None)
        if name not in best or result["wall"] < best[name]["wall"]:
            best[name] = {**best.get(name, {}), **result}
        log(f"   {name}: {result['wall']:.1f} s, {result['tok_s']:,.0f} tok/s")
        free(rt)
    rows = [(name, best[name]) for name, *_ in rows_run]
    ref = rows[0][1]
    log(
        f"\nhost tier budget {args.host_bytes / 2**20:,.1f} MiB; hit rates as shares of the "
        "prompt tokens admitted"
    )
    head = (
        f"{'':14} {'device hit':>10} {'host hit':>9} {'disk hit':>9} {'computed':>8} "
        f"{'loaded':>9} {'staged':>8} {'partial':>7} {'prefill tok':>12} "
        f"{'saved':>10} {'TTFT ret. mean':>14} {'p50':>7} {'p90':>7} {'load wait':>9} "
        f"{'staged s':>8} {'tok/s':>9} {'out tok/s':>9} {'host used':>10}"
    )
    log(head)
    for name, r in rows:
        s = r["stats"]
        # a first admission's prompt: device hits (staged ones too) + host hits + disk hits +
        # computed; loaded: every admission's host/disk loads (retried requests' too)
        prompt = max(1, s.get("prompt_tokens", 0))
        cached, host_hit = s.get("cached_tokens", 0), s.get("cached_host_tokens", 0)
        disk_hit = s.get("cached_disk_tokens", 0)
        log(
            f"{name:14} {(cached - host_hit) / prompt:>10.1%} "
            f"{(host_hit - disk_hit) / prompt:>9.1%} {disk_hit / prompt:>9.1%} "
            f"{(prompt - cached) / prompt:>8.1%} {s.get('host_kv_hit_tokens', 0):>9,} "
            f"{s.get('host_kv_staged_tokens', 0):>8,} {s.get('host_kv_partial_loads', 0):>7,} "
            f"{s['prefill_tokens']:>12,} "
            f"{ref['stats']['prefill_tokens'] - s['prefill_tokens']:>10,} "
            f"{r['ttft_mean'] * 1e3:>11.1f} ms {r['ttft_p50'] * 1e3:>7.1f} "
            f"{r['ttft_p90'] * 1e3:>7.1f} {r['load_wait'] * 1e3:>6.2f} ms "
            f"{s.get('host_kv_staged_load_seconds', 0.0):>8.3f} "
            f"{r['tok_s']:>9,.0f} {r['out_tok_s']:>9,.1f} "
            f"{r['host_used'] / 2**20:>7.1f} MiB"
        )
    log(
        "(shares of the prompt tokens at their first admission: device hit (staged tokens "
        "among them), host hit (host RAM), disk hit, computed; they sum to 100%. loaded: "
        "tokens admission copied from host or disk, a retracted request's second admission "
        "too; staged: copied ahead of admission; partial: loads the pool could take only "
        "part of; load wait: admission's copies per returning request; staged s: the copies "
        "made ahead, while requests queued)"
    )
    for name, r in rows[1:]:
        same = sum(r["outputs"][k] == ref["outputs"][k] for k in ref["outputs"])
        log(
            f"{name}: {ref['wall'] / r['wall']:.2f}x throughput, "
            f"{ref['ttft_mean'] / r['ttft_mean']:.2f}x lower mean TTFT of returning turns vs "
            f"recompute; greedy outputs equal to recompute's: {same} of {len(ref['outputs'])}"
        )
        if "copy" in r:
            plain, tier = r["copy"]
            log(f"   host-to-device copy: plain pinned {plain:.1f} GB/s, tier load {tier:.1f} GB/s")
        if r.get("pinned") is not None:
            log(f"   pinned host memory allocated at the end: {r['pinned'] / 2**30:.2f} GiB")
    return 0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="a toy model on the CPU")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--sessions", type=int, default=128)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--history", type=int, default=1024, help="first turn's history tokens")
    p.add_argument("--user", type=int, default=128, help="new tokens per turn")
    p.add_argument("--output", type=int, default=64, help="generated tokens per turn")
    p.add_argument("--max-running", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=64, help="requests outstanding")
    p.add_argument("--chunk", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--pool-fraction", type=float, default=0.25, help="device pool / final KV")
    p.add_argument("--kv-tokens", type=int, default=None, help="device pool (overrides)")
    p.add_argument("--host-bytes", type=int, default=None, help="host tier (default: all KV)")
    p.add_argument(
        "--no-disk", dest="disk_rows", action="store_false",
        help="leave out the row with a quarter of the host tier in RAM over a disk tier",
    )  # fmt: skip
    p.add_argument("--disk-dir", default=None, help="the disk tier's folder (default: tmp)")
    p.add_argument(
        "--repeat", type=int, choices=(1, 2), default=None,
        help="2: the rows again in reverse order, each row's faster run kept (default: 2 "
        "with --smoke, where the CPU is shared; 1 on a GPU)",
    )  # fmt: skip
    args = p.parse_args()
    args.device, args.dtype, args.attention = "cuda", "bfloat16", "auto"
    if args.smoke:
        from lmprog.runtime.models import PRESETS

        PRESETS["smoke-tiny"] = smoke_config()  # a toy architecture, for this process only
        args.model, args.device, args.dtype, args.attention = (
            "smoke-tiny",
            "cpu",
            "float32",
            "torch",
        )
        args.sessions, args.turns = min(args.sessions, 16), min(args.turns, 4)
        args.history, args.user, args.output = 96, 16, 8
        args.max_running, args.concurrency, args.chunk = 2, 4, 256
    if args.repeat is None:
        args.repeat = 2 if args.smoke else 1
    args.context = args.history + args.turns * (args.user + args.output) + 8
    return args


if __name__ == "__main__":
    sys.exit(main())
