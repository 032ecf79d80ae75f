"""FP8 (e4m3) quantization math in plain PyTorch: the reference of the Triton kernels in
`fp8.py` and the CPU path of `layers.fp8_linear` (no triton).

Activations: one scale per row or per group; weights: one scale per output row or per
block (repeated over the block's rows). Formulas: docs/design/quantization.md.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
AMAX_FLOOR = 1e-10  # an all-zero row gets a tiny scale, never a division by zero


def quantize_fp8_ref(
    x: torch.Tensor, *, group: int | None = None, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q e4m3 [M, K], s fp32 [M, K / group]; [M, 1] per row or static).
    group: None = one scale per row; else K must be a multiple of it.
    scale: a static fp32 scale (one element) used for every row instead of the amax."""
    m, k = x.shape
    xf = x.float()
    if scale is not None:
        s = scale.float().reshape(1, 1).expand(m, 1).contiguous()
        return _cast(xf / s), s
    g = k if group is None else group
    assert k % g == 0, f"K={k} is not a multiple of the group {g}"
    amax = xf.view(m, k // g, g).abs().amax(-1).clamp(min=AMAX_FLOOR)
    s = _div(amax, FP8_MAX)
    q = _cast(xf.view(m, k // g, g) / s[..., None]).view(m, k)
    return q, s


def quantize_weight_fp8(
    w: torch.Tensor, *, per_tensor: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q e4m3 [N, K], scale fp32 [N]): per output row, or one scale for the
    whole tensor written on every row (per_tensor)."""
    wf = w.float()
    amax = wf.abs().amax() if per_tensor else wf.abs().amax(-1)
    s = _div(amax.clamp(min=AMAX_FLOOR), FP8_MAX).expand(w.shape[0]).contiguous()
    return _cast(wf / s[:, None]), s


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, group: int | None = None) -> torch.Tensor:
    """fp32 values of q [M, K] with per-row scales [M] / [M, 1] or group scales [M, K/g]."""
    s = scale.float()
    if group is None:
        return q.float() * s.reshape(-1, 1)
    return q.float() * s.repeat_interleave(group, dim=1)[:, : q.shape[1]]


def scaled_matmul_ref(
    x_q: torch.Tensor,
    x_s: torch.Tensor,
    w_q: torch.Tensor,
    w_s: torch.Tensor,
    *,
    group: int | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """x_q [M, K] @ w_q [N, K]^T with their scales, in fp32: per-row x_s [M, 1] and w_s [N]
    (group None), or per-group x_s [M, K/g] and w_s [N, K/g]."""
    x = dequantize_fp8(x_q, x_s, group)
    w = dequantize_fp8(w_q, w_s, group)
    return (x @ w.t()).to(out_dtype)


def cast_e4m3(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """e4m3 of x / scale (any shape, fp32 math), saturated at +-448."""
    x = x.float()
    return _cast(x if scale == 1.0 else _div(x, scale))


def _div(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """x / divisor rounded as IEEE division, on every device: CUDA's x / <python number>
    multiplies by the reciprocal (a bit off at times); a tensor divisor divides."""
    return x / torch.full((), divisor, dtype=x.dtype, device=x.device)


def _cast(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8)


__all__ = [
    "AMAX_FLOOR",
    "cast_e4m3",
    "FP8",
    "FP8_MAX",
    "dequantize_fp8",
    "quantize_fp8_ref",
    "quantize_weight_fp8",
    "scaled_matmul_ref",
]
