"""The fused MoE kernel (lmprog.runtime.kernels.moe) beside a per-expert loop in PyTorch, in
one run, at 1, 64 and 512 tokens of the Mixtral-8x7B shape (hidden 4096, 8 experts of 14336,
top-2, bf16), with the fraction of the weight-read limit.

    python3 bench/bench_moe.py                  # on a CUDA GPU
    python3 bench/bench_moe.py --smoke          # every code path on the CPU (Triton's
                                                # interpreter, toy sizes); timings meaningless
    python3 bench/bench_moe.py --sweep          # also time other tile configs (graph replay)

Per token count: the routing is random (softmax top-2 of N(0, 1) logits, seed 0); rows:
  fused, eager        fused_moe as the layer calls it (moe_align + 2 grouped GEMMs + top-k sum)
  fused, CUDA graph   the same replayed from a CUDA graph (as in the decode and piecewise
                      graphs: no launch gaps; also checks that it is capturable)
  torch loop          each expert with tokens: gather its rows, gate_up matmul, SiLU-and-mul,
                      down matmul, weighted index_add (transformers' "eager" experts)
  torch grouped_mm    transformers' default experts on a GPU (torch._grouped_mm), when it runs
Limit: the bytes of the experts the batch routes to, read once at the card's copy rate, measured
at start (bench/hardware.py; an H200: 4.28 TB/s; at these sizes the GEMMs' FLOPs take less: 512
tokens are 361 GFLOP, 0.46 ms at the H200's 787 TFLOP/s, against 0.66 ms to read the 2.8 GB of 8
experts). Times: medians of triton.testing.do_bench
(L2 flushed; bench_kernels.py's timers); moe_align is also timed alone, at the block size fused_moe picks.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported anywhere
    os.environ.setdefault("TRITON_INTERPRET", "1")

import bench_kernels  # its timers: CUDA-event medians, CUDA-graph replays (DEV set in main)
import torch
import torch.nn.functional as F
from bench_kernels import bench, bench_graph
from hardware import measure

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def log(*args) -> None:
    print(*args, flush=True)


def torch_loop(x, w13, w2, weights, ids):
    """The per-expert loop (transformers' eager MixtralExperts, in the model's dtype)."""
    out = torch.zeros_like(x)
    inter = w2.shape[2]
    hit = torch.bincount(ids.flatten(), minlength=w13.shape[0]).nonzero().flatten().tolist()
    for e in hit:
        rows, slot = torch.where(ids == e)
        gate_up = F.linear(x[rows], w13[e])
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = F.linear(act, w2[e]) * weights[rows, slot, None].to(x.dtype)
        out.index_add_(0, rows, y)
    return out


def grouped_mm_experts(w13, w2):
    """transformers' experts module with its default grouped_mm implementation, sharing the
    weights; None where it cannot run here."""
    try:
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts

        e, two_i, h = w13.shape
        cfg = MixtralConfig(hidden_size=h, intermediate_size=two_i // 2, num_local_experts=e)
        cfg._experts_implementation = "grouped_mm"
        with torch.device("meta"):
            experts = MixtralExperts(cfg)
        experts.gate_up_proj = torch.nn.Parameter(w13, requires_grad=False)
        experts.down_proj = torch.nn.Parameter(w2, requires_grad=False)
        return experts
    except Exception as exc:  # an older transformers, no grouped_mm: the row is skipped
        log(f"   (transformers' grouped_mm experts unavailable: {exc})")
        return None


def run(tokens: int, args, w13, w2) -> None:
    from lmprog.runtime.kernels.moe import block_config, fused_moe, moe_align
    from lmprog.runtime.kernels.moe_ref import fused_moe_ref

    dev, dtype = args.device, w13.dtype
    experts, top_k = w13.shape[0], args.top_k
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(tokens, w13.shape[2], dtype=dtype, device=dev, generator=g)
    logits = torch.randn(tokens, experts, device=dev, generator=g)
    weights, ids = logits.softmax(-1).topk(top_k, dim=-1)
    weights, ids = weights.contiguous(), ids.to(torch.int32)
    with torch.inference_mode():
        fused = fused_moe(x, w13, w2, weights, ids)
        loop = torch_loop(x, w13, w2, weights, ids)
        ref = fused_moe_ref(x, w13, w2, weights, ids).float()
    err = [((o.float() - ref).norm() / ref.norm()).item() for o in (fused, loop)]
    active = torch.unique(ids).numel()
    read = active * (w13[0].numel() + w2[0].numel()) * w13.element_size()
    limit_ms = read / (args.hw.copy_tbs * 1e9)
    flops = 2 * tokens * top_k * (w13[0].numel() + w2[0].numel())
    log(
        f"\n== {tokens} tokens: {active} of {experts} experts hit, {read / 1e9:.2f} GB of "
        f"weights = {limit_ms * 1e3:.0f} us at {args.hw.copy_tbs:.2f} TB/s; {flops / 1e9:.1f} "
        f"GFLOP = {flops / (args.hw.bf16_tflops * 1e9) * 1e3:.0f} us at "
        f"{args.hw.bf16_tflops:.0f} TFLOP/s; rel. error "
        f"vs the fp32 reference: fused {err[0]:.1e}, loop {err[1]:.1e}"
    )
    rows = {
        "fused, eager": bench(lambda: fused_moe(x, w13, w2, weights, ids)),
        "fused, CUDA graph": bench_graph(lambda: fused_moe(x, w13, w2, weights, ids)),
        "torch loop": bench(lambda: torch_loop(x, w13, w2, weights, ids)),
    }
    hf = grouped_mm_experts(w13, w2) if dev == "cuda" and not args.smoke else None
    if hf is not None:
        with torch.inference_mode():
            rows["torch grouped_mm (transformers)"] = bench(lambda: hf(x, ids.long(), weights))
    block = block_config(tokens * top_k, experts)["BLOCK_M"]
    align_ms = bench(lambda: moe_align(ids, experts, block))
    loop_ms = rows["torch loop"]
    for name, ms in rows.items():
        log(
            f"   {name:32s} {ms * 1e3:9.1f} us  {limit_ms / ms:5.0%} of the weight-read limit  "
            f"{loop_ms / ms:5.2f}x the loop"
        )
    log(f"   (moe_align alone, BLOCK_M {block}: {align_ms * 1e3:.1f} us)")
    if args.sweep:
        sweep(x, w13, w2, weights, ids, limit_ms)


SWEEP = [  # BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages
    (16, 32, 128, 1, 4, 4), (16, 64, 64, 1, 4, 4), (16, 32, 64, 1, 4, 5), (16, 128, 64, 1, 4, 3),
    (16, 64, 128, 1, 8, 3), (32, 64, 64, 4, 4, 3), (32, 128, 64, 4, 8, 3), (64, 64, 64, 8, 4, 3),
    (64, 128, 64, 8, 8, 3), (64, 128, 64, 8, 4, 4), (128, 128, 64, 8, 8, 3),
]  # fmt: skip


def sweep(x, w13, w2, weights, ids, limit_ms) -> None:
    """Each SWEEP tile config of fused_moe replayed from a CUDA graph; the best first."""
    from lmprog.runtime.kernels.moe import _CONFIG_KEYS, fused_moe

    times = []
    for tiles in SWEEP:
        cfg = dict(zip(_CONFIG_KEYS, tiles))
        try:
            ms = bench_graph(lambda: fused_moe(x, w13, w2, weights, ids, config=cfg))
        except Exception as exc:  # a config that does not fit (shared memory): skipped
            log(f"   sweep {tiles}: failed ({type(exc).__name__})")
            continue
        times.append((ms, tiles))
    for ms, tiles in sorted(times)[:5]:
        log(f"   sweep {tiles}: {ms * 1e3:.1f} us, {limit_ms / ms:.0%} of the limit")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="toy sizes on the CPU interpreter")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 512])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--sweep", action="store_true", help="time the SWEEP tile configs too")
    args = p.parse_args()
    args.device, dtype = ("cpu", torch.float16) if args.smoke else ("cuda", torch.bfloat16)
    bench_kernels.DEV = args.device
    if args.smoke:
        args.tokens, args.hidden, args.intermediate = [1, 8, 40], 64, 96
    args.hw = measure(args.device)
    log(f"hardware: {args.hw.describe()}, torch {torch.__version__}")
    g = torch.Generator(device=args.device).manual_seed(1)
    e, h, i = args.experts, args.hidden, args.intermediate
    w13 = torch.randn(e, 2 * i, h, dtype=dtype, device=args.device, generator=g) * h**-0.5
    w2 = torch.randn(e, h, i, dtype=dtype, device=args.device, generator=g) * i**-0.5
    log(f"experts: {e} x (gate_up [{2 * i}, {h}], down [{h}, {i}]), top-{args.top_k}, {dtype}")
    for tokens in args.tokens:
        run(tokens, args, w13, w2)


if __name__ == "__main__":
    main()
