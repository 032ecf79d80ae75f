"""Multi-LoRA kernels: every adapter of the batch at once, one segmented shrink and one
segmented expand per projection. Punica's SGMV in S-LoRA's layout.

Blocks of tokens grouped by adapter slot (lora.ops.plan_lora_step); split-K partials summed
in order (deterministic); a fixed grid, so CUDA graphs capture it. Reference:
ops.lora_delta_ref. Design: docs/design/lora.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ._checks import FLOAT_DTYPES, check_runnable, check_tensor, dynamic_args, next_pow2

MAX_SLICES = 3


def lora_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_slots: torch.Tensor,
    num_padded: torch.Tensor,
    block_m: int,
    split_k: int | None = None,
) -> torch.Tensor:
    """u [split_k, T, N] fp32: the partial sums of x[t] @ lora_a[slot(t)].T over split_k
    slices of K, for every adapter token (other rows are left unwritten); lora_expand sums
    them. x [T, K]; lora_a [S, N, K]. split_k None: by the layout (`choose_split_k`)."""
    _check_layout(x, sorted_ids, block_slots, num_padded, block_m)
    check_tensor("lora_a", lora_a, ndim=3, dtypes=(x.dtype,), device=x.device)
    tokens, k = x.shape
    n = lora_a.shape[1]
    if lora_a.shape[2] != k or lora_a.stride(2) != 1:
        raise ValueError(f"lora_a must be a contiguous [S, N, {k}], got {tuple(lora_a.shape)}")
    block_k = 64 if k >= 64 else max(16, next_pow2(k))
    if split_k is None:
        split_k = choose_split_k(k, block_m, block_k)
    split_k = max(1, min(int(split_k), triton.cdiv(k, block_k)))
    out = torch.empty(split_k, tokens, n, dtype=torch.float32, device=x.device)
    if tokens == 0 or sorted_ids.numel() == 0:
        return out
    block_n = max(16, min(64, next_pow2(n)))
    chunk = triton.cdiv(triton.cdiv(k, block_k), split_k) * block_k  # K per split, whole tiles
    tiles = triton.cdiv(sorted_ids.numel(), block_m) * triton.cdiv(n, block_n)
    _shrink_kernel[(tiles, split_k)](
        x, lora_a, out, sorted_ids, block_slots, num_padded,
        tokens, n, k, chunk, sorted_ids.numel(),
        x.stride(0), lora_a.stride(0), lora_a.stride(1), out.stride(0), out.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=_precision(x.dtype),
    )  # fmt: skip
    return out


def _precision(dtype: torch.dtype) -> str:
    """tl.dot's precision for fp32 operands: TF32 only where torch's matmuls use it (fp32
    models get fp32 products, as the reference's; measured on an H100: TF32 put a 2-layer
    test model's logits 2.8 apart from the PyTorch path's), else IEEE fp32."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def choose_split_k(k: int, block_m: int, block_k: int = 64) -> int:
    """Splits of the shrink's K: decode-sized blocks (16 rows, a block per adapter) get
    programs over K, at least 4 of its tiles each; prefill blocks are many already."""
    if block_m > 16:
        return 1
    return max(1, min(16, triton.cdiv(k, 4 * block_k)))


def lora_expand(
    u: torch.Tensor,
    lora_b: torch.Tensor,
    y: torch.Tensor,
    slices: Sequence[int],
    sorted_ids: torch.Tensor,
    block_slots: torch.Tensor,
    num_padded: torch.Tensor,
    block_m: int,
) -> torch.Tensor:
    """y[t, slice j] += u[t, j*R:(j+1)*R] @ lora_b[slot(t), slice j].T in place for every
    adapter token; returns y. u [split_k, T, len(slices) * R] fp32, lora_shrink's partial
    sums (summed here in order); lora_b [S, sum(slices), R]; y [T, sum(slices)], contiguous
    rows."""
    check_tensor("u", u, ndim=3, dtypes=(torch.float32,))
    _check_layout(y, sorted_ids, block_slots, num_padded, block_m)
    check_tensor("lora_b", lora_b, ndim=3, device=y.device)
    if u.device != y.device or u.stride(2) != 1:
        raise ValueError("u must be lora_shrink's output, on y's device")
    widths = [int(w) for w in slices]
    if not 1 <= len(widths) <= MAX_SLICES or min(widths) <= 0:
        raise ValueError(f"slices must be 1 to {MAX_SLICES} positive widths, got {widths}")
    rank = lora_b.shape[2]
    out_features = sum(widths)
    if lora_b.shape[1] != out_features or lora_b.stride(2) != 1:
        raise ValueError(
            f"lora_b must be a contiguous [S, {out_features}, R], got {tuple(lora_b.shape)}"
        )
    if u.shape[2] != len(widths) * rank:
        raise ValueError(
            f"u must have {len(widths)} * R = {len(widths) * rank} columns, got {u.shape[2]}"
        )
    if y.shape != (u.shape[1], out_features) or y.stride(1) != 1:
        raise ValueError(f"y must be [{u.shape[1]}, {out_features}] with contiguous rows")
    if u.shape[1] == 0 or sorted_ids.numel() == 0:
        return y
    block_n = 64 if min(widths) >= 64 else max(16, next_pow2(min(widths)))
    block_r = max(16, next_pow2(rank))
    w = widths + [0] * (MAX_SLICES - len(widths))
    tiles = sum(triton.cdiv(x, block_n) for x in widths)
    grid = (triton.cdiv(sorted_ids.numel(), block_m) * tiles,)
    _expand_kernel[grid](
        u, lora_b, y, sorted_ids, block_slots, num_padded,
        u.shape[1], rank, w[0], w[1], w[2], tiles, sorted_ids.numel(),
        u.stride(0), u.stride(1), lora_b.stride(0), lora_b.stride(1), y.stride(0),
        SPLIT_K=u.shape[0], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_R=block_r,
        PRECISION=_precision(lora_b.dtype),
    )  # fmt: skip
    return y


def _check_layout(x, sorted_ids, block_slots, num_padded, block_m) -> None:
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_runnable("x", x)
    if x.stride(1) != 1:
        raise ValueError("x must be contiguous in its last dimension; call .contiguous()")
    for name, t in (
        ("sorted_ids", sorted_ids),
        ("block_slots", block_slots),
        ("num_padded", num_padded),
    ):
        check_tensor(name, t, ndim=1, dtypes=(torch.int32,), device=x.device)
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 16, got {block_m}")
    if sorted_ids.numel() % block_m or block_slots.numel() != sorted_ids.numel() // block_m:
        raise ValueError(
            f"sorted_ids ({sorted_ids.numel()}) must be whole blocks of {block_m} and "
            f"block_slots ({block_slots.numel()}) one slot per block"
        )


@triton.jit(**dynamic_args("num_tokens", "num_rows"))
def _shrink_kernel(
    X, A, U, SortedIds, BlockSlots, NumPadded,
    num_tokens, N, K, chunk, num_rows,
    stride_xm, stride_as, stride_an, stride_us, stride_um,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n
    if pid_m * BLOCK_M >= tl.load(NumPadded):
        return
    ids = tl.load(SortedIds + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = ids < num_tokens
    slot = tl.load(BlockSlots + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    k_start = split * chunk
    offs_k = k_start + tl.arange(0, BLOCK_K)
    x_ptrs = X + ids[:, None] * stride_xm + offs_k[None, :]
    a_ptrs = A + slot * stride_as + offs_n[None, :] * stride_an + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = tl.minimum(k_start + chunk, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        k_ok = offs_k < k_end - (k0 - k_start)
        xt = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        at = tl.load(a_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(xt, at, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
    u_ptrs = U + split * stride_us + ids[:, None] * stride_um + offs_n[None, :]
    tl.store(u_ptrs, acc, mask=row_ok[:, None] & n_ok[None, :])


@triton.jit(**dynamic_args("num_tokens", "num_rows"))
def _expand_kernel(
    U, B, Y, SortedIds, BlockSlots, NumPadded,
    num_tokens, R, W0, W1, W2, tiles, num_rows,
    stride_us, stride_um, stride_bs, stride_bn, stride_ym,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    pid_m = pid // tiles
    pid_n = pid % tiles
    if pid_m * BLOCK_M >= tl.load(NumPadded):
        return
    # which slice this column tile is in, and the tile's columns within it
    t0 = tl.cdiv(W0, BLOCK_N)
    t1 = tl.cdiv(W1, BLOCK_N)
    in1 = pid_n >= t0
    in2 = pid_n >= t0 + t1
    j = in1.to(tl.int32) + in2.to(tl.int32)
    first_tile = tl.where(in2, t0 + t1, tl.where(in1, t0, 0))
    start = tl.where(in2, W0 + W1, tl.where(in1, W0, 0))
    width = tl.where(in2, W2, tl.where(in1, W1, W0))
    offs_c = (pid_n - first_tile) * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ok = offs_c < width
    cols = start + offs_c
    ids = tl.load(SortedIds + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = ids < num_tokens
    slot = tl.load(BlockSlots + pid_m).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)
    r_ok = offs_r < R
    u_mask = row_ok[:, None] & r_ok[None, :]
    u_ptrs = U + ids[:, None] * stride_um + j * R + offs_r[None, :]
    usum = tl.load(u_ptrs, mask=u_mask, other=0.0)
    for s in range(1, SPLIT_K):  # the shrink's partial sums, in order
        usum += tl.load(u_ptrs + s * stride_us, mask=u_mask, other=0.0)
    ut = usum.to(B.dtype.element_ty)  # rounded as the reference rounds x @ A.T
    bt = tl.load(B + slot * stride_bs + cols[None, :] * stride_bn + offs_r[:, None],
                 mask=r_ok[:, None] & c_ok[None, :], other=0.0)  # fmt: skip
    acc = tl.dot(ut, bt, input_precision=PRECISION)
    y_ptrs = Y + ids[:, None] * stride_ym + cols[None, :]
    mask = row_ok[:, None] & c_ok[None, :]
    yt = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (yt + acc).to(Y.dtype.element_ty), mask=mask)
