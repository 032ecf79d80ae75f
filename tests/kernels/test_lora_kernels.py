"""The multi-LoRA shrink/expand kernels against their PyTorch reference (CPU interpreter or
GPU): batches mixing adapters and base tokens, fused projections of 1-3 slices, ranks off
the tile sizes, and the fixed-size layout of a CUDA graph (blocks past num_padded unused)."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import DEVICE, DTYPES, ON_GPU, rel_err, requires_kernels, tolerance

pytest.importorskip("triton", reason="triton is not installed: pip install triton==3.9.0")
pytestmark = requires_kernels

from lmprog.runtime.kernels.lora import lora_expand, lora_shrink  # noqa: E402
from lmprog.runtime.lora.ops import (  # noqa: E402
    LoraBatch,
    lora_delta_ref,
    lora_plan_ref,
    plan_lora_step,
)

# (entry slots, extend lens, in features, slices, rank, block_m): decode-shaped (one token per
# entry, base rows between), a prefill chunk beside decodes, qkv-like (3 slices of unequal
# widths), rank 1 and ranks off the powers of two, a lone base entry among adapters
CASES = [
    ([0, -1, 2, 0, 1, -1, 2], [1] * 7, 32, (48, 16, 16), 8, 16),
    ([1, -1, 1, 3], [9, 1, 1, 20], 40, (24,), 4, 16),
    ([2, 0, -1], [33, 5, 7], 48, (40, 40), 6, 64),
    ([0], [3], 16, (16,), 1, 16),
    ([3, 2, 1, 0, -1], [2, 2, 2, 2, 2], 24, (32, 8, 8), 12, 16),
    ([0, -1, 1, 0], [1, 1, 1, 1], 200, (32, 16, 16), 8, 16),  # K of 4 tiles: split over K
]
if ON_GPU:
    CASES += [
        ([i % 8 for i in range(64)], [1] * 64, 4096, (4096, 1024, 1024), 16, 16),
        ([0, 1, -1, 2], [900, 1, 500, 300], 4096, (14336, 14336), 16, 64),
    ]


def _weights(slots, k, slices, rank, dtype):
    a = torch.randn(slots, len(slices) * rank, k, dtype=dtype, device=DEVICE) * k**-0.5
    b = torch.randn(slots, sum(slices), rank, dtype=dtype, device=DEVICE) * rank**-0.5
    return a, b


@pytest.mark.parametrize("split_k", [None, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_lora_kernels_match_reference(dtype, case, split_k):
    slots_e, ext, k, slices, rank, block_m = case
    plan = plan_lora_step(slots_e, ext, block_m)
    batch = LoraBatch.from_plan(plan, DEVICE, triton=True)
    tokens = sum(ext)
    x = torch.randn(tokens, k, dtype=dtype, device=DEVICE)
    a, b = _weights(4 if max(slots_e) < 4 else 8, k, slices, rank, dtype)
    y0 = torch.randn(tokens, sum(slices), dtype=dtype, device=DEVICE)
    layout = (batch.sorted_ids, batch.block_slots, batch.num_padded, block_m)
    u = lora_shrink(x, a, *layout, split_k=split_k)
    y = lora_expand(u, b, y0.clone(), slices, *layout)
    want = lora_plan_ref(x.float(), y0.float(), a.float(), b.float(), slices, *layout[:2], block_m)
    assert rel_err(y, want) < 4 * tolerance(dtype)
    base = [
        t for t, s in enumerate(torch.tensor(slots_e).repeat_interleave(torch.tensor(ext))) if s < 0
    ]
    assert torch.equal(y[base], y0[base])  # the base model's rows are untouched


def test_split_k_is_deterministic_and_equal():
    """The partial sums over K are added in order: the same bits every run, and the same
    result (up to rounding) for any split."""
    dtype = DTYPES[0]
    plan = plan_lora_step([0, 1, -1, 0], [1, 1, 1, 1], 16)
    batch = LoraBatch.from_plan(plan, DEVICE, triton=True)
    layout = (batch.sorted_ids, batch.block_slots, batch.num_padded, 16)
    x = torch.randn(4, 256, dtype=dtype, device=DEVICE)
    a, b = _weights(2, 256, (32,), 8, dtype)
    y0 = torch.randn(4, 32, dtype=dtype, device=DEVICE)
    runs = [lora_expand(lora_shrink(x, a, *layout, split_k=s), b, y0.clone(), (32,), *layout)
            for s in (4, 4, 1)]  # fmt: skip
    assert torch.equal(runs[0], runs[1])
    assert rel_err(runs[0], runs[2]) < 4 * tolerance(dtype)


def test_layout_groups_tokens_by_slot():
    plan = plan_lora_step([2, -1, 0, 2], [3, 2, 5, 3], block_m=16)
    assert plan.segments == ((0, 0, 5), (2, 16, 6))
    assert plan.sorted_ids[:5].tolist() == [5, 6, 7, 8, 9]
    assert plan.sorted_ids[16:22].tolist() == [0, 1, 2, 10, 11, 12]
    assert set(plan.sorted_ids[5:16].tolist()) == set(plan.sorted_ids[22:].tolist()) == {13}
    assert plan.block_slots.tolist() == [0, 2]
    assert plan_lora_step([-1, -1], [4, 1]) is None


def test_fixed_size_layout_ignores_unused_blocks():
    """A CUDA graph's buffers are longer than the step's layout: blocks past num_padded hold
    stale ids and slots, and must not be read."""
    dtype = DTYPES[0]
    plan = plan_lora_step([1, 0, -1], [1, 1, 1], 16)
    tokens, k, slices, rank = 3, 32, (16,), 4
    ids = torch.full((96,), 0, dtype=torch.int32, device=DEVICE)  # stale: token 0, slot 3
    ids[: plan.num_padded] = torch.from_numpy(plan.sorted_ids).to(DEVICE)
    block_slots = torch.full((6,), 3, dtype=torch.int32, device=DEVICE)
    block_slots[: len(plan.block_slots)] = torch.from_numpy(plan.block_slots).to(DEVICE)
    num = torch.tensor([plan.num_padded], dtype=torch.int32, device=DEVICE)
    x = torch.randn(tokens, k, dtype=dtype, device=DEVICE)
    a, b = _weights(4, k, slices, rank, dtype)
    y0 = torch.randn(tokens, 16, dtype=dtype, device=DEVICE)
    u = lora_shrink(x, a, ids, block_slots, num, 16)
    y = lora_expand(u, b, y0.clone(), slices, ids, block_slots, num, 16)
    segs = [(s, torch.tensor([t], device=DEVICE)) for t, s in ((0, 1), (1, 0))]
    want = lora_delta_ref(x.float(), y0.float(), a.float(), b.float(), slices, segs)
    assert rel_err(y, want) < 4 * tolerance(dtype)


def test_wrappers_reject_bad_layouts():
    dtype = DTYPES[0]
    x = torch.randn(4, 16, dtype=dtype, device=DEVICE)
    a, b = _weights(2, 16, (16,), 4, dtype)
    ids = torch.zeros(16, dtype=torch.int32, device=DEVICE)
    slots = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    num = torch.ones(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="block_m"):
        lora_shrink(x, a, ids, slots, num, 12)
    with pytest.raises(ValueError, match="one slot per block"):
        lora_shrink(x, a, ids, torch.zeros(2, dtype=torch.int32, device=DEVICE), num, 16)
    with pytest.raises(TypeError, match="int32"):
        lora_shrink(x, a, ids.long(), slots, num, 16)
    u = lora_shrink(x, a, ids, slots, num, 16)
    with pytest.raises(ValueError, match="columns"):
        lora_expand(u, b, torch.zeros(4, 16, dtype=dtype, device=DEVICE), (8, 8), ids, slots,
                    num, 16)  # fmt: skip
    with pytest.raises(ValueError, match="slices"):
        lora_expand(u, b, torch.zeros(4, 16, dtype=dtype, device=DEVICE), (4, 4, 4, 4), ids,
                    slots, num, 16)  # fmt: skip
