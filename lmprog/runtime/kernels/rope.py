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

from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check_runnable, check_tensor, dynamic_args
from .fp8 import to_e4m3
from .fp8_ref import FP8, cast_e4m3


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


def rope_and_store(
    qkv: torch.Tensor,
    num_q_heads: int,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_loc: torch.Tensor,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """One pass per token over a fused q/k/v projection [T, Hq + 2 Hk, D]: q and k rotated in
    place (neox layout; `cos` / `signed_sin` as RotaryEmbedding.cos_sin makes them), and the
    rotated k and the v written to k_cache / v_cache at out_loc (an FP8 pool stores k / k_scale
    and v / v_scale). Replaces rotary + two pool writes. Details: docs/design/attention.md.
    """
    cos2, sin2 = _check_store(qkv, num_q_heads, cos, signed_sin, k_cache, v_cache, out_loc)
    t, heads, d = qkv.shape
    if t == 0:
        return
    _rope_store_kernel[(t,)](
        qkv, cos2, sin2, out_loc, k_cache, v_cache, num_q_heads, (heads - num_q_heads) // 2,
        qkv.stride(0), qkv.stride(1), cos2.stride(0), sin2.stride(0),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        float(k_scale), float(v_scale),
        D=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_H=4, FP8_CACHE=k_cache.dtype == FP8,
        num_warps=4,
    )  # fmt: skip


def rope_and_store_ref(
    qkv: torch.Tensor,
    num_q_heads: int,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_loc: torch.Tensor,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """In-place reference of `rope_and_store` (fp32 math, one rounding)."""
    hk = (qkv.shape[1] - num_q_heads) // 2
    qk = qkv[:, : num_q_heads + hk].float()
    c = cos.reshape(qkv.shape[0], 1, -1).float()
    s = signed_sin.reshape(qkv.shape[0], 1, -1).float()
    rotated = (qk * c + qk.roll(qk.shape[-1] // 2, dims=-1) * s).to(qkv.dtype)
    qkv[:, : num_q_heads + hk] = rotated
    k, v = qkv[:, num_q_heads : num_q_heads + hk], qkv[:, num_q_heads + hk :]
    if k_cache.dtype == FP8:
        k, v = cast_e4m3(k, k_scale), cast_e4m3(v, v_scale)
    k_cache[out_loc.long()] = k
    v_cache[out_loc.long()] = v


def _check_store(qkv, num_q_heads, cos, sin, k_cache, v_cache, out_loc):
    check_tensor("qkv", qkv, ndim=3, dtypes=FLOAT_DTYPES)
    check_runnable("qkv", qkv)
    t, heads, d = qkv.shape
    hk = (heads - num_q_heads) // 2
    if (
        not isinstance(num_q_heads, int)
        or num_q_heads < 1
        or hk < 1
        or num_q_heads + 2 * hk != heads
        or num_q_heads % hk
    ):
        raise ValueError(
            f"qkv's {heads} heads must be num_q_heads ({num_q_heads}) + 2 * k heads "
            "with the q heads a multiple of the k heads"
        )
    if qkv.stride(2) != 1 or d % 2:
        raise ValueError(
            f"qkv must be contiguous in an even head_dim, got stride "
            f"{qkv.stride()} and head_dim {d}"
        )
    rows = []
    for name, x in (("cos", cos), ("signed_sin", sin)):
        check_tensor(name, x, dtypes=FLOAT_DTYPES, device=qkv.device)
        if x.numel() != t * d or x.shape[0] != t or x.shape[-1] != d:
            raise ValueError(f"{name} must be [{t}, {d}] or [{t}, 1, {d}], got {tuple(x.shape)}")
        x2 = x.reshape(t, d)
        if x2.stride(1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
        rows.append(x2)
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, cache, ndim=3, dtypes=(qkv.dtype, FP8), device=qkv.device)
        if cache.dtype != k_cache.dtype:
            raise ValueError("k_cache and v_cache must have the same dtype")
        if tuple(cache.shape[1:]) != (hk, d) or cache.stride(2) != 1:
            raise ValueError(
                f"{name} must be [slots, {hk}, {d}] contiguous in head_dim, "
                f"got {tuple(cache.shape)}"
            )
    check_tensor("out_loc", out_loc, ndim=1, dtypes=INDEX_DTYPES, device=qkv.device)
    if out_loc.shape[0] != t:
        raise ValueError(f"out_loc must be [{t}], got {tuple(out_loc.shape)}")
    return rows


@triton.jit
def _to_cache(y, scale, FP8_CACHE: tl.constexpr):
    """A value as the pool stores it: as it is, or e4m3 of y / scale (fp32 math)."""
    # One return: Triton on a GPU checks every return statement's type, also one after a
    # constexpr branch that returned (the CPU interpreter does not).
    if FP8_CACHE:
        yf = y.to(tl.float32)
        out = to_e4m3(tl.div_rn(yf, scale + tl.zeros_like(yf)))
    else:
        out = y
    return out


@triton.jit
def _rope_rows(X, n_heads, stride_h, cos, sin, d, rolled, ok,
               BLOCK_H: tl.constexpr, Cache, stride_ch, STORE: tl.constexpr,
               scale, FP8_CACHE: tl.constexpr):  # fmt: skip
    """Rotate n_heads rows of X in place; also store them at Cache when STORE."""
    for h0 in range(0, n_heads, BLOCK_H):
        heads = h0 + tl.arange(0, BLOCK_H)
        m = (heads < n_heads)[:, None] & ok[None, :]
        x = tl.load(X + heads[:, None] * stride_h + d[None, :], mask=m, other=0.0).to(tl.float32)
        xr = tl.load(X + heads[:, None] * stride_h + rolled[None, :], mask=m, other=0.0).to(
            tl.float32
        )
        y = (x * cos + xr * sin).to(X.dtype.element_ty)
        tl.debug_barrier()  # every lane has read its rolled partner before anyone writes
        tl.store(X + heads[:, None] * stride_h + d[None, :], y, mask=m)
        if STORE:
            c = _to_cache(y, scale, FP8_CACHE)
            tl.store(Cache + heads[:, None] * stride_ch + d[None, :], c, mask=m)


@triton.jit(**dynamic_args("Loc"))  # a view at a per-step offset of the step's upload
def _rope_store_kernel(
    QKV, Cos, Sin, Loc, KC, VC, n_q, n_k, stride_t, stride_h, stride_cos, stride_sin,
    stride_ks, stride_kh, stride_vs, stride_vh, k_scale, v_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, FP8_CACHE: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(Loc + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    rolled = (d + D // 2) % D
    cos = tl.load(Cos + t * stride_cos + d, mask=ok, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(Sin + t * stride_sin + d, mask=ok, other=0.0).to(tl.float32)[None, :]
    row = QKV + t * stride_t
    _rope_rows(row, n_q, stride_h, cos, sin, d, rolled, ok, BLOCK_H, KC, 0, False,
               k_scale, FP8_CACHE)  # fmt: skip
    _rope_rows(
        row + n_q * stride_h,
        n_k,
        stride_h,
        cos,
        sin,
        d,
        rolled,
        ok,
        BLOCK_H,
        KC + slot * stride_ks,
        stride_kh,
        True,
        k_scale,
        FP8_CACHE,
    )
    for h0 in range(0, n_k, BLOCK_H):  # v: a plain copy into the pool
        heads = h0 + tl.arange(0, BLOCK_H)
        m = (heads < n_k)[:, None] & ok[None, :]
        v = tl.load(row + (n_q + n_k + heads[:, None]) * stride_h + d[None, :], mask=m, other=0.0)
        v = _to_cache(v, v_scale, FP8_CACHE)
        tl.store(VC + slot * stride_vs + heads[:, None] * stride_vh + d[None, :], v, mask=m)
