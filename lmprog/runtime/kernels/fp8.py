"""FP8 (e4m3) Triton kernels: activation quantization and the block-scaled matmul.

    quantize_fp8(x, group=None, scale=None) -> (q, s)
    block_fp8_matmul(x_q, x_s, w_q, w_s, group) -> y      y = x @ w^T
    fp8_matmul_small_m(x, w_q, w_s, scale=None) -> y      M <= 16, quantization fused

The math is fp8_ref's; nothing syncs with the host. Design: docs/design/quantization.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import FLOAT_DTYPES, check_runnable, check_tensor, dynamic_args
from .fp8_ref import AMAX_FLOOR as _AMAX_FLOOR
from .fp8_ref import FP8
from .fp8_ref import FP8_MAX as _FP8_MAX
from .small_m import SMALL_M

# A global that a @triton.jit function reads must be a constexpr when it is compiled for a GPU
# (Triton's CPU interpreter accepts any, which is how these ran in the CPU tests).
AMAX_FLOOR = tl.constexpr(_AMAX_FLOOR)
FP8_MAX = tl.constexpr(_FP8_MAX)
SIGN_BIT = tl.constexpr(-(2**31))  # an fp32's sign bit, as an int32


def quantize_fp8(
    x: torch.Tensor, *, group: int | None = None, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (fp32/bf16/fp16, rows contiguous) -> (q e4m3 [M, K], s fp32 [M, K / group]
    or [M, 1]). group: None = one scale per row; else a divisor of K. scale: a static fp32
    scale (one element) for every row instead of each row's amax."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_runnable("x", x)
    m, k = x.shape
    if x.stride(1) != 1:
        raise ValueError("x must be contiguous in its last dimension; call .contiguous()")
    g = k if group is None else group
    if isinstance(g, bool) or not isinstance(g, int) or g < 1 or k % g:
        raise ValueError(f"group must be a positive divisor of K={k}, got {group!r}")
    static = scale is not None
    if scale is not None:
        check_tensor("scale", scale, dtypes=(torch.float32,), device=x.device)
        if scale.numel() != 1:
            raise ValueError(f"a static scale has one element, got shape {tuple(scale.shape)}")
    q = torch.empty((m, k), dtype=FP8, device=x.device)
    s = torch.empty((m, k // g), dtype=torch.float32, device=x.device)
    if m == 0:
        return q, s
    _quant_kernel[(m, k // g)](
        x, q, s, scale if static else s, x.stride(0), g,
        STATIC=static, BLOCK=min(triton.next_power_of_2(g), 2048), num_warps=4,
    )  # fmt: skip
    return q, s


@triton.jit
def _quant_kernel(X, Q, S, Static, stride_x, group, STATIC: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    gid = tl.program_id(1)
    n_groups = tl.num_programs(1)
    x_row = X + row * stride_x + gid * group
    q_row = Q + row * (n_groups * group) + gid * group
    if STATIC:
        s = tl.load(Static)
    else:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for c in range(0, group, BLOCK):
            offs = c + tl.arange(0, BLOCK)
            x = tl.load(x_row + offs, mask=offs < group, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        s = tl.div_rn(tl.maximum(tl.max(amax, 0), AMAX_FLOOR), FP8_MAX)
    tl.store(S + row * n_groups + gid, s)
    for c in range(0, group, BLOCK):
        offs = c + tl.arange(0, BLOCK)
        ok = offs < group
        x = tl.load(x_row + offs, mask=ok, other=0.0).to(tl.float32)
        y = to_e4m3(tl.div_rn(x, s + tl.zeros_like(x)))
        tl.store(q_row + offs, y, mask=ok)


@triton.jit
def to_e4m3(x):
    """fp32 -> e4m3, saturated to +-448 and rounded to nearest even here, in fp32 (the
    cast then only re-encodes a value e4m3 holds: Triton's CPU interpreter rounds fp8 casts
    without carrying into the exponent, e.g. 124.3 -> 64)."""
    x = tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)
    bits = x.to(tl.int32, bitcast=True)
    # normal numbers: keep 3 mantissa bits, round half to even (the carry may bump the exponent)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
    # below 2**-6 (subnormal e4m3) the step is 2**-9: an fp32 add at 1.5 * 2**14 rounds to it
    tiny = (tl.abs(x) + 24576.0) - 24576.0
    # the sign of x, -0.0 included, as a bit (Triton's -t is 0 - t: +0.0 for t = 0)
    tiny = (tiny.to(tl.int32, bitcast=True) | (bits & SIGN_BIT)).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(x) < 0.015625, tiny, normal).to(tl.float8e4nv)


def block_fp8_matmul(
    x_q: torch.Tensor,
    x_s: torch.Tensor,
    w_q: torch.Tensor,
    w_s: torch.Tensor,
    group: int,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """x_q [M, K] e4m3 with x_s [M, K/group], w_q [N, K] e4m3 with row-repeated block scales
    w_s [N, K/group] (fp32) -> y [M, N] in out_dtype. group: a power of two >= 16."""
    check_tensor("x_q", x_q, ndim=2, dtypes=(FP8,))
    check_runnable("x_q", x_q)
    dev = x_q.device
    check_tensor("w_q", w_q, ndim=2, dtypes=(FP8,), device=dev)
    m, k = x_q.shape
    n = w_q.shape[0]
    if w_q.shape[1] != k:
        raise ValueError(f"w_q must be [N, {k}], got {tuple(w_q.shape)}")
    if group < 16 or group & (group - 1) or k % group:
        raise ValueError(f"group must be a power of two >= 16 dividing K={k}, got {group}")
    for name, s, rows in (("x_s", x_s, m), ("w_s", w_s, n)):
        check_tensor(name, s, ndim=2, dtypes=(torch.float32,), device=dev)
        if tuple(s.shape) != (rows, k // group):
            raise ValueError(f"{name} must be [{rows}, {k // group}], got {tuple(s.shape)}")
    for name, t in (("x_q", x_q), ("w_q", w_q), ("x_s", x_s), ("w_s", w_s)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous; call .contiguous()")
    y = torch.empty((m, n), dtype=out_dtype, device=dev)
    if m == 0:
        return y
    block_m = min(max(triton.next_power_of_2(m), 16), 64)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, 128),)
    _block_matmul_kernel[grid](
        x_q, x_s, w_q, w_s, y, m, n, k // group,
        BLOCK_M=block_m, BLOCK_N=128, BLOCK_K=group, num_warps=4, num_stages=3,
    )  # fmt: skip
    return y


@triton.jit(**dynamic_args("m"))
def _block_matmul_kernel(
    A, As, B, Bs, C, m, n, k_blocks,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(n, BLOCK_N)
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n
    k = k_blocks * BLOCK_K
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < m
    n_ok = offs_n < n
    rows = tl.where(m_ok, offs_m, 0).to(tl.int64)  # out-of-range rows read row 0, unstored
    cols = tl.where(n_ok, offs_n, 0).to(tl.int64)
    a_ptrs = A + rows[:, None] * k + offs_k[None, :]
    b_ptrs = B + cols[None, :] * k + offs_k[:, None]  # w^T tile [BLOCK_K, BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, k_blocks):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        a_s = tl.load(As + rows * k_blocks + kb)
        b_s = tl.load(Bs + cols * k_blocks + kb)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    c_ptrs = C + offs_m[:, None].to(tl.int64) * n + offs_n[None, :]
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def fp8_matmul_small_m(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_s: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    block_n: int = 32,
    block_k: int = 256,
) -> torch.Tensor:
    """y = quantize_fp8(x) @ w_q^T scaled, for M <= 16 rows in one kernel (small_m.py's loop
    over e4m3 weights): each program takes block_n output columns, finds its rows' amax (x
    is small: every program reads it, from L2), then streams its weight rows, quantizing x's
    blocks as it goes. The same numbers as quantize_fp8 + torch._scaled_mm (per-token or
    static `scale`, per-channel w_s [N]) up to the order of the fp32 sums; no launch for the
    quantization."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_runnable("x", x)
    check_tensor("w_q", w_q, ndim=2, dtypes=(FP8,), device=x.device)
    check_tensor("w_s", w_s, ndim=1, dtypes=(torch.float32,), device=x.device)
    m, k = x.shape
    n = w_q.shape[0]
    if m > SMALL_M or w_q.shape[1] != k or w_s.shape[0] != n:
        raise ValueError(
            f"x [M <= {SMALL_M}, K], w_q [N, K] and w_s [N] expected, got {tuple(x.shape)}, "
            f"{tuple(w_q.shape)}, {tuple(w_s.shape)}"
        )
    if x.stride(1) != 1 or not w_q.is_contiguous():
        raise ValueError("x must be contiguous in its last dimension and w_q contiguous")
    static = scale is not None
    if static:
        check_tensor("scale", scale, dtypes=(torch.float32,), device=x.device)
    y = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0:
        return y
    _small_m_kernel[(triton.cdiv(n, block_n),)](
        x, w_q, w_s, scale if static else w_s, y, m, n, k, x.stride(0),
        STATIC=static, BLOCK_M=SMALL_M, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=4, num_stages=4,
    )  # fmt: skip
    return y


@triton.jit(**dynamic_args("m"))
def _small_m_kernel(
    X, W, Ws, Static, Y, m, n, k, stride_x,
    STATIC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < m
    n_ok = offs_n < n
    x_rows = X + offs_m[:, None].to(tl.int64) * stride_x
    if STATIC:
        s = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(Static)
    else:
        amax = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, k, BLOCK_K):
            ok = m_ok[:, None] & (k0 + offs_k < k)[None, :]
            xb = tl.load(x_rows + k0 + offs_k[None, :], mask=ok, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(xb), 1))
        s = tl.div_rn(tl.maximum(amax, AMAX_FLOOR), FP8_MAX + tl.zeros_like(amax))
    w_cols = W + tl.where(n_ok, offs_n, 0)[None, :].to(tl.int64) * k  # w^T tile [K, N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, k, BLOCK_K):
        k_ok = k0 + offs_k < k
        xb = tl.load(x_rows + k0 + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                     other=0.0).to(tl.float32)  # fmt: skip
        xq = to_e4m3(tl.div_rn(xb, s[:, None] + tl.zeros_like(xb)))
        wb = tl.load(w_cols + k0 + offs_k[:, None], mask=k_ok[:, None], other=0.0)
        acc += tl.dot(xq, wb)
    w_s = tl.load(Ws + offs_n, mask=n_ok, other=0.0)
    y = acc * s[:, None] * w_s[None, :]
    y_ptrs = Y + offs_m[:, None].to(tl.int64) * n + offs_n[None, :]
    tl.store(y_ptrs, y.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


__all__ = ["block_fp8_matmul", "fp8_matmul_small_m", "quantize_fp8"]
