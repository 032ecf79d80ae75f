"""Hybrid attention over the paged KV pool in one family of Triton kernels. Prefill chunks,
decodes and verify tokens of one batch share one tiling (see `attention_plan`).

    plan = plan_attention(...); out = hybrid_attention(q, k_buffer, v_buffer, plan)

The new tokens' K/V are already in the pool; each tile walks its KV range through
req_to_token with an online softmax. Handles GQA, latent attention (rope_dim > 0) and FP8
pools. Layouts and masking: docs/design/attention.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import (
    FLOAT_DTYPES,
    check_last_dim_contiguous,
    check_runnable,
    check_tensor,
    dynamic_args,
)
from .attention_plan import MAX_SPLITS, AttentionPlan, Launch, plan_attention
from .fp8_ref import FP8

_LOG2E = 1.4426950408889634
_NEG_BIG = tl.constexpr(-1.0e30)  # running max start: finite, so fully masked blocks give no NaN


def hybrid_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    plan: AttentionPlan,
    *,
    sm_scale: float | None = None,
    out: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Attention of every new token of the planned batch (decode, prefill chunk and verify
    rows alike) over the paged pool; writes and returns `out` ([T, num_q_heads, head_dim],
    q's dtype). Call `plan_attention` once per batch and this once per layer. Queries and
    keys longer than head_dim by rope_dim: latent attention (docs/design/attention.md)."""
    out = _check_inputs(q, k_buffer, v_buffer, plan, out)
    scale = (q.shape[2] ** -0.5 if sm_scale is None else float(sm_scale)) * _LOG2E
    scale *= k_scale  # scores of stored keys: q . (k / k_scale)
    if not scale > 0.0:  # the kernel takes each row's max before scaling
        raise ValueError(f"sm_scale and k_scale must be positive, got {sm_scale}, {k_scale}")
    v_scale = float(v_scale)
    if plan.extend is not None:
        _launch(q, k_buffer, v_buffer, out, plan, plan.extend, scale, v_scale, split=False)
    if plan.split is not None:
        split = plan.split.num_splits > 1
        _launch(q, k_buffer, v_buffer, out, plan, plan.split, scale, v_scale, split=split)
        if split:
            _merge(out, plan)
    return out


def warm_up(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    *,
    num_q_heads: int,
    q_dtype: torch.dtype | None = None,
) -> int:
    """Run once every variant a step can pick — the extend launch, and the split launch at
    each BLOCK_M its rows may need, with and without KV splits, with the merge at each
    BLOCK_S — so that none is compiled (seconds each) in the middle of serving: the
    first time a busy step has enough decodes to need no split, a long verify row, a draft
    model's first prefill. Reads the pool through row 0 of req_to_token; writes nothing but
    scratch. q_dtype: the queries' (default the pool's; an FP8 pool's model dtype). Returns
    the number of launches."""
    num_kv_heads, head_dim = v_buffer.shape[1], v_buffer.shape[2]
    dev = k_buffer.device
    group = num_q_heads // num_kv_heads
    max_rows = max(1, 64 // group)  # plan_attention's default split_max_tokens
    q_dim = k_buffer.shape[2]  # head_dim, or head_dim + rope_dim for latent attention
    dtype = q_dtype or k_buffer.dtype
    q = torch.zeros(max_rows + 1, num_q_heads, q_dim, dtype=dtype, device=dev)
    row = torch.zeros(1, dtype=torch.int64, device=dev)  # the dtypes a step's plan has
    seen: set[tuple[int, int, int]] = set()
    for e in range(1, max_rows + 2):  # max_rows + 1: the extend launch
        for s in (1, 2, 32, MAX_SPLITS):
            plan = plan_attention(
                req_to_token,
                row,
                torch.tensor([e + 8], device=dev),
                torch.tensor([e], device=dev),
                torch.zeros(1, dtype=torch.int64, device=dev),
                num_q_heads=num_q_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                seq_lens_cpu=[e + 8],
                extend_lens_cpu=[e],
                num_kv_splits=s,
            )
            if plan.split is None:  # the extend launch (splits do not apply)
                assert plan.extend is not None  # e > 0 rows to extend
                key = (plan.extend.config.block_m, 0, 0)
            else:  # the launches' compile-time constants
                key = (plan.split.config.block_m, s, 0)
            if s > 1 and plan.split is not None:
                key = (key[0], 2, max(16, triton.next_power_of_2(s)))
            if key not in seen:
                seen.add(key)
                hybrid_attention(q[:e], k_buffer, v_buffer, plan)
    return len(seen)


def extend_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    *,
    sm_scale: float | None = None,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Prefill/extend attention: every request through the extend launch (new tokens over the
    cached prefix, causal among themselves or by `custom_mask`, see `plan_attention`)."""
    plan = _plan_for(q, v_buffer, req_to_token, req_pool_indices, seq_lens, extend_lens,
                     extend_start_loc, custom_mask=custom_mask, mask_indptr=mask_indptr,
                     split_max_tokens=0)  # fmt: skip
    return hybrid_attention(q, k_buffer, v_buffer, plan, sm_scale=sm_scale, out=out)


def decode_attention(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    sm_scale: float | None = None,
    num_kv_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention, one new token a request (q: [B, num_q_heads, head_dim]), split-KV in
    two stages: partial outputs and log-sum-exps per KV chunk, then a merge."""
    check_tensor("q", q, ndim=3)
    b = q.shape[0]
    check_tensor("seq_lens", seq_lens, ndim=1)
    if seq_lens.numel() != b:
        raise ValueError(f"q has {b} rows but seq_lens has {seq_lens.numel()}: one token each")
    ones = torch.ones(b, dtype=torch.int32, device=q.device)
    starts = torch.arange(b, dtype=torch.int32, device=q.device)
    plan = _plan_for(q, v_buffer, req_to_token, req_pool_indices, seq_lens, ones, starts,
                     extend_lens_cpu=[1] * b, split_max_tokens=1,
                     num_kv_splits=num_kv_splits)  # fmt: skip
    return hybrid_attention(q, k_buffer, v_buffer, plan, sm_scale=sm_scale, out=out)


def _plan_for(q, v_buffer, req_to_token, *batch, **kwargs) -> AttentionPlan:
    check_tensor("q", q, ndim=3)
    check_tensor("v_buffer", v_buffer, ndim=3)
    return plan_attention(req_to_token, *batch, num_q_heads=q.shape[1],
                          num_kv_heads=v_buffer.shape[1], head_dim=v_buffer.shape[2],
                          **kwargs)  # fmt: skip


def _check_inputs(q, k_buffer, v_buffer, plan: AttentionPlan, out) -> torch.Tensor:
    hq, hk, d = plan.num_q_heads, plan.num_kv_heads, plan.head_dim
    device = plan.req_to_token.device
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    check_runnable("q", q)
    rope = q.shape[2] - d  # latent attention's extra query/key columns (0: plain attention)
    if q.shape[0] < plan.num_tokens or q.shape[1] != hq or not 0 <= rope <= 256:
        raise ValueError(
            f"q must be [>= {plan.num_tokens}, {hq}, {d} (+ rope_dim <= 256)] for this plan, "
            f"got {tuple(q.shape)}"
        )
    for name, t, width in (("k_buffer", k_buffer, d + rope), ("v_buffer", v_buffer, d)):
        check_tensor(name, t, ndim=3, dtypes=(q.dtype, FP8), device=device)
        if t.dtype != k_buffer.dtype:
            raise ValueError("k_buffer and v_buffer must have the same dtype")
        if tuple(t.shape[1:]) != (hk, width):
            raise ValueError(f"{name} must be [num_slots + 1, {hk}, {width}], got {tuple(t.shape)}")
        check_last_dim_contiguous(name, t)
    check_last_dim_contiguous("q", q)
    if q.is_cuda and q.element_size() == 4 and d > 256 and hq // hk > FP32_LATENT_MAX_GROUP:
        raise ValueError(
            f"fp32 latent attention on CUDA takes at most {FP32_LATENT_MAX_GROUP} query heads "
            f"per latent view (got {hq // hk}: {hq} heads over {hk} views); larger fp32 tiles "
            "crash on the H200: use bf16/fp16, or more views"
        )
    shape = (q.shape[0], hq, d)
    if out is None:
        return q.new_empty(shape)
    check_tensor("out", out, ndim=3, dtypes=(q.dtype,), device=device)
    if tuple(out.shape) != shape:
        raise ValueError(f"out must have shape {shape}, got {tuple(out.shape)}")
    check_last_dim_contiguous("out", out)
    return out


# fp32 latent rows (512 + 64 wide) on CUDA: tiles of 4 query heads ran on the H200, 16 made an
# illegal memory access (tests/kernels/test_attention_latent.py, 2026-12-03)
FP32_LATENT_MAX_GROUP = 4


def _launch(q, k, v, out, plan: AttentionPlan, launch: Launch, scale: float, v_scale: float,
            split: bool):  # fmt: skip
    cfg = launch.config
    block_n, warps, stages = cfg.block_n, cfg.num_warps, cfg.num_stages
    if q.element_size() == 4 and plan.head_dim > 256:
        # fp32 latent rows (512 + 64 wide): the 16-bit tiles need 426 KB of shared memory;
        # these are the CPU tests' sizes
        block_n, warps, stages = 16, 4, 1
    has_mask = plan.custom_mask is not None
    mask = plan.custom_mask if has_mask else plan.seq_lens  # any pointer when unused
    mask_indptr = plan.mask_indptr if has_mask else plan.seq_lens
    part_o = plan.partial_o if split else out
    part_lse = plan.partial_lse if split else out
    grid = (launch.num_tiles, plan.num_kv_heads, launch.num_splits)
    rope = q.shape[2] - plan.head_dim
    _attn_tile_kernel[grid](
        q, k, v, out, part_o, part_lse,
        plan.req_to_token, plan.req_pool_indices, plan.seq_lens, plan.extend_lens,
        plan.extend_start_loc, launch.tile_req, launch.tile_m, launch.tile_out,
        mask, mask_indptr, scale, v_scale, launch.num_splits,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), plan.req_to_token.stride(0),
        NUM_Q_HEADS=plan.num_q_heads, GROUP=plan.group, HEAD_DIM=plan.head_dim,
        BLOCK_D=triton.next_power_of_2(plan.head_dim), ROPE_DIM=rope,
        BLOCK_R=max(16, triton.next_power_of_2(rope)), BLOCK_M=cfg.block_m,
        BLOCK_N=block_n, SPLIT=split, HAS_MASK=has_mask,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip


def _merge(out: torch.Tensor, plan: AttentionPlan) -> None:
    assert plan.split is not None and plan.split_rows is not None  # a split plan
    n = plan.split_rows.shape[1]
    s = plan.split.num_splits
    _merge_splits_kernel[(n, plan.num_q_heads)](
        plan.partial_o, plan.partial_lse, out, plan.split_rows, plan.extend_start_loc, n, s,
        out.stride(0), out.stride(1),
        NUM_Q_HEADS=plan.num_q_heads, HEAD_DIM=plan.head_dim,
        BLOCK_D=triton.next_power_of_2(plan.head_dim), BLOCK_S=max(16, triton.next_power_of_2(s)),
        num_warps=4 if plan.head_dim >= 128 else 2,
    )  # fmt: skip


@triton.jit
def _softmax_step(acc, m_i, l_i, qk, v, scale):
    """One online-softmax update with a [M, N] block of raw scores (masked ones -inf); `scale`
    (> 0) takes them to log2 units: the max is taken before scaling, so scaling and the
    subtraction of the max are one multiply-add, and p @ v accumulates into the rescaled acc."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * scale)
    p = tl.math.exp2(qk * scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


# Per-step values: index tables are views at any offset of one packed upload, split counts
# and row counts change with the batch. Specializing on them recompiled mid-run.
_STEP_ARGS = (
    "ReqPoolIdx",
    "SeqLens",
    "ExtendLens",
    "ExtendStart",
    "TileReq",
    "TileM",
    "TileOut",
    "Mask",
    "MaskIndptr",
    "num_splits",
)


@triton.jit(**dynamic_args(*_STEP_ARGS))
def _attn_tile_kernel(
    Q, K, V, O, PartO, PartLse,
    ReqToToken, ReqPoolIdx, SeqLens, ExtendLens, ExtendStart, TileReq, TileM, TileOut,
    Mask, MaskIndptr, sm_scale_log2, v_scale, num_splits,
    stride_qt, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ot, stride_oh,
    stride_r2t,
    NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, HAS_MASK: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    split_id = tl.program_id(2)
    b = tl.load(TileReq + tile)
    m0 = tl.load(TileM + tile)
    seq_len = tl.load(SeqLens + b).to(tl.int32)
    ext_len = tl.load(ExtendLens + b).to(tl.int32)
    q_start = tl.load(ExtendStart + b).to(tl.int64)
    req = tl.load(ReqPoolIdx + b).to(tl.int64)
    prefix = seq_len - ext_len

    TOKENS: tl.constexpr = BLOCK_M // GROUP
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_tok = m0 + offs_m // GROUP  # token within the request's new tokens
    row_head = kvh * GROUP + offs_m % GROUP
    row_ok = (offs_m < TOKENS * GROUP) & (row_tok < ext_len)
    row_pos = prefix + row_tok  # absolute position = the last key it may see (causal)
    d_ok = offs_d < HEAD_DIM

    q_ptrs = Q + (q_start + row_tok)[:, None] * stride_qt + row_head[:, None] * stride_qh
    q = tl.load(q_ptrs + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if ROPE_DIM > 0:  # latent attention: the query's RoPE part, scored apart
        offs_r = HEAD_DIM + tl.arange(0, BLOCK_R)
        r_ok = offs_r < HEAD_DIM + ROPE_DIM
        q_pe = tl.load(q_ptrs + offs_r[None, :], mask=row_ok[:, None] & r_ok[None, :], other=0.0)

    # KV range of the tile: causal end, or the whole sequence under a custom mask.
    n_tok = tl.minimum(ext_len - m0, TOKENS)
    kv_end = prefix + m0 + n_tok
    full_hi = prefix + m0 + 1  # keys below it are visible to every row of the tile
    mask_off = tl.zeros([], dtype=tl.int64)
    use_mask = kv_end < 0  # False, typed as a runtime scalar
    if HAS_MASK:
        mask_off = tl.load(MaskIndptr + b).to(tl.int64)
        use_mask = mask_off >= 0
        kv_end = tl.where(use_mask, seq_len, kv_end)
    kv_lo = 0
    kv_hi = kv_end
    if SPLIT:
        per_split = tl.cdiv(tl.cdiv(kv_end, num_splits), BLOCK_N) * BLOCK_N
        kv_lo = split_id * per_split
        kv_hi = tl.minimum(kv_lo + per_split, kv_end)
    full_hi = tl.where(use_mask, kv_lo, tl.minimum(full_hi, kv_hi))
    full_end = kv_lo + tl.maximum(full_hi - kv_lo, 0) // BLOCK_N * BLOCK_N

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + _NEG_BIG
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    r2t = ReqToToken + req * stride_r2t
    k_base = K + kvh * stride_kh
    v_base = V + kvh * stride_vh

    for start in range(kv_lo, full_end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        slots = tl.load(r2t + offs_n).to(tl.int64)
        k = tl.load(k_base + slots[None, :] * stride_kb + offs_d[:, None],
                    mask=d_ok[:, None], other=0.0).to(q.dtype)  # fmt: skip
        qk = tl.dot(q, k)
        if ROPE_DIM > 0:
            k_pe = tl.load(k_base + slots[None, :] * stride_kb + offs_r[:, None],
                           mask=r_ok[:, None], other=0.0).to(q.dtype)  # fmt: skip
            qk += tl.dot(q_pe, k_pe)
        v = tl.load(v_base + slots[:, None] * stride_vb + offs_d[None, :],
                    mask=d_ok[None, :], other=0.0).to(q.dtype)  # fmt: skip
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, qk, v, sm_scale_log2)

    for start in range(full_end, kv_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < kv_hi
        slots = tl.load(r2t + offs_n, mask=n_ok, other=0).to(tl.int64)
        k = tl.load(k_base + slots[None, :] * stride_kb + offs_d[:, None],
                    mask=n_ok[None, :] & d_ok[:, None], other=0.0).to(q.dtype)  # fmt: skip
        qk = tl.dot(q, k)
        if ROPE_DIM > 0:
            k_pe = tl.load(k_base + slots[None, :] * stride_kb + offs_r[:, None],
                           mask=n_ok[None, :] & r_ok[:, None], other=0.0).to(q.dtype)  # fmt: skip
            qk += tl.dot(q_pe, k_pe)
        visible = offs_n[None, :] <= row_pos[:, None]
        if HAS_MASK:
            # (a vector, not the scalar use_mask: the interpreter rejects broadcast scalars)
            row_use = row_ok & ((tl.zeros([BLOCK_M], dtype=tl.int64) + mask_off) >= 0)
            custom = tl.load(
                Mask + mask_off + row_tok[:, None].to(tl.int64) * seq_len + offs_n[None, :],
                mask=row_use[:, None] & n_ok[None, :],
                other=0,
            )
            visible = tl.where(use_mask, custom != 0, visible)
        qk = tl.where(visible & n_ok[None, :], qk, float("-inf"))
        v = tl.load(v_base + slots[:, None] * stride_vb + offs_d[None, :],
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0).to(q.dtype)  # fmt: skip
        acc, m_i, l_i = _softmax_step(acc, m_i, l_i, qk, v, sm_scale_log2)

    empty = l_i == 0.0  # nothing visible (a masked-out row, or an empty split)
    acc = acc / tl.where(empty, 1.0, l_i)[:, None]
    acc = acc * v_scale  # an FP8 pool's values are V / v_scale (1.0 otherwise: exact)
    if SPLIT:
        row = tl.load(TileOut + tile).to(tl.int64) + (row_tok - m0)
        po = PartO + ((row * NUM_Q_HEADS + row_head) * num_splits + split_id)[:, None] * HEAD_DIM
        tl.store(po + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
        lse = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
        tl.store(PartLse + (row * NUM_Q_HEADS + row_head) * num_splits + split_id, lse,
                 mask=row_ok)  # fmt: skip
    else:
        o_ptrs = O + (q_start + row_tok)[:, None] * stride_ot + row_head[:, None] * stride_oh
        tl.store(o_ptrs + offs_d[None, :], acc.to(O.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])  # fmt: skip


@triton.jit(**dynamic_args("SplitRows", "ExtendStart", "n_rows", "num_splits"))
def _merge_splits_kernel(
    PartO, PartLse, O, SplitRows, ExtendStart, n_rows, num_splits, stride_ot, stride_oh,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):  # fmt: skip
    """out[token, head] = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M) over the KV splits."""
    i = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    d_ok = offs_d < HEAD_DIM
    base = (i * NUM_Q_HEADS + h) * num_splits
    lse = tl.load(PartLse + base + offs_s, mask=s_ok, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.math.exp2(lse - top)
    o = tl.load(PartO + (base + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                mask=s_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
    total = tl.sum(w, 0)
    merged = tl.sum(w[:, None] * o, 0) / tl.where(total == 0.0, 1.0, total)
    b = tl.load(SplitRows + i)
    m = tl.load(SplitRows + n_rows + i)
    token = tl.load(ExtendStart + b).to(tl.int64) + m
    o_ptrs = O + token * stride_ot + h * stride_oh + offs_d
    tl.store(o_ptrs, merged.to(O.dtype.element_ty), mask=d_ok)
