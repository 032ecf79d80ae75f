"""The low-rank products of a whole batch, each token under its own adapter (or none).

`plan_lora_step` groups a step's tokens by adapter slot (built on the host);
`lora_delta_ref` computes shrink and expand in PyTorch (the CPU path and the Triton
kernels' reference). Layout: docs/design/lora.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class LoraStepPlan:
    """A step's adapter layout as host arrays (what ModelRunner hands to the device).

    sorted_ids int32 [L]: the adapter tokens grouped by slot, each group padded to a
        multiple of block_m with num_tokens. block_slots int32 [L / block_m]: each block's
        slot. segments: (slot, first, count) per group: sorted_ids[first:first+count].
        entry_slots int64 [entries]: each entry's slot (-1: base), what it was planned from
        (the other ranks of a tensor-parallel group plan the same step from it).
    """

    sorted_ids: np.ndarray
    block_slots: np.ndarray
    block_m: int
    num_tokens: int
    segments: tuple[tuple[int, int, int], ...]
    entry_slots: np.ndarray

    @property
    def num_padded(self) -> int:
        return len(self.sorted_ids)


def choose_block_m(num_tokens: int, num_segments: int) -> int:
    """Rows per block: 16 when each adapter has a few tokens (decode), else 64."""
    return 16 if num_tokens <= 32 * max(1, num_segments) else 64


def plan_lora_step(
    entry_slots: Sequence[int] | np.ndarray,
    extend_lens: Sequence[int] | np.ndarray,
    block_m: int | None = None,
) -> LoraStepPlan | None:
    """The layout for a step whose entry e feeds extend_lens[e] consecutive tokens under pool
    slot entry_slots[e] (-1: the base model). None when no token has an adapter."""
    slots_e = np.asarray(entry_slots, dtype=np.int64)
    if not len(slots_e) or slots_e.max() < 0:
        return None
    ext = np.asarray(extend_lens, dtype=np.int64)
    per_token = np.repeat(slots_e, ext)
    num_tokens = len(per_token)
    adapted = np.flatnonzero(per_token >= 0)
    order = adapted[np.argsort(per_token[adapted], kind="stable")]
    uniq, first, counts = np.unique(per_token[order], return_index=True, return_counts=True)
    bm = block_m if block_m is not None else choose_block_m(len(order), len(uniq))
    padded = -(-counts // bm) * bm
    dest = np.cumsum(padded) - padded
    sorted_ids = np.full(int(padded.sum()), num_tokens, dtype=np.int32)
    group = np.repeat(np.arange(len(uniq)), counts)
    sorted_ids[dest[group] + np.arange(len(order)) - first[group]] = order
    block_slots = np.repeat(uniq, padded // bm).astype(np.int32)
    segments = tuple((int(s), int(d), int(c)) for s, d, c in zip(uniq, dest, counts))
    return LoraStepPlan(sorted_ids, block_slots, bm, num_tokens, segments, slots_e)


@dataclass
class LoraBatch:
    """A step's layout on the model's device: what every LoRA layer of the forward reads.

    sorted_ids int32 [L], block_slots int32 [L / block_m], num_padded int32 [1] (blocks
    from num_padded on are unused: CUDA graphs keep L fixed and change num_padded).
    segments: (slot, token rows int64) per adapter, for the PyTorch path (None in graphs).
    triton: whether the layers run the Triton kernels (else lora_delta_ref)."""

    sorted_ids: torch.Tensor
    block_slots: torch.Tensor
    num_padded: torch.Tensor
    block_m: int
    segments: tuple[tuple[int, torch.Tensor], ...] | None
    triton: bool

    @classmethod
    def from_plan(cls, plan: LoraStepPlan, device: torch.device, triton: bool) -> LoraBatch:
        host = np.concatenate([plan.sorted_ids, plan.block_slots, [plan.num_padded]])
        t = torch.from_numpy(host.astype(np.int32))
        if device.type != "cpu":
            t = t.pin_memory().to(device, non_blocking=True)
        n, nb = len(plan.sorted_ids), len(plan.block_slots)
        ids, slots, num = t.split([n, nb, 1])
        segments = None
        if not triton:
            ids64 = ids.long()
            segments = tuple((s, ids64[d : d + c]) for s, d, c in plan.segments)
        return cls(ids, slots, num, plan.block_m, segments, triton)


def lora_delta_ref(
    x: torch.Tensor,
    y: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    slices: Sequence[int],
    segments: Sequence[tuple[int, torch.Tensor]],
) -> torch.Tensor:
    """y += each token's low-rank update, in place; returns y.

    x [T, in]; y [T, out] (the base projection's output); lora_a [S, n*R, in]; lora_b
    [S, out, R] (scale folded in); slices: the n output widths (sum out); segments: (slot,
    token rows) per adapter. Products in x's dtype, as the kernels' inputs are."""
    rank = lora_b.shape[2]
    bounds = np.cumsum([0, *slices]).tolist()
    for slot, rows in segments:
        xs = x.index_select(0, rows)
        u = xs @ lora_a[slot].T  # [m, n*R]
        parts = [
            u[:, j * rank : (j + 1) * rank] @ lora_b[slot, bounds[j] : bounds[j + 1]].T
            for j in range(len(slices))
        ]
        delta = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        y.index_add_(0, rows, delta.to(y.dtype))
    return y


def lora_plan_ref(
    x: torch.Tensor,
    y: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    slices: Sequence[int],
    sorted_ids: torch.Tensor,
    block_slots: torch.Tensor,
    block_m: int,
) -> torch.Tensor:
    """lora_delta_ref over the kernels' aligned layout (reads it on the host): the kernel
    tests' reference."""
    ids = sorted_ids.tolist()
    segments: dict[int, list[int]] = {}
    for b, slot in enumerate(block_slots.tolist()):
        rows = [i for i in ids[b * block_m : (b + 1) * block_m] if i < x.shape[0]]
        segments.setdefault(slot, []).extend(rows)
    segs = [(s, torch.tensor(r, dtype=torch.int64, device=x.device)) for s, r in segments.items()]
    return lora_delta_ref(x, y, lora_a, lora_b, slices, segs)
