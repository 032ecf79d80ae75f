"""Fused RMSNorm, optionally with the residual add in the same pass.

    rms_norm:      out = w * (x / sqrt(mean(x^2) + eps))
    add_rms_norm:  residual <- x + residual (in place); out = rms_norm(residual)

Rounding follows transformers' LlamaRMSNorm: statistics in fp32, the normalized value rounded
to x's dtype before the weight multiply, the residual sum rounded to x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import FLOAT_DTYPES, check_runnable, check_tensor

MAX_HIDDEN = 32768  # one row a program, held in registers


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """RMSNorm over the last dimension of x ([..., hidden]); returns `out` (x's dtype)."""
    x2, w, out2 = _check(x, weight, eps, None, out)
    _launch(x2, None, w, out2, eps)
    return out2.view(x.shape)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x (in place), then RMSNorm of it; returns (out, residual). `out` may be x."""
    x2, w, out2 = _check(x, weight, eps, residual, out)
    _launch(x2, residual.view(x2.shape), w, out2, eps)
    return out2.view(x.shape), residual


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight.float() * normed.float()).to(x.dtype)


def add_rms_norm_ref(x, residual, weight, eps=1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Out-of-place reference: (normalized, new residual)."""
    total = (x.float() + residual.float()).to(x.dtype)
    return rms_norm_ref(total, weight, eps), total


def _check(x, weight, eps, residual, out):
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_runnable("x", x)
    hidden = x.shape[-1]
    if x.dim() < 1 or not 1 <= hidden <= MAX_HIDDEN:
        raise ValueError(f"x must be [..., hidden] with 1 <= hidden <= {MAX_HIDDEN}")
    check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES, device=x.device)
    if weight.shape[0] != hidden or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous [{hidden}], got {tuple(weight.shape)}")
    if not isinstance(eps, (int, float)) or eps <= 0:
        raise ValueError(f"eps must be a positive float, got {eps!r}")
    x2 = _rows("x", x)
    if residual is not None:
        check_tensor("residual", residual, dtypes=(x.dtype,), device=x.device)
        if residual.shape != x.shape or not residual.is_contiguous():
            raise ValueError(f"residual must be contiguous with x's shape {tuple(x.shape)}")
    if out is None:
        return x2, weight, torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    check_tensor("out", out, dtypes=(x.dtype,), device=x.device)
    if out.shape != x.shape:
        raise ValueError(f"out must have x's shape {tuple(x.shape)}, got {tuple(out.shape)}")
    return x2, weight, _rows("out", out)


def _rows(name: str, t: torch.Tensor) -> torch.Tensor:
    """A [rows, hidden] view with unit last stride (any row stride)."""
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension; call .contiguous()")
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        raise ValueError(
            f"{name}'s leading dimensions cannot be flattened; call .contiguous()"
        ) from None


def _launch(x, residual, weight, out, eps) -> None:
    rows, hidden = x.shape
    if rows == 0:
        return
    block = triton.next_power_of_2(hidden)
    has_res = residual is not None
    _rms_norm_kernel[(rows,)](
        x, residual if has_res else x, weight, out, hidden, float(eps),
        x.stride(0), residual.stride(0) if has_res else 0, out.stride(0),
        BLOCK=block, HAS_RESIDUAL=has_res, num_warps=min(max(block // 512, 1), 16),
    )  # fmt: skip


@triton.jit
def _rms_norm_kernel(
    X, R, W, O, hidden, eps, stride_x, stride_r, stride_o,
    BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < hidden
    x = tl.load(X + row * stride_x + offs, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + row * stride_r + offs, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(R + row * stride_r + offs, x, mask=ok)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, 0) / hidden + eps)
    normed = (xf * rstd).to(X.dtype.element_ty).to(tl.float32)
    w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(O + row * stride_o + offs, (normed * w).to(O.dtype.element_ty), mask=ok)
