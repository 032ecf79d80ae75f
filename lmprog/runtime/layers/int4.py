"""4-bit weight-only matmuls on the CPU, for weights that already are 4-bit groups (Q4_1 GGUF).

    quantize_int4_(model)         # codes recovered exactly from the dequantized weights

torch's `_weight_int4pack_mm_for_cpu` reads 4.5 bits per weight instead of 32, which is
where CPU decode time goes down. Derivation and numerics: docs/design/quantization.md.
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 32


def int4_kernels_available() -> bool:
    return hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch, "_convert_weight_to_int4pack_for_cpu"
    )


def int4_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(codes int32 [N, K], scale [N, K/32], min [N, K/32]) if fp32 `w` [N, K] is exactly
    d * q + m per group of 32 with q in 0..15; else None."""
    n, k = w.shape
    if w.dtype != torch.float32 or k % GROUP:
        return None
    groups = w.reshape(n, k // GROUP, GROUP)
    lo, hi = groups.amin(-1), groups.amax(-1)
    d = (hi - lo) / 15
    safe = torch.where(d == 0, torch.ones_like(d), d)  # a constant group: every q is 0
    q = torch.round((groups - lo[..., None]) / safe[..., None])
    if not torch.equal(q * d[..., None] + lo[..., None], groups):
        return None
    return q.to(torch.int32).reshape(n, k), d, lo


class Int4Linear(nn.Module):
    """A Linear whose weight is held as packed 4-bit codes with bf16 group scales/zeros."""

    packed: torch.Tensor  # buffers
    scales_zeros: torch.Tensor

    def __init__(
        self, codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, bias: torch.Tensor | None
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(codes, 1))
        zero = low + 8 * scale  # the kernel computes (q - 8) * scale + zero
        sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()  # [K/32, N, 2]
        self.register_buffer("scales_zeros", sz.to(torch.bfloat16))
        self.bias = (
            None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        )

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int4Linear | None:
        groups = int4_groups(linear.weight.detach())
        return None if groups is None else cls(*groups, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch._weight_int4pack_mm_for_cpu(
            x.reshape(-1, shape[-1]).to(torch.bfloat16), self.packed, GROUP, self.scales_zeros
        )
        y = y.to(x.dtype).reshape(*shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4"


def quantize_int4_(model: nn.Module) -> int:
    """Replace, in place, every nn.Linear of `model` whose fp32 weight is exactly 4-bit
    groups by an Int4Linear; return how many. Raises ValueError if the model is not on the
    CPU in fp32, the kernels are missing, or no layer qualifies."""
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32:
        raise ValueError(
            "quantization='int4' runs on the CPU with dtype float32 (got "
            f"{param.device.type}, {param.dtype})"
        )
    if not int4_kernels_available():
        raise ValueError(
            f"torch {torch.__version__} lacks the CPU int4 kernels; upgrade torch "
            "or drop quantization='int4'"
        )
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    replaced = 0
    for parent, name, child in targets:
        packed = Int4Linear.from_linear(child)
        if packed is not None:
            setattr(parent, name, packed)
            replaced += 1
    if not replaced:
        raise ValueError(
            "quantization='int4' needs weights that are exact 4-bit groups of 32 "
            "(a Q4_1 GGUF); none of this model's linear layers are"
        )
    return replaced


__all__ = ["GROUP", "Int4Linear", "int4_groups", "int4_kernels_available", "quantize_int4_"]
