"""FP8 kernels on a CUDA GPU beside bf16, measured in the same run (issue 20, item 3).

    python3 bench/bench_fp8.py            # H200: Llama-3.1-8B's linear shapes, decode attention
    python3 bench/bench_fp8.py --smoke    # every path on the CPU interpreter, toy sizes

1. Linears at Llama-3.1-8B's shapes (qkv 4096->6144, o 4096->4096, gate_up 4096->28672,
   down 14336->4096) and M = 1, 16, 256, 2048 rows: bf16 F.linear beside Fp8Linear (per
   channel, per-token activations) through the fused small-M kernel (M <= 16) and through
   quantize_fp8 + torch._scaled_mm. Each timing runs x through 8 layers of the shape (so
   the weights come from HBM, not the 50 MB L2), replayed from a CUDA graph as decode steps
   are; per layer: microseconds, weight bytes read per second (small M) or TFLOP/s.
2. Decode attention over a bf16 and an FP8 pool (32q/8kv heads, d 128): 1 x 32768,
   8 x 4096, 64 x 4096; KV bytes read per second.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported anywhere
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_kernels as bk

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
ROWS_M = (1, 16, 256, 2048)
LAYERS = 8


def bench_linears(args) -> None:
    from lmprog.runtime.layers.fp8_linear import Fp8Linear

    shapes, rows = (SHAPES, ROWS_M) if not args.smoke else ({"toy": (64, 48)}, (1, 20))
    for name, (k, n) in shapes.items():
        print(f"\n== {name}: {k} -> {n}, {LAYERS} layers per timing")
        plain = [nn.Linear(k, n, bias=False, device=bk.DEV, dtype=bk.DTYPE) for _ in range(LAYERS)]
        fp8 = [Fp8Linear.from_linear(layer) for layer in plain]
        for layer in fp8:
            layer.use_kernels = True  # the CUDA path (under --smoke: the interpreter)
        for m in rows:
            x = torch.randn(m, k, device=bk.DEV, dtype=bk.DTYPE)
            base = _per_layer(plain, x)
            paths = [("fused", True)] if m <= 16 else []
            for path, fused in [*paths, ("scaled_mm", False)]:
                for layer in fp8:
                    layer.small_m_fused = fused
                ms = _per_layer(fp8, x)
                bk.report(f"{name} M={m} fp8 {path}", _rate(ms, m, k, n, 1),
                          f"bf16 {_rate(base, m, k, n, 2)}", f"{base / ms:.2f}x")  # fmt: skip
        del plain, fp8


def _per_layer(layers, x) -> float:
    def fn() -> None:
        for layer in layers:
            layer(x)

    with torch.no_grad():
        return bk.bench_graph(fn) / len(layers)


def _rate(ms: float, m: int, k: int, n: int, weight_bytes: int) -> str:
    if m <= 16:
        return f"{ms * 1e3:.1f} us {k * n * weight_bytes / ms / 1e9:.2f} TB/s"
    return f"{ms * 1e3:.1f} us {2 * m * k * n / ms / 1e9:,.0f} TFLOP/s"


def bench_fp8_decode_attention(args) -> None:
    from lmprog.runtime.kernels.attention import decode_attention
    from lmprog.runtime.kernels.fp8_ref import FP8

    hq, hk, d = 32, 8, 128
    shapes = [(1, 32768), (8, 4096), (64, 4096)] if not args.smoke else [(2, 40)]
    print("\n== decode attention over a bf16 and an FP8 pool")
    for b, ctx in shapes:
        k, v, r2t = bk.paged_pool(b, ctx, hk, d, bk.DTYPE)
        q = torch.randn(b, hq, d, device=bk.DEV, dtype=bk.DTYPE)
        idx = torch.arange(b, device=bk.DEV, dtype=torch.int32)
        seq = torch.full((b,), ctx, device=bk.DEV, dtype=torch.int32)
        times = {}
        for name, (kb, vb) in (("bf16", (k, v)), ("fp8", (k.to(FP8), v.to(FP8)))):
            times[name] = bk.bench_graph(
                lambda kb=kb, vb=vb: decode_attention(q, kb, vb, r2t, idx, seq)
            )
        kv_bytes = 2 * b * ctx * hk * d
        bk.report(f"decode {b}x{ctx} fp8 pool", f"{times['fp8'] * 1e3:.0f} us "
                  f"{kv_bytes / times['fp8'] / 1e9:.2f} TB/s",
                  f"bf16 {times['bf16'] * 1e3:.0f} us {2 * kv_bytes / times['bf16'] / 1e9:.2f} TB/s",
                  f"{times['bf16'] / times['fp8']:.2f}x")  # fmt: skip
        del k, v


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="toy sizes on the CPU interpreter")
    args = p.parse_args()
    if args.smoke:
        bk.DEV, bk.DTYPE = "cpu", torch.float32
    else:
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    torch.manual_seed(0)
    bench_linears(args)
    bench_fp8_decode_attention(args)
    print("\n== summary")
    for row in bk.ROWS:
        print(f"  {row[0]:<40} {row[1]:>34} {row[2]:>30} {row[3]:>8}")


if __name__ == "__main__":
    main()
