"""Rotary position embedding, in place on q and k, from a precomputed cos/sin cache.

    cos_sin_cache[pos] = [cos(pos * f_0) .. cos(pos * f_{R/2-1}) | sin(...) ..]   R = rot_dim
    neox/llama style pairs element i with i + R/2; gpt-j style pairs 2i with 2i + 1:
        x1' = x1 cos - x2 sin,   x2' = x2 cos + x1 sin
Dimensions past rot_dim (partial rotary) are left as they are. Scaled frequencies (llama3,
linear, NTK...) are the caller's: build the cache from the scaled inverse frequencies.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check_runnable, check_tensor


def cos_sin_cache(
    inv_freq: torch.Tensor, max_positions: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """[max_positions, 2 * len(inv_freq)]: cos then sin of position * inv_freq (fp32 math)."""
    check_tensor("inv_freq", inv_freq, ndim=1)
    t = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
    freqs = torch.outer(t, inv_freq.float())
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    is_neox: bool = True,
) -> None:
    """Rotate q [T, Hq, D] and k [T, Hk, D] in place by each token's position ([T] ints)."""
    rot = _check(q, k, positions, cos_sin_cache)
    t = q.shape[0]
    if t == 0:
        return
    half = rot // 2
    _rope_kernel[(t,)](
        q, k, positions, cos_sin_cache, q.shape[1], k.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half), BLOCK_H=4, IS_NEOX=is_neox,
        num_warps=4,
    )  # fmt: skip


def apply_rope_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out-of-place reference: the rotated (q, k)."""
    cs = cos_sin_cache[positions.long()].float()
    half = cs.shape[-1] // 2
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    return _rotate_ref(q, cos, sin, is_neox), _rotate_ref(k, cos, sin, is_neox)


def _rotate_ref(x, cos, sin, is_neox):
    half = cos.shape[-1]
    xf = x.float()
    rot, rest = xf[..., : 2 * half], xf[..., 2 * half :]
    if is_neox:
        x1, x2 = rot[..., :half], rot[..., half:]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    return torch.cat([rotated, rest], dim=-1).to(x.dtype)


def _check(q, k, positions, cache) -> int:
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES)
    check_runnable("q", q)
    check_tensor("k", k, ndim=3, dtypes=(q.dtype,), device=q.device)
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"k {tuple(k.shape)} must match q {tuple(q.shape)} in tokens, head_dim")
    for name, t in (("q", q), ("k", k)):
        if t.stride(2) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    check_tensor("positions", positions, ndim=1, dtypes=INDEX_DTYPES, device=q.device)
    if positions.shape[0] != q.shape[0]:
        raise ValueError(f"positions must be [{q.shape[0]}], got {tuple(positions.shape)}")
    check_tensor("cos_sin_cache", cache, ndim=2, dtypes=FLOAT_DTYPES, device=q.device)
    rot = cache.shape[1]
    if rot % 2 or rot > q.shape[2] or cache.stride(1) != 1:
        raise ValueError(
            f"cos_sin_cache must be [max_positions, rot_dim] (contiguous rows) with an even "
            f"rot_dim <= head_dim={q.shape[2]}, got {tuple(cache.shape)}"
        )
    return rot


@triton.jit
def _rotate_heads(X, n_heads, stride_h, cos, sin, offs1, offs2, ok,
                  BLOCK_H: tl.constexpr):  # fmt: skip
    for h0 in range(0, n_heads, BLOCK_H):
        heads = h0 + tl.arange(0, BLOCK_H)
        m = (heads < n_heads)[:, None] & ok[None, :]
        p1 = X + heads[:, None] * stride_h + offs1[None, :]
        p2 = X + heads[:, None] * stride_h + offs2[None, :]
        x1 = tl.load(p1, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(p2, mask=m, other=0.0).to(tl.float32)
        tl.store(p1, (x1 * cos - x2 * sin).to(X.dtype.element_ty), mask=m)
        tl.store(p2, (x2 * cos + x1 * sin).to(X.dtype.element_ty), mask=m)


@triton.jit
def _rope_kernel(
    Q, K, Pos, CosSin, n_q_heads, n_k_heads, stride_qt, stride_qh, stride_kt, stride_kh,
    stride_c, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    IS_NEOX: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(Pos + t).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    ok = i < HALF
    cos = tl.load(CosSin + pos * stride_c + i, mask=ok, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(CosSin + pos * stride_c + HALF + i, mask=ok, other=0.0).to(tl.float32)[None, :]
    if IS_NEOX:
        offs1 = i
        offs2 = i + HALF
    else:
        offs1 = 2 * i
        offs2 = 2 * i + 1
    _rotate_heads(Q + t * stride_qt, n_q_heads, stride_qh, cos, sin, offs1, offs2, ok, BLOCK_H)
    _rotate_heads(K + t * stride_kt, n_k_heads, stride_kh, cos, sin, offs1, offs2, ok, BLOCK_H)
