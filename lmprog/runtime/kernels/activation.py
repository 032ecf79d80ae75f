"""SiLU-and-mul, the gated MLP's activation: out = silu(x[..., :I]) * x[..., I:].

One pass: the [T, 2I] gate/up projection is read once and [T, I] written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import FLOAT_DTYPES, check_runnable, check_tensor

BLOCK = 1024


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [..., 2I] with gate then up halves; returns [..., I] in x's dtype."""
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_runnable("x", x)
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"x's last dimension must be even ([..., 2I]), got {tuple(x.shape)}")
    if x.stride(-1) != 1:
        raise ValueError("x must be contiguous in its last dimension; call .contiguous()")
    inter = x.shape[-1] // 2
    shape = (*x.shape[:-1], inter)
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    check_tensor("out", out, dtypes=(x.dtype,), device=x.device)
    if tuple(out.shape) != shape or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {shape}, got {tuple(out.shape)}")
    x2 = x.reshape(-1, 2 * inter)  # a view when the leading dims are flat
    rows = x2.shape[0]
    if rows and inter:
        _silu_and_mul_kernel[(rows, triton.cdiv(inter, BLOCK))](
            x2, out, inter, x2.stride(0), BLOCK=BLOCK, num_warps=4
        )
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


@triton.jit
def _silu_and_mul_kernel(X, O, inter, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < inter
    gate = tl.load(X + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + inter + offs, mask=ok, other=0.0).to(tl.float32)
    act = gate / (1.0 + tl.exp(-gate))
    tl.store(O + row * inter + offs, (act * up).to(O.dtype.element_ty), mask=ok)
