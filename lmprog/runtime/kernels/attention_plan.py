"""The per-batch plan of the hybrid attention kernels: which tiles run, in which launch.

Built once per forward batch on the host from the scheduler's lengths (no device sync) and
reused by every layer; torch only. Prefill chunks go to the extend launch, decodes and
verifies to the split-KV launch; decode-only plans depend on the batch size alone, so CUDA
graphs can reuse them. Design: docs/design/attention.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._checks import INDEX_DTYPES, check_shape, check_tensor, interpreting, next_pow2

MIN_SPLIT_TOKENS = 256  # a split-KV chunk shorter than this costs more to merge than it saves
MAX_SPLITS = 64
# Aim the split launch at this many programs per multiprocessor (tuned on an H200 with
# bench/bench_kernels.py; the best split counts per shape: docs/benchmarks.md).
SPLIT_PROGRAMS_PER_SM = 6


@dataclass(frozen=True)
class TileConfig:
    """Block sizes of one launch: `block_m` rows of (token, q head), `block_n` keys a step."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"TileConfig.{name} must be a power of two >= 16, got {v}")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"bad TileConfig warps/stages: {self.num_warps}/{self.num_stages}")


@dataclass(frozen=True)
class Launch:
    """One launch of the attention kernel: a table of tiles (batch row, first token, first
    output row) and the launch's block sizes and number of KV splits."""

    tile_req: torch.Tensor  # int32 [n_tiles] batch row b
    tile_m: torch.Tensor  # int32 [n_tiles] first token of the tile within b's new tokens
    tile_out: torch.Tensor  # int32 [n_tiles] first row of the tile in the partial buffers
    config: TileConfig
    num_splits: int

    @property
    def num_tiles(self) -> int:
        return self.tile_req.numel()


@dataclass(frozen=True)
class AttentionPlan:
    """Everything the attention kernels need for one batch except q/k/v, reused by every layer.

    The batch tensors are the caller's own (not copied): a plan built on static buffers follows
    their contents. Row i of the partial buffers holds token `split_rows[1, i]` of batch row
    `split_rows[0, i]`.
    """

    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    extend_lens: torch.Tensor
    extend_start_loc: torch.Tensor
    custom_mask: torch.Tensor | None
    mask_indptr: torch.Tensor | None
    num_tokens: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    extend: Launch | None
    split: Launch | None
    split_rows: torch.Tensor | None  # int32 [2, n_split_tokens]
    partial_o: torch.Tensor | None  # fp32 [n_split_tokens, num_q_heads, num_splits, head_dim]
    partial_lse: torch.Tensor | None  # fp32 [n_split_tokens, num_q_heads, num_splits]

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads


def default_configs(device: torch.device, head_dim: int) -> tuple[TileConfig, TileConfig]:
    """(extend, split) tile configs for a device; small blocks under the interpreter so the
    CPU tests cross many tile boundaries."""
    if device.type != "cuda" or interpreting():
        return TileConfig(32, 16, 4, 1), TileConfig(16, 16, 4, 1)
    if head_dim > 256:  # latent attention's 512-wide values (untuned; SGLang's MLA sizes)
        return TileConfig(32, 64, 8, 1), TileConfig(16, 32, 4, 2)
    # Tuned on an H200 (bench/bench_kernels.py --sweep, d=128, bf16; docs/benchmarks.md).
    return TileConfig(128, 64, 4, 3), TileConfig(16, 128, 4, 2)


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(num_programs: int, max_kv_len: int, num_sms: int) -> int:
    """KV splits for the split launch: enough programs to fill the chip, no chunk shorter than
    MIN_SPLIT_TOKENS."""
    if num_programs <= 0:
        return 1
    want = math.ceil(SPLIT_PROGRAMS_PER_SM * num_sms / num_programs)
    cap = max(1, min(MAX_SPLITS, max_kv_len // MIN_SPLIT_TOKENS))
    return max(1, min(want, cap))


def plan_attention(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seq_lens_cpu: Sequence[int] | None = None,
    extend_lens_cpu: Sequence[int] | None = None,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    split_max_tokens: int | None = None,
    num_kv_splits: int | None = None,
    extend_config: TileConfig | None = None,
    split_config: TileConfig | None = None,
) -> AttentionPlan:
    """Plan the attention of one hybrid batch (docs/design/attention.md).

    `seq_lens_cpu`/`extend_lens_cpu` are the same lengths as host ints; without them they are
    read from the device (one sync). Requests with at most `split_max_tokens` new tokens run in
    the split-KV launch (default: as many as fit 64 rows; 0 sends every request to the extend
    launch). `custom_mask` is a flat bool tensor holding, for each request b with
    `mask_indptr[b] >= 0`, a row-major [extend_len, seq_len] block at that offset (True =
    may attend); requests with a negative offset stay causal. Without `mask_indptr` the blocks
    are packed back to back for every request.
    """
    dims = _check_dims(num_q_heads, num_kv_heads, head_dim)
    device = _check_batch(req_to_token, req_pool_indices, seq_lens, extend_lens, extend_start_loc)
    seq_l = _host_lengths("seq_lens", seq_lens, seq_lens_cpu)
    ext_l = _host_lengths("extend_lens", extend_lens, extend_lens_cpu)
    _check_lengths(seq_l, ext_l, req_to_token.shape[1])
    custom_mask, mask_indptr = _check_mask(custom_mask, mask_indptr, seq_l, ext_l, device)
    group = num_q_heads // num_kv_heads
    ext_cfg, split_cfg = _configs(device, head_dim, group, extend_config, split_config)
    if split_max_tokens is None:
        split_max_tokens = max(1, 64 // group)
    is_split = [0 < e <= split_max_tokens for e in ext_l]
    ext = _extend_launch(seq_l, ext_l, is_split, ext_cfg, group, device)
    split, split_rows = _split_launch(
        seq_l, ext_l, is_split, split_cfg, group, num_kv_heads, num_kv_splits, device
    )
    partial_o = partial_lse = None
    if split is not None and split.num_splits > 1:
        n = split_rows.shape[1]
        partial_o = torch.empty(n, num_q_heads, split.num_splits, head_dim, device=device)
        partial_lse = torch.empty(n, num_q_heads, split.num_splits, device=device)
    return AttentionPlan(
        req_to_token, req_pool_indices, seq_lens, extend_lens, extend_start_loc,
        custom_mask, mask_indptr, sum(ext_l), *dims,
        ext, split, split_rows, partial_o, partial_lse,
    )  # fmt: skip


def _check_dims(num_q_heads: int, num_kv_heads: int, head_dim: int) -> tuple[int, int, int]:
    for name, v in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads={num_q_heads} must be a multiple of num_kv_heads={num_kv_heads}"
        )
    if not isinstance(head_dim, int) or head_dim < 16 or head_dim > 512:
        raise ValueError(f"head_dim must be an int in [16, 512], got {head_dim!r}")
    return num_q_heads, num_kv_heads, head_dim


def _check_batch(req_to_token, req_pool_indices, seq_lens, extend_lens, extend_start_loc):
    device = check_tensor("req_to_token", req_to_token, ndim=2, dtypes=(torch.int32,)).device
    if req_to_token.stride(1) != 1:
        raise ValueError("req_to_token must be contiguous in its last dimension")
    b = check_tensor("seq_lens", seq_lens, ndim=1, dtypes=INDEX_DTYPES, device=device).numel()
    for name, t in (
        ("req_pool_indices", req_pool_indices),
        ("extend_lens", extend_lens),
        ("extend_start_loc", extend_start_loc),
    ):
        check_tensor(name, t, ndim=1, dtypes=INDEX_DTYPES, device=device)
        check_shape(name, t, (b,))
    return device


def _host_lengths(name: str, t: torch.Tensor, host: Sequence[int] | None) -> list[int]:
    if host is None:
        return [int(x) for x in t.tolist()]
    values = [int(x) for x in host]
    if len(values) != t.numel():
        raise ValueError(f"{name}_cpu has {len(values)} entries but {name} has {t.numel()}")
    return values


def _check_lengths(seq_l: list[int], ext_l: list[int], max_context: int) -> None:
    for b, (s, e) in enumerate(zip(seq_l, ext_l)):
        if e < 0 or s < e or s > max_context:
            raise ValueError(
                f"request {b}: need 0 <= extend_len <= seq_len <= max_context={max_context}, "
                f"got extend_len={e}, seq_len={s}"
            )


def _check_mask(custom_mask, mask_indptr, seq_l, ext_l, device):
    if custom_mask is None:
        if mask_indptr is not None:
            raise ValueError("mask_indptr was given without custom_mask")
        return None, None
    check_tensor("custom_mask", custom_mask, ndim=1, dtypes=(torch.bool,), device=device)
    if mask_indptr is None:
        sizes = [s * e for s, e in zip(seq_l, ext_l)]
        if custom_mask.numel() != sum(sizes):
            raise ValueError(
                f"custom_mask has {custom_mask.numel()} entries; packed [extend_len, seq_len] "
                f"blocks for this batch need {sum(sizes)}"
            )
        offsets = [0] + list(_cumsum(sizes))[:-1]
        mask_indptr = torch.tensor(offsets, dtype=torch.int64).to(device, non_blocking=True)
    check_tensor("mask_indptr", mask_indptr, ndim=1, dtypes=INDEX_DTYPES, device=device)
    check_shape("mask_indptr", mask_indptr, (len(seq_l),))
    return custom_mask.view(torch.uint8), mask_indptr.to(torch.int64)


def _cumsum(xs: Sequence[int]):
    total = 0
    for x in xs:
        total += x
        yield total


def _configs(device, head_dim, group, ext_cfg, split_cfg) -> tuple[TileConfig, TileConfig]:
    d_ext, d_split = default_configs(device, head_dim)
    ext_cfg = ext_cfg or d_ext
    split_cfg = split_cfg or d_split
    rows = next_pow2(group)
    if ext_cfg.block_m < rows:
        ext_cfg = TileConfig(rows, ext_cfg.block_n, ext_cfg.num_warps, ext_cfg.num_stages)
    return ext_cfg, split_cfg


def _to_device(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """One host-to-device copy for all the tables of a launch (int32 [len(rows), n])."""
    packed = torch.tensor(rows, dtype=torch.int32)
    if device.type == "cuda":
        packed = packed.pin_memory().to(device, non_blocking=True)
    return packed


def _extend_launch(seq_l, ext_l, is_split, cfg: TileConfig, group: int, device):
    per_tile = cfg.block_m // group
    tiles = []  # (work, b, m)
    for b, (s, e) in enumerate(zip(seq_l, ext_l)):
        if e == 0 or is_split[b]:
            continue
        for m in range(0, e, per_tile):
            tiles.append((s - e + min(m + per_tile, e), b, m))
    if not tiles:
        return None
    tiles.sort(key=lambda w: -w[0])  # longest KV range first: a short tail of the grid
    req, tile_m = [t[1] for t in tiles], [t[2] for t in tiles]
    t_req, t_m, t_out = _to_device([req, tile_m, [0] * len(req)], device).unbind(0)
    return Launch(t_req, t_m, t_out, cfg, 1)


def _split_launch(seq_l, ext_l, is_split, cfg, group, num_kv_heads, num_kv_splits, device):
    rows = [b for b in range(len(seq_l)) if is_split[b]]
    if not rows:
        return None, None
    max_e = max(ext_l[b] for b in rows)
    block_m = max(cfg.block_m, next_pow2(group * max_e))
    cfg = TileConfig(block_m, cfg.block_n, cfg.num_warps, cfg.num_stages)
    if num_kv_splits is None:
        max_kv = max(seq_l[b] for b in rows)
        num_kv_splits = choose_num_splits(len(rows) * num_kv_heads, max_kv, _num_sms(device))
    if not isinstance(num_kv_splits, int) or not 1 <= num_kv_splits <= 64:
        raise ValueError(f"num_kv_splits must be an int in [1, 64], got {num_kv_splits!r}")
    outs: list[int] = []
    row_req: list[int] = []
    row_m: list[int] = []
    for b in rows:
        outs.append(len(row_req))
        row_req.extend([b] * ext_l[b])
        row_m.extend(range(ext_l[b]))
    t_req, t_m, t_out = _to_device([rows, [0] * len(rows), outs], device).unbind(0)
    return Launch(t_req, t_m, t_out, cfg, num_kv_splits), _to_device([row_req, row_m], device)
