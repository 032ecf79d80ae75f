"""Matmuls of at most 16 rows (decode steps) over 16-bit or e4m3 weights, tile sizes as
arguments.

    small_m_matmul(x, w, bias=None, w_scale=None, config=SmallMConfig(), counters=None) -> y

Streams weights against one 16-row tile of x, with deterministic split-K for shapes with
few column blocks; launches sharing `counters` must not run concurrently. Graph-capturable.
Design: docs/design/quantization.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._checks import check_runnable, check_tensor, dynamic_args
from .fp8_ref import FP8

SMALL_M = 16  # the rows of one MMA tile: at most this many rows per call
SMEM_BYTES = 227 * 1024  # shared memory one block may use on the H100/H200
WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # fp32: tests (interpreter)


@dataclass(frozen=True)
class SmallMConfig:
    """One launch of the kernel: BLOCK_N output columns and BLOCK_K inputs per step,
    split_k programs per column block, num_warps, num_stages (the pipeline's depth)."""

    block_n: int = 32
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps"):
            v = getattr(self, name)
            low = 1 if name == "num_warps" else 16
            if not isinstance(v, int) or v < low or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= {low}, got {v!r}")
        for name in ("split_k", "num_stages"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")

    def shared_bytes(self, itemsize: int) -> int:
        """An upper bound of the shared memory the pipeline holds: num_stages x and w tiles."""
        return self.num_stages * (SMALL_M + self.block_n) * self.block_k * itemsize

    def fits(self, itemsize: int = 2) -> bool:
        return self.shared_bytes(itemsize) <= SMEM_BYTES

    def new_counters(self, n: int, device: torch.device | str) -> torch.Tensor:
        """The zeroed split-K counters of an N-column layer (empty without split-K)."""
        tiles = triton.cdiv(n, self.block_n) if self.split_k > 1 else 0
        return torch.zeros(tiles, dtype=torch.int32, device=device)

    @property
    def label(self) -> str:
        return (f"n{self.block_n} k{self.block_k} split{self.split_k} "
                f"w{self.num_warps} s{self.num_stages}")  # fmt: skip


def candidate_configs(n: int, k: int, sms: int, *, fp8: bool = False) -> list[SmallMConfig]:
    """The configs start-up timing tries for an [N, K] weight (16-bit, or e4m3 with `fp8`) on
    a GPU of `sms` SMs (each fits the shared memory): a few tile shapes, and split-K where the
    column blocks alone give the SMs few programs."""
    configs = [
        SmallMConfig(32, 256),
        SmallMConfig(16, 512),
        SmallMConfig(64, 256),
        SmallMConfig(64, 128, num_stages=6),
    ]
    blocks_k = triton.cdiv(k, 256)
    if triton.cdiv(n, 32) < 4 * sms:
        configs += [SmallMConfig(32, 256, split) for split in (2, 4) if blocks_k >= 2 * split]
    if fp8:  # a byte a weight: twice the K per step in the same shared memory
        configs += [SmallMConfig(32, 512)]
        if triton.cdiv(n, 32) < 4 * sms and triton.cdiv(k, 512) >= 4:
            configs += [SmallMConfig(32, 512, 2)]
    return configs


def _split_length(k: int, config: SmallMConfig) -> int:
    """The K range of one split: whole BLOCK_K blocks, split_k of them covering K."""
    blocks = triton.cdiv(k, config.block_k)
    return triton.cdiv(blocks, config.split_k) * config.block_k


def small_m_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    w_scale: torch.Tensor | None = None,
    config: SmallMConfig = SmallMConfig(),
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = x @ w^T (+ bias) for x [M <= 16, K] and w [N, K] of one dtype; y [M, N] in it.
    counters (split_k > 1): int32 zeros, at least one per BLOCK_N columns, left zero (made
    here when None: a memset each call)."""
    check_tensor("x", x, ndim=2, dtypes=WEIGHT_DTYPES)
    check_runnable("x", x)
    check_tensor("w", w, ndim=2, dtypes=(x.dtype, FP8), device=x.device)
    m, k = x.shape
    n = w.shape[0]
    fp8 = w.dtype == FP8
    if fp8 != (w_scale is not None):
        raise ValueError("w_scale goes with e4m3 weights (and only with them)")
    if w_scale is not None:  # fp8
        check_tensor("w_scale", w_scale, ndim=1, dtypes=(torch.float32,), device=x.device)
        if w_scale.shape[0] != n or not w_scale.is_contiguous():
            raise ValueError(f"w_scale must be a contiguous [{n}], got {tuple(w_scale.shape)}")
    if m > SMALL_M or w.shape[1] != k:
        raise ValueError(
            f"x [M <= {SMALL_M}, K] and w [N, K] expected, got {tuple(x.shape)}, {tuple(w.shape)}"
        )
    if x.stride(1) != 1 or not w.is_contiguous():
        raise ValueError("x must be contiguous in its last dimension and w contiguous")
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=(x.dtype,), device=x.device)
        if bias.shape[0] != n or not bias.is_contiguous():
            raise ValueError(f"bias must be a contiguous [{n}], got {tuple(bias.shape)}")
    if not config.fits(x.element_size()):
        raise ValueError(f"config {config.label} needs more than {SMEM_BYTES} B shared memory")
    tiles_n = triton.cdiv(n, config.block_n)
    split = config.split_k > 1
    if split:
        if counters is None:
            counters = config.new_counters(n, x.device)
        check_tensor("counters", counters, ndim=1, dtypes=(torch.int32,), device=x.device)
        if counters.shape[0] < tiles_n:
            raise ValueError(f"counters needs {tiles_n} elements, got {counters.shape[0]}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    k_split = _split_length(k, config)
    partials = y  # unused without split-K
    if split:
        partials = torch.empty((config.split_k, m, n), dtype=torch.float32, device=x.device)
    _small_m_kernel[(tiles_n * config.split_k,)](
        x, w, bias if bias is not None else y, w_scale if fp8 else y, y, partials,
        counters if split else y, m, n, k, x.stride(0), k_split,
        HAS_BIAS=bias is not None, W_FP8=fp8, SPLIT_K=config.split_k, EVEN_K=k % config.block_k == 0,
        BLOCK_M=SMALL_M, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return y


@triton.jit(**dynamic_args("m"))
def _small_m_kernel(
    X, W, Bias, Ws, Y, Partials, Counters, m, n, k, stride_x, k_split,
    HAS_BIAS: tl.constexpr, W_FP8: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    pid_n = pid // SPLIT_K
    split = pid % SPLIT_K
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < m
    n_ok = offs_n < n
    cols = tl.where(n_ok, offs_n, 0).to(tl.int64)  # columns past n read row 0, never stored
    k_lo = split * k_split
    k_hi = tl.minimum(k_lo + k_split, k)
    x_ptrs = X + offs_m[:, None].to(tl.int64) * stride_x + (k_lo + offs_k)[None, :]
    w_ptrs = W + cols[None, :] * k + (k_lo + offs_k)[:, None]  # w^T tile [BLOCK_K, BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:  # every block whole: only x's rows masked in the loop
            xb = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            wb = tl.load(w_ptrs)
        else:
            k_ok = k0 + offs_k < k_hi
            xb = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            wb = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
        if W_FP8:
            wb = wb.to(xb.dtype)
        acc = tl.dot(xb, wb, acc, input_precision="ieee")
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out = offs_m[:, None].to(tl.int64) * n + offs_n[None, :]
    out_ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K == 1:
        _store(Y, Bias, Ws, acc, out, out_ok, offs_n, n_ok, HAS_BIAS, W_FP8)
    else:
        mn = m.to(tl.int64) * n
        tl.store(Partials + split * mn + out, acc, mask=out_ok)
        tl.debug_barrier()  # every thread's partial written before the release below
        arrived = tl.atomic_add(Counters + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:  # the last split of this column block: sum in split order
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                part = tl.load(Partials + s * mn + out, mask=out_ok, other=0.0,
                               cache_modifier=".cg")  # fmt: skip
                total += part
            _store(Y, Bias, Ws, total, out, out_ok, offs_n, n_ok, HAS_BIAS, W_FP8)
            tl.store(Counters + pid_n, 0)  # ready for the next launch


@triton.jit
def _store(Y, Bias, Ws, acc, out, out_ok, offs_n, n_ok, HAS_BIAS: tl.constexpr,
           W_FP8: tl.constexpr):  # fmt: skip
    if W_FP8:
        acc *= tl.load(Ws + offs_n, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(Bias + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + out, acc.to(Y.dtype.element_ty), mask=out_ok)


__all__ = ["SMALL_M", "SmallMConfig", "candidate_configs", "small_m_matmul"]
