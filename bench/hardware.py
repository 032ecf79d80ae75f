"""The card a benchmark runs on, measured when it starts: its copy bandwidth, its dense bf16
matmul rate and its free memory, so that every fraction a benchmark prints is of the card
that ran it (an H200's 4.28 TB/s is not an H100's 3.05) and memory is sized to what is there.

    hw = measure()          # on CUDA: ~2 s; on a CPU (--smoke runs): small, meaningless sizes
    hw.copy_tbs, hw.bf16_tflops, hw.free_bytes, hw.name

Copy: a 1 GiB device-to-device copy (read + write counted), the median of 20. Matmul: the
best of a few large square and skinny bf16 GEMMs (cuBLAS), the median of 20 each: what
`torch.matmul` reaches on this card, the ceiling the runtime's GEMMs can be held against.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Hardware:
    name: str
    copy_tbs: float  # device-to-device copy, TB/s (bytes read + written)
    bf16_tflops: float  # dense bf16 GEMM, TFLOP/s
    free_bytes: int  # device memory free when measured
    total_bytes: int

    def describe(self) -> str:
        return (
            f"{self.name}: copy {self.copy_tbs:.2f} TB/s, bf16 matmul {self.bf16_tflops:.0f} "
            f"TFLOP/s, {self.free_bytes / 2**30:.1f} of {self.total_bytes / 2**30:.1f} GiB free "
            "(measured now)"
        )


def measure(device: str = "cuda") -> Hardware:
    """Measure the device (CUDA), or a CPU's figures at toy sizes (for smoke runs)."""
    if device != "cuda":
        copy = _copy_tbs(2**22, device)
        flops = _matmul_tflops([(512, 512, 512)], device, torch.float32)
        return Hardware("cpu (smoke)", copy, flops, 0, 0)
    free, total = torch.cuda.mem_get_info()
    copy = _copy_tbs(2**30, device)
    shapes = [(8192, 8192, 8192), (16384, 8192, 8192), (4096, 16384, 16384)]
    flops = _matmul_tflops(shapes, device, torch.bfloat16)
    torch.cuda.empty_cache()
    return Hardware(torch.cuda.get_device_name(), copy, flops, free, total)


def _median_seconds(fn, reps: int, device: str) -> float:
    fn()  # warm-up (cuBLAS heuristics, allocation)
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _copy_tbs(nbytes: int, device: str) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), 20, device)
    return 2 * nbytes / seconds / 1e12


def _matmul_tflops(shapes, device: str, dtype: torch.dtype) -> float:
    best = 0.0
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        out = torch.empty(m, n, device=device, dtype=dtype)
        seconds = _median_seconds(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out), 20, device)
        best = max(best, 2 * m * n * k / seconds / 1e12)
    return best
