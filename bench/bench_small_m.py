"""Decode-sized bf16 matmuls on a CUDA GPU: cuBLAS beside lmprog's small-M Triton kernel,
measured in the same run (issue 20, item 1).

    python3 bench/bench_small_m.py            # H200: Llama-3.1-8B's shapes, M = 1..16 (< 2 min)
    python3 bench/bench_small_m.py --smoke    # toy shapes on the CPU interpreter (timings
                                              # meaningless: it checks every code path)

Shapes (K -> N): qkv 4096->6144, o 4096->4096, gate_up 4096->28672, down 14336->4096,
lm_head 4096->128256, at M = 1, 2, 4, 8, 16 rows. Each timing runs x through enough copies of
the weight (>= 256 MB in all, so they come from HBM, not the 50 MB L2), replayed from a CUDA
graph as decode steps are (layers.small_m.graph_us, the runtime's start-up timer); per layer:
microseconds and weight bytes read per second for cuBLAS (F.linear) and for the kernel's best
config of a sweep (the runtime's candidates, marked *, and a few more), with the best of the
runtime's candidates beside it. Configs whose output is not cuBLAS's (relative error > 1e-2)
are reported and left out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported anywhere
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmprog.runtime.kernels.small_m import SmallMConfig, candidate_configs, small_m_matmul
from lmprog.runtime.layers.small_m import CHECK_TOL, graph_us

SHAPES = {
    "qkv": (4096, 6144),
    "o_proj": (4096, 4096),
    "gate_up": (4096, 28672),
    "down": (14336, 4096),
    "lm_head": (4096, 128256),
}
ROWS = (1, 2, 4, 8, 16)
COLD_BYTES = 256 * 2**20  # weights per timing: several times the H200's 50 MB L2
EXTRA = [  # tried beside the runtime's candidates
    SmallMConfig(16, 256),
    SmallMConfig(32, 128, num_stages=6),
    SmallMConfig(16, 256, num_stages=6),
    SmallMConfig(32, 256, num_warps=8),
    SmallMConfig(128, 128, num_stages=4),
    SmallMConfig(16, 512, split_k=2),
]


def sweep_configs(n: int, k: int, sms: int) -> tuple[list[SmallMConfig], set[SmallMConfig]]:
    runtime = candidate_configs(n, k, sms)
    return runtime + [c for c in EXTRA if c not in runtime and c.fits()], set(runtime)


def bench_shape(name, k, n, rows, configs, runtime, dev, dtype, timer) -> None:
    itemsize = torch.empty((), dtype=dtype).element_size()
    copies = max(1, -(-COLD_BYTES // (n * k * itemsize))) if dev == "cuda" else 2
    weights = [torch.randn(n, k, device=dev, dtype=dtype) * 0.02 for _ in range(copies)]
    counters = torch.zeros(n, dtype=torch.int32, device=dev)
    print(f"\n== {name}: {k} -> {n}, {copies} copies of the weight per timing", flush=True)
    for m in rows:
        x = torch.randn(m, k, device=dev, dtype=dtype)
        want = F.linear(x, weights[0]).float()
        us = {"cublas": timer(lambda: [F.linear(x, w) for w in weights]) / copies}
        for config in configs:
            got = small_m_matmul(x, weights[0], config=config, counters=counters).float()
            err = ((got - want).norm() / want.norm()).item()
            if err > CHECK_TOL:
                print(f"  M={m} {config.label}: relative error {err:.2e}, left out")
                continue
            us[config] = timer(_kernel_calls(x, weights, config, counters)) / copies
        kernel = {c: t for c, t in us.items() if c != "cublas"}
        if not kernel:
            print(f"  M={m:<3} cuBLAS {_rate(us['cublas'], n * k * itemsize)} | no config ran")
            continue
        best = min(kernel, key=kernel.__getitem__)
        best_rt = min((c for c in kernel if c in runtime), key=kernel.__getitem__, default=None)
        rates = [_rate(t, n * k * itemsize) for t in (us["cublas"], kernel[best])]
        star = "*" if best in runtime else " "
        rt = f"runtime's best {_rate(kernel[best_rt], n * k * itemsize)}" if best_rt else ""
        print(f"  M={m:<3} cuBLAS {rates[0]} | kernel {rates[1]} "
              f"{us['cublas'] / kernel[best]:5.2f}x  {star}{best.label:<24} {rt}", flush=True)  # fmt: skip


def _rate(us: float, weight_bytes: int) -> str:
    return f"{us:7.1f} us {weight_bytes / us / 1e6:5.2f} TB/s"


def _kernel_calls(x, weights, config, counters):
    def fn() -> None:
        for w in weights:
            small_m_matmul(x, w, config=config, counters=counters)

    return fn


def eager_us(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="toy shapes on the CPU interpreter")
    p.add_argument("--shapes", nargs="*", choices=list(SHAPES), help="default: all")
    args = p.parse_args()
    if args.smoke:
        shapes = {"toy": (96, 48), "toy_down": (600, 40)}
        rows, dev, dtype, timer, sms = (1, 5), "cpu", torch.float16, eager_us, 4
    else:
        if not torch.cuda.is_available():
            sys.exit("needs a CUDA GPU (or --smoke)")
        shapes = {s: SHAPES[s] for s in (args.shapes or SHAPES)}
        rows, dev, dtype, timer = ROWS, "cuda", torch.bfloat16, graph_us
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        print(f"{torch.cuda.get_device_name(0)}, {sms} SMs, torch {torch.__version__}")
    t0 = time.perf_counter()
    with torch.no_grad():
        for name, (k, n) in shapes.items():
            configs, runtime = sweep_configs(n, k, sms)
            if args.smoke:
                configs = configs[:2] + [c for c in configs if c.split_k > 1][:1]
            bench_shape(name, k, n, rows, configs, runtime, dev, dtype, timer)
    print(f"\n(* a runtime candidate; {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
