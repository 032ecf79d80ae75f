"""FP8 beside bf16 in one bench_gpu.py run (`--quantization fp8`, `--kv-cache-dtype
fp8_e4m3`): the lmprog benchmarks run twice on the same workload, first in the model dtype,
then with FP8 weights and/or the FP8 KV cache; the summary labels each pass's rows and
adds the FP8 / bf16 ratios against issue 20's targets (batch-1 decode >= 1.7x, offline
>= 1.3x).

The weight-read limit of the FP8 pass counts what it reads: its FP8 layers at one byte a
weight (the output projection stays in the model dtype) and an FP8 KV cache at one byte a
value; the offline roofline keeps bf16's numbers (its FLOPs at the bf16 peak).
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable

import torch

TARGETS = {"engine decode": 1.7, "model decode": 1.7, "offline": 1.3}


def fp8_bytes_saved(model: torch.nn.Module, itemsize: int) -> int:
    """Bytes per step an FP8 model reads less than the same model in `itemsize` bytes."""
    from lmprog.runtime.layers.fp8_linear import Fp8Linear

    fp8 = sum(m.weight.numel() for m in model.modules() if isinstance(m, Fp8Linear))
    return fp8 * (itemsize - 1)


def kv_itemsize(kv_cache_dtype: str, itemsize: int) -> int:
    return itemsize if kv_cache_dtype == "auto" else 1


def compare_fp8(args: argparse.Namespace, run: Callable, rows: list, log: Callable) -> None:
    """run(args) -> {"engine decode": tok/s, "model decode": tok/s, "offline": tok/s} for
    a baseline pass and the FP8 pass; rows: bench_gpu's summary rows (relabelled here)."""
    fp8_name = "+".join(
        n for n, on in (("fp8 weights", args.quantization), ("fp8 KV", args.kv_cache_dtype != "auto"))
        if on
    )  # fmt: skip
    passes = [(args.dtype, {"quantization": None, "kv_cache_dtype": "auto"}), (fp8_name, {})]
    results = {}
    for label, overrides in passes:
        log(f"\n######## pass: {label}")
        start = len(rows)
        results[label] = run(argparse.Namespace(**{**vars(args), **overrides})) or {}
        rows[start:] = [(f"[{label}] {r[0]}", *r[1:]) for r in rows[start:]]
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    base, fp8 = results[args.dtype], results[fp8_name]
    for key, target in TARGETS.items():
        if base.get(key) and fp8.get(key):
            ratio = fp8[key] / base[key]
            verdict = "met" if ratio >= target else "missed"
            rows.append((f"{fp8_name} / {args.dtype}: {key}", f"{ratio:.2f}x",
                         f"{fp8[key]:,.1f} vs {base[key]:,.1f}",
                         f"target >= {target}x: {verdict}"))  # fmt: skip
