"""Fused Triton RMSNorm and SiLU-and-mul, swapped into a loaded model from outside.

    model = load_model(..., device="cuda", attention="triton")
    fuse_elementwise(model)        # after loading; load_weights still works (same Parameters)

Rounding follows the plain layers. Why: docs/design/quantization.md.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .activation import SiluAndMul
from .norm import RMSNorm


class TritonRMSNorm(nn.Module):
    """RMSNorm through the fused kernel; shares the replaced module's weight Parameter."""

    def __init__(self, norm: RMSNorm) -> None:
        super().__init__()
        self.weight = norm.weight
        self.eps = norm.eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        """As RMSNorm.forward; with a residual, the add happens in the kernel (residual is
        updated in place and returned)."""
        from ..kernels.rmsnorm import add_rms_norm, rms_norm

        x = x if x.is_contiguous() else x.contiguous()
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        return add_rms_norm(x, residual, self.weight, self.eps)


class TritonSiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..kernels.activation import silu_and_mul

        return silu_and_mul(x)


def can_fuse_elementwise(model: nn.Module) -> bool:
    """True when triton is importable and the model runs on CUDA (or the CPU interpreter)."""
    from ..kernels import triton_available
    from ..kernels._checks import interpreting

    device = next(model.parameters()).device
    return triton_available() and (device.type == "cuda" or interpreting())


def fuse_elementwise(model: nn.Module) -> int:
    """Swap every RMSNorm and SiluAndMul of `model` for its fused kernel; returns how many."""
    if not can_fuse_elementwise(model):
        raise ValueError("the fused kernels need triton and a CUDA model (or TRITON_INTERPRET=1)")
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, RMSNorm):
                setattr(module, name, TritonRMSNorm(child))
            elif isinstance(child, SiluAndMul):
                setattr(module, name, TritonSiluAndMul())
            else:
                continue
            swapped += 1
    return swapped
