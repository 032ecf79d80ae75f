"""Constants and helpers of the kernel tests (conftest.py sets TRITON_INTERPRET first)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

ON_GPU = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None


def _kernel_skip_reason() -> str | None:
    if not HAS_TRITON:
        return "triton is not installed (pip install triton==3.9.0)"
    if ON_GPU:
        return None
    if os.environ.get("TRITON_INTERPRET") in (None, "", "0"):
        return "no GPU and TRITON_INTERPRET is disabled in the environment"
    early = [m for m in sys.modules if m.startswith("lmprog.runtime.kernels.") and
             m.rsplit(".", 1)[1] in ("attention", "rmsnorm", "rope", "activation", "logits",
                                     "sampling")]  # fmt: skip
    if early:
        return f"{early} were imported before tests/conftest.py set TRITON_INTERPRET=1"
    return None


KERNEL_SKIP = _kernel_skip_reason()
requires_kernels = pytest.mark.skipif(KERNEL_SKIP is not None, reason=KERNEL_SKIP or "")

DEVICE = torch.device("cuda" if ON_GPU else "cpu")
# bf16 does not run in the interpreter (numpy has no bfloat16).
DTYPES = (
    [torch.bfloat16, torch.float16, torch.float32] if ON_GPU else [torch.float32, torch.float16]
)


def tolerance(dtype: torch.dtype) -> float:
    """Relative error allowed (||out - ref|| / ||ref||) for a result in `dtype`; fp32 on a GPU
    goes through tf32 matrix units in the attention kernels."""
    if dtype == torch.float32:
        return 5e-3 if ON_GPU else 1e-5
    return {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(out).any(), "output has NaN (an unwritten or broken row)"
    diff = (out.double() - ref.double()).norm()
    return (diff / ref.double().norm().clamp_min(1e-30)).item()
