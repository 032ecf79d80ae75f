"""The fused mixture-of-experts kernel against its PyTorch reference (CPU interpreter or GPU)."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import DEVICE, DTYPES, ON_GPU, rel_err, requires_kernels, tolerance

pytest.importorskip("triton", reason="triton is not installed: pip install triton==3.9.0")
pytestmark = requires_kernels

from lmprog.runtime.kernels.moe import fused_moe, moe_align  # noqa: E402
from lmprog.runtime.kernels.moe_ref import fused_moe_ref, moe_align_ref  # noqa: E402

# (tokens, experts, top_k, hidden, intermediate): decode-sized (BLOCK_M 16), k = 1 (no sum),
# sizes off the tile multiples, ~20 rows per expert (BLOCK_M 32), ~70 (BLOCK_M 64)
SHAPES = [(1, 4, 2, 32, 48), (5, 4, 1, 32, 32), (7, 8, 3, 80, 40), (40, 4, 2, 32, 48),
          (70, 2, 2, 48, 32)]  # fmt: skip
if ON_GPU:
    SHAPES += [(1, 8, 2, 4096, 14336), (64, 8, 2, 4096, 1024), (512, 64, 6, 2048, 1408)]


def _inputs(tokens, experts, top_k, hidden, inter, dtype, skew=False):
    x = torch.randn(tokens, hidden, dtype=dtype, device=DEVICE)
    w13 = torch.randn(experts, 2 * inter, hidden, dtype=dtype, device=DEVICE) * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, dtype=dtype, device=DEVICE) * inter**-0.5
    logits = torch.randn(tokens, experts, device=DEVICE)
    if skew:  # most tokens to expert 0: one expert spans several blocks, others are empty
        logits[:, 0] += 10
    weights, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return x, w13, w2, weights.contiguous(), ids.to(torch.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_moe_matches_reference(dtype, shape):
    x, w13, w2, weights, ids = _inputs(*shape, dtype)
    out = fused_moe(x, w13, w2, weights, ids, out=torch.full_like(x, float("nan")))
    assert rel_err(out, fused_moe_ref(x, w13, w2, weights, ids)) < tolerance(dtype)


def test_explicit_tile_config():
    x, w13, w2, weights, ids = _inputs(9, 4, 2, 48, 40, DTYPES[0])
    cfg = dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=32, GROUP_M=2, num_warps=2, num_stages=2)
    out = fused_moe(x, w13, w2, weights, ids, config=cfg)
    assert rel_err(out, fused_moe_ref(x, w13, w2, weights, ids)) < tolerance(DTYPES[0])
    with pytest.raises(ValueError, match="power of two"):
        fused_moe(x, w13, w2, weights, ids, config={**cfg, "BLOCK_N": 24})
    with pytest.raises(ValueError, match="exactly the keys"):
        fused_moe(x, w13, w2, weights, ids, config={"BLOCK_M": 16})


def test_skewed_routing_and_int64_ids():
    x, w13, w2, weights, ids = _inputs(37, 6, 2, 32, 48, DTYPES[0], skew=True)
    assert (ids == 0).sum() == 37  # expert 0 has every token: 37 rows over 3 blocks of 16
    out = fused_moe(x, w13, w2, weights, ids.long())
    assert rel_err(out, fused_moe_ref(x, w13, w2, weights, ids)) < tolerance(DTYPES[0])


ALIGN = [
    (3, 4, 2, 4),
    (9, 3, 3, 16),
    (1, 8, 2, 16),
    (300, 5, 2, 16),
    (70, 64, 6, 32),
    (2100, 4, 2, 64),
]


@pytest.mark.parametrize("tokens,experts,top_k,block", ALIGN)
def test_moe_align_groups_rows_by_expert_in_padded_blocks(tokens, experts, top_k, block):
    ids = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)]).to(DEVICE)
    sorted_ids, block_experts, num_padded = moe_align(ids, experts, block)
    for got, want in zip(
        (sorted_ids, block_experts, num_padded), moe_align_ref(ids, experts, block)
    ):
        assert torch.equal(got, want)
    n = tokens * top_k
    assert sorted_ids.numel() == n + min(experts, n) * (block - 1)
    flat = ids.flatten().cpu()
    used = int(num_padded.item())
    assert used % block == 0 and (sorted_ids[used:] == n).all()
    real = sorted_ids[:used].cpu()
    assert sorted(real[real < n].tolist()) == list(range(n))  # every row once
    for b in range(used // block):
        rows = real[b * block : (b + 1) * block]
        rows = rows[rows < n]
        assert len(rows) > 0  # no block is all padding
        assert (flat[rows.long()] == block_experts[b].item()).all()
        assert rows.tolist() == sorted(rows.tolist())  # token order within an expert
    counts = torch.bincount(flat, minlength=experts)
    assert used == int(((counts + block - 1) // block * block).sum())


def test_empty_batch_and_argument_errors():
    dtype = DTYPES[0]
    x, w13, w2, weights, ids = _inputs(3, 4, 2, 32, 48, dtype)
    assert fused_moe(x[:0], w13, w2, weights[:0], ids[:0]).shape == (0, 32)
    with pytest.raises(ValueError, match="w13 must be"):
        fused_moe(x, w13[:, :, :16], w2, weights, ids)
    with pytest.raises(ValueError, match="w2 must be"):
        fused_moe(x, w13, w2[:, :, :8], weights, ids)
    with pytest.raises(ValueError, match="T = x's 3"):
        fused_moe(x, w13, w2, weights[:2], ids[:2])
    with pytest.raises(ValueError, match="k must be in"):
        wide = torch.zeros(3, 5, dtype=torch.int32, device=DEVICE)
        fused_moe(x, w13, w2, torch.ones(3, 5, device=DEVICE), wide)
    with pytest.raises(TypeError, match="w13 must have dtype"):
        fused_moe(x, w13.double(), w2, weights, ids)
    with pytest.raises(TypeError, match="topk_ids must have dtype"):
        fused_moe(x, w13, w2, weights, ids.float())
    with pytest.raises(ValueError, match="contiguous in its last"):
        fused_moe(x.t().contiguous().t(), w13, w2, weights, ids)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_fused_moe_replays_in_a_cuda_graph_with_new_routing():
    dtype = torch.bfloat16
    x, w13, w2, weights, ids = _inputs(24, 8, 2, 256, 512, dtype)
    out = fused_moe(x, w13, w2, weights, ids)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, weights, ids)
    _, _, _, new_weights, new_ids = _inputs(24, 8, 2, 256, 512, dtype, skew=True)
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    graph.replay()
    assert rel_err(out, fused_moe_ref(x, w13, w2, weights, ids)) < tolerance(dtype)
