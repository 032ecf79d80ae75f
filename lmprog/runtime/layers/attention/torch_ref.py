"""Plain-PyTorch attention over the paged KV pool: the reference, and the CPU path.

Decodes run as one batched SDPA over gathered K/V; prefill chunks and verifies run alone
with an offset-causal or custom mask; GQA without repeating K/V; sliding windows (Gemma 3),
FP8 pools and latent attention supported. Design: docs/design/attention.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ...executor.kv_pool import dequantize_kv
from .base import AttentionBackend

if TYPE_CHECKING:
    from ...executor.forward_batch import ForwardBatch
    from ...executor.kv_pool import KVPool


@dataclass(frozen=True)
class _DecodeGroup:
    rows: torch.Tensor | None  # token rows of the group in q; None = all rows, in order
    slots: torch.Tensor  # [B * L_max] pool slots, padding -> slot 0
    mask: torch.Tensor | None  # bool [B, 1, 1, L_max]; None when no padding
    max_len: int
    first_slot: int | None = None  # B == 1 with slots first..first+L-1: read a view, no gather
    window_mask: torch.Tensor | None = None  # the sliding layers' mask (`mask` if no key is old)


@dataclass(frozen=True)
class _Extend:
    start: int  # first token row
    num_new: int
    slots: torch.Tensor  # [L] the request's slots, prefix first
    mask: torch.Tensor  # bool [G * n, L], already repeated over the G folded heads
    window_mask: torch.Tensor | None = None  # the sliding layers' mask, the same shape


@dataclass(frozen=True)
class TorchPlan:
    decode: _DecodeGroup | None
    extends: tuple[_Extend, ...]


class TorchAttentionBackend(AttentionBackend):
    """Reference backend: SDPA per step on gathered K/V; any device, any dtype."""

    window: int | None = None
    sliding_layers: frozenset[int] = frozenset()

    def set_sliding_window(self, window: int, layers: Iterable[int]) -> None:
        """Make each of `layers` attend only to the last `window` positions (its own
        included: key position p is seen from query position q iff q - window < p <= q)."""
        if window <= 0:
            raise ValueError(f"sliding window must be positive, got {window}")
        self.window, self.sliding_layers = window, frozenset(layers)

    def plan(self, batch: ForwardBatch) -> TorchPlan:
        lens, ext = batch.host_lens()
        offsets = batch.mask_offsets()  # None: causal; -1: this request is causal
        mask_offsets = [-1] * len(ext) if offsets is None else offsets
        single = [i for i, n in enumerate(ext) if n == 1 and mask_offsets[i] < 0]
        decode = self._decode_group(batch, single, lens) if single else None
        starts = _offsets(ext)
        is_single = set(single)
        extends = tuple(
            self._extend(batch, i, starts[i], ext[i], lens[i], mask_offsets[i])
            for i in range(len(ext))
            if i not in is_single
        )
        return TorchPlan(decode, extends)

    def _decode_group(
        self, batch: ForwardBatch, members: list[int], lens: list[int]
    ) -> _DecodeGroup:
        group_lens = [lens[i] for i in members]
        max_len = max(group_lens)
        dev = batch.req_to_token.device
        everyone = len(members) == batch.batch_size
        idx = batch.req_pool_indices if everyone else batch.req_pool_indices[members]
        slots = batch.req_to_token[idx, :max_len]
        mask = None
        if min(group_lens) != max_len:
            seq = batch.seq_lens if everyone else batch.seq_lens[members]
            valid = torch.arange(max_len, device=dev)[None, :] < seq[:, None]
            slots = torch.where(valid, slots, 0)
            mask = valid[:, None, None, :]
        rows = None if everyone else batch.extend_start_loc[members]
        window_mask = mask
        if self.window is not None and max_len > self.window:
            seq = batch.seq_lens if everyone else batch.seq_lens[members]
            keys = torch.arange(max_len, device=dev)[None, :]
            valid = (keys < seq[:, None]) & (keys >= seq[:, None] - self.window)
            window_mask = valid[:, None, None, :]
        first = _contiguous_from(slots)
        return _DecodeGroup(rows, slots.reshape(-1), mask, max_len, first, window_mask)

    def _extend(
        self, batch: ForwardBatch, i: int, start: int, n: int, seq_len: int, mask_offset: int
    ) -> _Extend:
        dev = batch.req_to_token.device
        row = batch.req_pool_indices[i : i + 1]  # a tensor: no device sync
        slots = batch.req_to_token.index_select(0, row)[0, :seq_len]
        if batch.custom_mask is None or mask_offset < 0:  # new token i at index prefix + i
            keys = torch.arange(seq_len, device=dev)
            mask = keys[None, :] <= torch.arange(seq_len - n, seq_len, device=dev)[:, None]
        else:
            mask = batch.custom_mask[mask_offset : mask_offset + n * seq_len].view(n, seq_len)
        group = self.num_heads // self.num_kv_heads
        window_mask = None
        if self.window is not None and seq_len > self.window:
            # positions: the cached prefix's keys sit at their index, the new tokens where the
            # batch puts them (a verify tree's drafts share positions)
            new_pos = batch.positions[start : start + n]
            key_pos = torch.cat([torch.arange(seq_len - n, device=dev), new_pos])
            window_mask = mask & (new_pos[:, None] - key_pos[None, :] < self.window)
            window_mask = window_mask[None].expand(group, n, seq_len).reshape(group * n, seq_len)
        mask = mask[None].expand(group, n, seq_len).reshape(group * n, seq_len)
        return _Extend(start, n, slots, mask, mask if window_mask is None else window_mask)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: int,
        kv: KVPool,
        plan: TorchPlan,
    ) -> torch.Tensor:
        k_cache, v_cache = kv.k[layer], kv.v[layer]
        d = plan.decode
        sliding = layer in self.sliding_layers
        scales = kv.scales(layer)  # an FP8 pool's; its rows are upcast once gathered
        if d is not None and d.rows is None:  # decode-only step: no scatter
            return self._decode(q, k_cache, v_cache, d, sliding, scales)
        out = q.new_empty(q.shape[0], self.num_heads, self.head_dim)
        if d is not None:
            out[d.rows] = self._decode(q[d.rows], k_cache, v_cache, d, sliding, scales)
        for e in plan.extends:
            out[e.start : e.start + e.num_new] = self._extend_attend(
                q[e.start : e.start + e.num_new], k_cache, v_cache, e, sliding, scales
            )
        return out

    def _decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        d: _DecodeGroup,
        sliding: bool = False,
        scales: tuple[float, float] = (1.0, 1.0),
    ) -> torch.Tensor:
        b, hkv = q.shape[0], self.num_kv_heads
        if d.first_slot is not None:
            k = k_cache[d.first_slot : d.first_slot + d.max_len]
            v = v_cache[d.first_slot : d.first_slot + d.max_len]
        else:
            k, v = k_cache.index_select(0, d.slots), v_cache.index_select(0, d.slots)
        k, v = dequantize_kv(k, scales[0], q.dtype), dequantize_kv(v, scales[1], q.dtype)
        k = k.reshape(b, d.max_len, hkv, -1).transpose(1, 2)
        v = v.reshape(b, d.max_len, hkv, -1).transpose(1, 2)
        qg = q.view(b, hkv, -1, q.shape[-1])  # n = 1: the G heads of a KV head are "queries"
        mask = d.window_mask if sliding else d.mask
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=self.scale)
        return o.reshape(b, self.num_heads, self.head_dim)

    def _extend_attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        e: _Extend,
        sliding: bool = False,
        scales: tuple[float, float] = (1.0, 1.0),
    ) -> torch.Tensor:
        n, hkv, dim = e.num_new, self.num_kv_heads, q.shape[-1]
        group = self.num_heads // hkv
        k = k_cache.index_select(0, e.slots).transpose(0, 1)  # [Hkv, L, D]
        v = v_cache.index_select(0, e.slots).transpose(0, 1)
        k, v = dequantize_kv(k, scales[0], q.dtype), dequantize_kv(v, scales[1], q.dtype)
        qg = q.view(n, hkv, group, dim).permute(1, 2, 0, 3).reshape(hkv, group * n, dim)
        mask = e.window_mask if sliding else e.mask
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=self.scale)
        o = o.view(hkv, group, n, self.head_dim).permute(2, 0, 1, 3)
        return o.reshape(n, self.num_heads, self.head_dim)


def _contiguous_from(slots: torch.Tensor) -> int | None:
    """The first slot when a lone CPU request's slots run consecutively (the usual batch-1
    decode: the allocator hands out consecutive slots), else None. Never syncs a GPU."""
    if slots.shape[0] != 1 or slots.device.type != "cpu":
        return None
    first = int(slots[0, 0])
    run = torch.arange(first, first + slots.shape[1], dtype=slots.dtype)
    return first if torch.equal(slots[0], run) else None


def _offsets(sizes: list[int]) -> list[int]:
    """Exclusive prefix sums: where each request's block starts."""
    return [0, *itertools.accumulate(sizes)][:-1]
