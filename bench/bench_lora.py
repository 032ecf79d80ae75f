"""Multi-LoRA offline throughput (issue 37): lmprog serving many adapters at once beside the
base model alone, in the same run.

    python3 bench/bench_lora.py              # Llama-3.1-8B shape, bf16, random weights, rank 16
                                             # on all seven projections, 0/1/8/64 adapters
    python3 bench/bench_lora.py --smoke      # every path on the CPU (a toy model; timings
                                             # meaningless)
    python3 bench/bench_lora.py --adapters 0 8 --requests 500 --rank 8

The workload is bench_gpu's offline one: N requests (default 1,000), input lengths uniform in
[32, 1024], output lengths uniform in [16, 512], random token ids, seed 0, ignore_eos, greedy.
With k adapters, request i runs under adapter i mod k (k = 0: every request on the base
model). Rows:

    base, plain runtime      lp.Runtime without LoRA (its own model; freed before the next)
    base, LoRA runtime       the LoRA-enabled runtime, every request on the base model
    k adapters               the LoRA-enabled runtime, requests spread over k adapters

and each row's total tokens/s as a fraction of the plain runtime's (the issue's target: >=
85% with 8 adapters). The adapters are random (A ~ N(0, 1/in), B ~ N(0, 1/r)), built in
memory as lmprog.runtime.lora.LoraAdapter objects and registered on the engine (reading 64
folders of 8B adapters from disk would take longer than the run). The adapter pool holds
max(k) slots (--max-loras-per-batch), so no adapter is paged in twice during a row.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported anywhere
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_gpu import make_workload, smoke_config

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def log(*args) -> None:
    print(*args, flush=True)


def random_adapter(config, name: str, rank: int, seed: int):
    """A rank-`rank` adapter on every projection of every layer, in memory (fp32 on the
    host, as read_adapter returns them; the pool casts to the model's dtype)."""
    from lmprog.runtime.lora.adapter import LoraAdapter, module_shapes

    shapes = module_shapes(config)
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(config.num_layers):
        for module in MODULES:
            fan_in, fan_out = shapes[module]
            a = torch.randn(rank, fan_in, generator=g) * fan_in**-0.5
            b = torch.randn(fan_out, rank, generator=g) * (0.1 * rank**-0.5)
            weights[(layer, module)] = (a, b)
    return LoraAdapter(name, f"<random {name}>", rank, frozenset(MODULES), weights)


def make_runtime(args, lora: bool):
    import lmprog as lp

    kw = {}
    if lora:
        kw = dict(
            enable_lora=True,
            max_loras_per_batch=max(1, max(args.adapters)),
            max_lora_rank=args.rank,
            lora_target_modules=MODULES,
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
        **kw,
    )


def run(rt, prompts, out_lens, adapters: list[str]) -> dict:
    """The offline workload, request i under adapters[i % len] (none when empty)."""

    def params(i: int, m: int) -> dict:
        name = adapters[i % len(adapters)] if adapters else None
        return {"max_tokens": m, "ignore_eos": True, "temperature": 0.0, "lora_path": name}

    warm = min(16, len(prompts))
    rt.generate_offline(prompts[:warm], [params(i, 4) for i in range(warm)])  # compiles, pages in
    rt.flush_cache()
    before = rt.stats()
    t0 = time.perf_counter()
    results = rt.generate_offline(prompts, [params(i, m) for i, m in enumerate(out_lens)])
    wall = time.perf_counter() - t0
    after = rt.stats()
    assert [r.completion_tokens for r in results] == out_lens
    tokens = sum(len(p) for p in prompts) + sum(out_lens)
    return {
        "wall": wall,
        "tok_s": tokens / wall,
        "out_tok_s": sum(out_lens) / wall,
        "steps": after["steps"] - before["steps"],
        "swaps": after.get("lora_swaps", 0) - before.get("lora_swaps", 0),
    }


def free_memory() -> None:
    """After the caller dropped its runtime: its model, KV and adapter pools go."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> int:
    args = parse_args()
    from lmprog.runtime.models import PRESETS

    config = PRESETS[args.model]
    prompts, out_lens = make_workload(
        args.requests, config.vocab_size, args.in_range, args.out_range, seed=0
    )
    log(
        f"model {args.model} ({args.dtype}, {args.device}), {len(prompts)} requests, "
        f"{sum(map(len, prompts)):,} input + {sum(out_lens):,} output tokens; rank {args.rank} "
        f"on {', '.join(MODULES)}; adapters {args.adapters}"
    )
    rows: list[tuple[str, dict]] = []
    if not args.no_plain:
        rt = make_runtime(args, lora=False)
        rows.append(("base, plain runtime", run(rt, prompts, out_lens, [])))
        log(f"   {rows[-1][0]}: {rows[-1][1]['tok_s']:,.0f} tok/s")
        rt.shutdown()
        rt = None
        free_memory()
    rt = make_runtime(args, lora=True)
    t0 = time.perf_counter()
    count = max(args.adapters)
    for i in range(count):
        adapter = random_adapter(rt.model_config, f"a{i}", args.rank, seed=i)
        rt.engine.call(lambda a=adapter: rt.engine.lora.register(a))
    log(f"   {count} adapters registered in {time.perf_counter() - t0:.1f} s; "
        f"pool {rt.engine.lora.pool.nbytes / 2**20:,.0f} MiB")  # fmt: skip
    for k in args.adapters:
        name = "base, LoRA runtime" if k == 0 else f"{k} adapter{'s' if k > 1 else ''}"
        rows.append((name, run(rt, prompts, out_lens, [f"a{i}" for i in range(k)])))
        log(f"   {name}: {rows[-1][1]['tok_s']:,.0f} tok/s")
    rt.shutdown()
    ref = rows[0][1]["tok_s"]
    log(f"\n{'':24} {'total tok/s':>12} {'output tok/s':>13} {'vs base':>8} {'wall s':>7} "
        f"{'steps':>6} {'swaps':>6}")  # fmt: skip
    for name, r in rows:
        log(f"{name:24} {r['tok_s']:>12,.0f} {r['out_tok_s']:>13,.0f} {r['tok_s'] / ref:>8.1%} "
            f"{r['wall']:>7.1f} {r['steps']:>6} {r['swaps']:>6}")  # fmt: skip
    return 0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="a toy model on the CPU")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--adapters", type=int, nargs="+", default=[0, 1, 8, 64])
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--no-plain", action="store_true", help="skip the runtime without LoRA")
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--chunk", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--kv-tokens", type=int, default=None, help="KV pool (default: from memory)")
    p.add_argument("--context", type=int, default=2048)
    args = p.parse_args()
    args.in_range, args.out_range = (32, 1024), (16, 512)
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
        args.requests, args.rank = min(args.requests, 12), min(args.rank, 4)
        args.adapters = sorted({min(k, 8) for k in args.adapters})
        args.max_running, args.chunk, args.kv_tokens, args.context = 8, 64, 4096, 256
        args.in_range, args.out_range = (4, 24), (2, 8)
    return args


if __name__ == "__main__":
    sys.exit(main())
