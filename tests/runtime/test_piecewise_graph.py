"""Piecewise CUDA graphs (lmprog.runtime.executor.piecewise_graph): prefill chunks, mixed
prefill + decode steps and verify rows replayed through token-bucketed segments give the
eager forward's logits and K/V, padding included.

The segmented, padded forward runs on the CPU under Triton's interpreter (tests/conftest.py
sets it up); capture and replay need CUDA.
"""

import pytest
import torch
from triton_testing import (  # noqa: F401 - one_thread is a fixture
    capture_against_eager,
    one_thread,
    requires_triton,
    run_captured,
    run_uncaptured,
    setup,
)

from lmprog.runtime.draft_tree import depths, mask_block
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.piecewise_graph import PiecewiseGraphRunner
from lmprog.runtime.models.llama import HiddenCapture

# EAGLE-3's layer states (the embedding, a middle layer, the stream leaving the last layer)
# and Medusa's final norm at the logits rows
HEADS = [HiddenCapture((0, 2, 3)), HiddenCapture(())]
TREE = (-1, -1, 0, 2)  # the token tree of the last step's verify entry


def check_against_eager(device, capture, dtype, tol, moe=False, hidden=None):
    """Tiny Llama, 6 requests in a 64-wide table: a prefill of several chunks, then mixed
    steps (chunks + decodes + a 3-token verify row) of shrinking and growing token counts
    inside and across buckets, one step larger than the biggest bucket (eager fallback),
    and a token-tree verify entry beside a causal one (a custom mask). hidden: graphs for a
    draft head, whose states (maybe_run_capture) must equal forward_capture's, and stay as
    they were after the next replay (a copy)."""
    model, g, table, kvs = setup(device, dtype, num_layers=3, rows=6, num_slots=500, moe=moe)
    rows = table.shape[0]
    done = [0] * rows  # tokens whose K/V are in the pool

    def batch(sel, ext, logits_rows, tree=None):
        """tree: request sel[0] verifies its pending token and a token tree of these parents."""
        loc = torch.cat([table[r, done[r] : done[r] + n].cpu() for r, n in zip(sel, ext)])
        lens = [done[r] + n for r, n in zip(sel, ext)]
        positions = [p for r, n in zip(sel, ext) for p in range(done[r], done[r] + n)]
        mask = indptr = None
        if tree is not None:
            assert ext[0] == 1 + len(tree)
            positions[1 : ext[0]] = [done[sel[0]] + 1 + d for d in depths(tree)]
            mask = torch.from_numpy(mask_block(1, tree, lens[0]).reshape(-1))
            indptr = [0] + [-1] * (len(sel) - 1)
        return ForwardBatch.build(
            input_ids=torch.randint(0, 50, (len(loc),), generator=g),
            out_cache_loc=loc,
            req_pool_indices=sel,
            seq_lens=lens,
            extend_lens=ext,
            req_to_token=table,
            device=device,
            positions=positions,
            logits_indices=logits_rows,
            custom_mask=mask,
            mask_indptr=indptr,
        )

    with torch.inference_mode():
        graphs = PiecewiseGraphRunner(
            model,
            kvs[0],
            table,
            max_tokens=40,
            buckets=(8, 16, 32),
            capture=capture,
            hidden=hidden,
        )
        assert graphs.token_buckets == (8, 16, 32, 40)
        served = []
        kept = None  # (a step's hidden states, a copy of them)
        steps = [
            ([0, 1, 2], [12, 7, 9], None),
            ([0, 1, 2, 3], [1, 1, 5, 20], None),
            ([3, 4, 5, 0], [3, 8, 1, 3], None),
            ([0, 1, 2, 3, 4, 5], [1, 1, 1, 1, 30, 11], None),
            ([0, 4, 5], [2, 1, 1], None),
            ([1, 2], [20, 9], None),
            ([3, 1, 5], [1 + len(TREE), 1, 3], TREE),
        ]
        for sel, ext, tree in steps:
            total = sum(ext)
            want_rows = [i for i in range(total) if i % 3 == 0] + [total - 1]
            if tree is not None:  # a verify entry: logits at every row
                want_rows = list(range(total))
            step = batch(sel, ext, want_rows, tree)
            states = None
            if hidden is None:
                got, want = graphs.maybe_run(step, kvs[0]), model(step, kvs[1])
            else:
                assert graphs.maybe_run_capture(step, kvs[0], HiddenCapture((1,))) is None
                got, want, states = capture_against_eager(graphs, step, kvs, hidden, tol)
            served.append(got is not None)
            if got is None:
                got = model(step, kvs[0])
            assert got.shape == want.shape == (len(want_rows), 50), (got.shape, want.shape)
            diff = (got - want).abs().max().item()
            assert diff <= tol * want.abs().max().item(), (ext, diff)
            if kept is not None:
                assert torch.equal(*kept)  # the previous step's states: not the buffer
            if states is not None:
                kept = (states, states.clone())
            for r, n in zip(sel, ext):
                done[r] += n
        assert served == [True, True, True, False, True, True, True]
        real_a, real_b = kvs[0]._buffer[:, :, 1:].float(), kvs[1]._buffer[:, :, 1:].float()
        kv_diff = (real_a - real_b).abs().max().item()
        assert kv_diff <= tol * real_b.abs().max().item(), kv_diff
        decode = batch([0, 1], [1, 1], [0, 1])
        assert graphs.maybe_run(decode, kvs[0]) is None  # the decode graphs' business


@requires_triton
def test_segmented_padded_forward_matches_eager(one_thread):
    """The graphs' segments and buffers without capture: same logits and K/V as eager."""
    run_uncaptured(check_against_eager)


@requires_triton
@pytest.mark.parametrize("hidden", HEADS, ids=["eagle3", "medusa"])
def test_segmented_padded_forward_hands_over_a_heads_states(hidden, one_thread):
    run_uncaptured(lambda *a: check_against_eager(*a, hidden=hidden))


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="CUDA graph capture needs a CUDA GPU (the segmented path is tested "
    "on the CPU by test_segmented_padded_forward_matches_eager)",
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_piecewise_replay_matches_eager(dtype, one_thread):
    run_captured(check_against_eager, dtype)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="CUDA graph capture needs a CUDA GPU (the segmented path is tested on the CPU "
    "by test_segmented_padded_forward_hands_over_a_heads_states)",
)
@pytest.mark.parametrize("hidden", HEADS, ids=["eagle3", "medusa"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_piecewise_replay_hands_over_a_heads_states(dtype, hidden, one_thread):
    run_captured(lambda *a: check_against_eager(*a, hidden=hidden), dtype)
