"""Fused mixture-of-experts MLP: the routed tokens grouped by expert, one grouped GEMM per
projection (SGLang's / vLLM's fused_moe design).

    out = fused_moe(x, w13, w2, topk_weights, topk_ids)

`moe_align` sorts (token, choice) rows by expert in BLOCK_M blocks; shapes are fixed by
T, k and E, so it is graph-safe. Design: docs/design/models.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check_runnable, check_tensor, dynamic_args
from .small_m import SMEM_BYTES


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: dict[str, int] | None = None,
) -> torch.Tensor:
    """The routed experts' MLP of every token: [T, H] in x's dtype (see moe_ref for the math).

    x [T, H]; w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I], both x's dtype;
    topk_weights float [T, k]; topk_ids int32/int64 [T, k] with values in [0, E) (not
    checked: that would read them on the host). config: tile sizes (the keys of
    `block_config`'s result, powers of two >= 16) instead of the defaults (benchmarks)."""
    num_experts, inter = _check(x, w13, w2, topk_weights, topk_ids, out)
    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    if out is None:
        out = torch.empty_like(x)
    if tokens == 0:
        return out
    cfg = block_config(tokens * top_k, num_experts) if config is None else _check_config(config)
    sorted_ids, block_experts, num_padded = moe_align(topk_ids, num_experts, cfg["BLOCK_M"])
    align = (sorted_ids, block_experts, num_padded)
    act = torch.empty(tokens * top_k, inter, dtype=x.dtype, device=x.device)
    _gemm(x, w13, act, topk_weights, align, top_k, gate_up=True, cfg=cfg)
    # one choice per token: the weighted rows are the result; else each token's k rows summed
    y = out if top_k == 1 else torch.empty(tokens * top_k, hidden, dtype=x.dtype, device=x.device)
    _gemm(act, w2, y, topk_weights, align, 1, gate_up=False, cfg=cfg)
    if top_k > 1:
        torch.sum(y.view(tokens, top_k, hidden), dim=1, out=out)
    return out


def moe_align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_ids, block_experts, num_padded) for topk_ids [T, k], all int32 on its device:

    sorted_ids    [n + min(E, n) * (block_m - 1)], n = T * k: each expert's rows (flat index
                  t * k + choice, in token order) from a multiple of block_m on, padding = n
    block_experts [len(sorted_ids) / block_m rounded up]: the expert of each block
    num_padded    [1]: the used length of sorted_ids (blocks from there on are unused)

    Three launches of fixed shapes (zeroed counts, a histogram, one program per expert
    placing its rows): no host sync, so it can be captured in a CUDA graph. The layout is
    moe_ref.moe_align_ref's, exactly."""
    flat = topk_ids.reshape(-1)
    n, dev = flat.numel(), flat.device
    length = n + min(num_experts, n) * (block_m - 1)
    blocks = triton.cdiv(length, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=dev)
    sorted_ids = torch.empty(length, dtype=torch.int32, device=dev)
    block_experts = torch.empty(blocks, dtype=torch.int32, device=dev)
    num_padded = torch.empty(1, dtype=torch.int32, device=dev)
    if n:
        _count_kernel[(triton.cdiv(n, 1024),)](flat, counts, n, BLOCK=1024)
    # each expert's program scans all n rows: in one or a few wide steps, also for prefill
    scan = min(max(triton.next_power_of_2(n), 64), 4096)
    _align_kernel[(num_experts,)](
        flat, counts, sorted_ids, block_experts, num_padded, n, num_experts, length, blocks,
        BLOCK_M=block_m, E_POW2=triton.next_power_of_2(num_experts), BLOCK=scan,
        num_warps=4 if scan <= 1024 else 8,
    )  # fmt: skip
    return sorted_ids, block_experts, num_padded


def block_config(assignments: int, num_experts: int) -> dict[str, int]:
    """Tile sizes by the mean rows per expert: small blocks when each expert sees a few rows
    (decode: the weights are the traffic, narrow column blocks give every SM programs to
    stream them), large ones for prefill (the GEMMs are)."""
    per_expert = assignments / num_experts
    # the best of `bench_moe.py --sweep` on the H200 (Mixtral-8x7B's expert shapes, bf16):
    # 1 token 191 us, 64 tokens 681 us (the 16-row tiles took 915), 512 tokens 1,137 us (1,294)
    if per_expert <= 1:
        tiles = (16, 32, 128, 1, 4, 4)
    elif per_expert <= 32:
        tiles = (64, 128, 64, 8, 4, 4)
    else:
        tiles = (128, 128, 64, 8, 8, 3)
    return dict(zip(_CONFIG_KEYS, tiles))


_CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")


def _check_config(config: dict[str, int]) -> dict[str, int]:
    if set(config) != set(_CONFIG_KEYS):
        raise ValueError(f"config must have exactly the keys {_CONFIG_KEYS}, got {sorted(config)}")
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        v = config[key]
        if not isinstance(v, int) or v < 16 or v & (v - 1):
            raise ValueError(f"config[{key!r}] must be a power of two >= 16, got {v!r}")
    if min(config["GROUP_M"], config["num_warps"], config["num_stages"]) < 1:
        raise ValueError("config's GROUP_M, num_warps and num_stages must be >= 1")
    return config


def _gemm(a, w, c, topk_weights, align, rows_per_a: int, *, gate_up: bool, cfg) -> None:
    """c[id] = a[id // rows_per_a] @ w[expert].T (gate_up: silu(gate) * up of w's two halves;
    else weighted by topk_weights[id]) for every real row id of the aligned layout."""
    sorted_ids, block_experts, num_padded = align
    n_out = w.shape[1] // 2 if gate_up else w.shape[1]
    k_in = w.shape[2]
    grid = (triton.cdiv(sorted_ids.numel(), cfg["BLOCK_M"]) * triton.cdiv(n_out, cfg["BLOCK_N"]),)
    # the pipeline's stages as shared memory allows (fp32, and gate_up's two column tiles)
    b_cols = cfg["BLOCK_N"] * (2 if gate_up else 1)
    per_stage = (cfg["BLOCK_M"] + b_cols) * cfg["BLOCK_K"] * a.element_size()
    stages = max(1, min(cfg["num_stages"], SMEM_BYTES // per_stage))
    _moe_gemm_kernel[grid](
        a, w, c, topk_weights, sorted_ids, block_experts, num_padded,
        n_out, k_in, topk_weights.numel(), sorted_ids.numel(),
        a.stride(0), w.stride(0), w.stride(1), w.stride(2), c.stride(0),
        ROWS_PER_A=rows_per_a, GATE_UP=gate_up, WEIGHTED=not gate_up,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        GROUP_M=cfg["GROUP_M"], num_warps=cfg["num_warps"], num_stages=stages,
    )  # fmt: skip


def _check(x, w13, w2, topk_weights, topk_ids, out) -> tuple[int, int]:
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    check_runnable("x", x)
    dev = x.device
    check_tensor("w13", w13, ndim=3, dtypes=(x.dtype,), device=dev)
    check_tensor("w2", w2, ndim=3, dtypes=(x.dtype,), device=dev)
    check_tensor("topk_weights", topk_weights, ndim=2, dtypes=FLOAT_DTYPES, device=dev)
    check_tensor("topk_ids", topk_ids, ndim=2, dtypes=INDEX_DTYPES, device=dev)
    num_experts, two_inter, hidden = w13.shape
    inter = two_inter // 2
    if x.stride(1) != 1:
        raise ValueError("x must be contiguous in its last dimension; call .contiguous()")
    if hidden != x.shape[1] or two_inter % 2:
        raise ValueError(
            f"w13 must be [E, 2I, H] with H = x's {x.shape[1]}, got {tuple(w13.shape)}"
        )
    if tuple(w2.shape) != (num_experts, hidden, inter):
        raise ValueError(f"w2 must be [E, H, I] = {(num_experts, hidden, inter)}, got "
                         f"{tuple(w2.shape)}")  # fmt: skip
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"topk_ids and topk_weights must both be [T, k] with T = x's {x.shape[0]}; got "
            f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}"
        )
    if not 1 <= topk_ids.shape[1] <= num_experts:
        raise ValueError(f"k must be in [1, E={num_experts}], got {topk_ids.shape[1]}")
    if not topk_weights.is_contiguous():
        raise ValueError("topk_weights must be contiguous; call .contiguous()")
    if out is not None:
        check_tensor("out", out, dtypes=(x.dtype,), device=dev)
        if out.shape != x.shape or not out.is_contiguous():
            raise ValueError(f"out must be contiguous with x's shape {tuple(x.shape)}")
    return num_experts, inter


# the step's row counts vary from step to step: one compiled variant for all of them
@triton.jit(**dynamic_args("num_valid", "num_rows"))
def _moe_gemm_kernel(
    A, W, C, TopkWeights, SortedIds, BlockExperts, NumPadded,
    N, K, num_valid, num_rows,
    stride_am, stride_we, stride_wn, stride_wk, stride_cm,
    ROWS_PER_A: tl.constexpr, GATE_UP: tl.constexpr, WEIGHTED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    # grouped launch order: GROUP_M consecutive row blocks (mostly one expert) share a
    # column block of its weights while it is in L2
    pid = tl.program_id(0)
    blocks_m = tl.cdiv(num_rows, BLOCK_M)
    per_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    if pid_m * BLOCK_M >= tl.load(NumPadded):
        return
    ids = tl.load(SortedIds + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = ids < num_valid
    expert = tl.load(BlockExperts + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + (ids // ROWS_PER_A)[:, None] * stride_am + offs_k[None, :]
    w_ptrs = W + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_ok = k_ok[:, None] & n_ok[None, :]
        acc = tl.dot(a, tl.load(w_ptrs, mask=w_ok, other=0.0), acc)
        if GATE_UP:  # the up rows sit N rows below the gate rows
            acc_up = tl.dot(a, tl.load(w_ptrs + N * stride_wn, mask=w_ok, other=0.0), acc_up)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    if GATE_UP:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if WEIGHTED:
        acc = acc * tl.load(TopkWeights + ids, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    c_ptrs = C + ids[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit(**dynamic_args("n"))
def _count_kernel(Ids, Counts, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.atomic_add(Counts + tl.load(Ids + offs, mask=ok, other=0), 1, mask=ok)


@triton.jit(**dynamic_args("n", "length", "num_blocks"))
def _align_kernel(
    Ids, Counts, Sorted, BlockExperts, NumPadded, n, num_experts, length, num_blocks,
    BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # expert e's rows go to [start, start + count), its padding to [.., end): a multiple of
    # BLOCK_M, after the padded rows of experts 0 .. e-1
    e = tl.program_id(0)
    offs_e = tl.arange(0, E_POW2)
    counts = tl.load(Counts + offs_e, mask=offs_e < num_experts, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    mine = offs_e == e
    end = tl.sum(tl.where(mine, tl.cumsum(padded, 0), 0), 0)
    start = end - tl.sum(tl.where(mine, padded, 0), 0)
    filled = start + tl.sum(tl.where(mine, counts, 0), 0)
    base = start
    for i0 in range(0, n, BLOCK):  # its rows in token order: rank = hits before them
        offs = i0 + tl.arange(0, BLOCK)
        hit = (tl.load(Ids + offs, mask=offs < n, other=-1) == e).to(tl.int32)
        tl.store(Sorted + base + tl.cumsum(hit, 0) - 1, offs, mask=hit > 0)
        base += tl.sum(hit, 0)
    for p0 in range(filled, end, BLOCK):
        offs = p0 + tl.arange(0, BLOCK)
        tl.store(Sorted + offs, n, mask=offs < end)
    for b0 in range(start // BLOCK_M, end // BLOCK_M, BLOCK):
        offs = b0 + tl.arange(0, BLOCK)
        tl.store(BlockExperts + offs, e, mask=offs < end // BLOCK_M)
    if e == 0:  # the unused tail past every expert's blocks
        total = tl.sum(padded, 0)
        tl.store(NumPadded, total)
        for t0 in range(total, length, BLOCK):
            offs = t0 + tl.arange(0, BLOCK)
            tl.store(Sorted + offs, n, mask=offs < length)
        for b0 in range(total // BLOCK_M, num_blocks, BLOCK):
            offs = b0 + tl.arange(0, BLOCK)
            tl.store(BlockExperts + offs, num_experts - 1, mask=offs < num_blocks)
