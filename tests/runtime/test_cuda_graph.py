"""Decode CUDA graphs (lmprog.runtime.executor.cuda_graph): a replayed bucket gives the eager forward's
logits and K/V for any batch size up to the bucket, padding included.

The static-buffer bookkeeping is tested on the CPU directly. The padded static forward runs
on the CPU under Triton's interpreter (tests/conftest.py sets it up); graph capture and
replay need a CUDA GPU.
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

from lmprog.runtime.executor.cuda_graph import CudaGraphRunner, DecodeBuffers
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.models.llama import HiddenCapture

HEADS = [HiddenCapture((0, 1, 2)), HiddenCapture(())]  # EAGLE-3's layer states, Medusa's


def check_against_eager(device, capture, dtype, tol, moe=False, hidden=None):
    """Tiny Llama, 8 requests with prompts of 3..40 tokens in a 64-wide table; decode steps of
    several batch sizes over random subsets, with shrinking batches inside one bucket (stale
    padding rows) and a batch larger than the biggest bucket (eager fallback). hidden: graphs
    for a draft head, whose states (maybe_run_capture) must equal forward_capture's, and
    stay as they were after the next replay (a copy)."""
    model, g, table, kvs = setup(device, dtype, num_layers=2, rows=8, num_slots=600, moe=moe)
    rows = table.shape[0]
    lens = torch.randint(3, 41, (rows,), generator=g).tolist()

    def batch(sel, ext):
        loc = torch.cat([table[r, lens[r] - n : lens[r]].cpu() for r, n in zip(sel, ext)])
        return ForwardBatch.build(
            input_ids=torch.randint(0, 50, (len(loc),), generator=g),
            out_cache_loc=loc,
            req_pool_indices=sel,
            seq_lens=[lens[r] for r in sel],
            extend_lens=ext,
            req_to_token=table,
            device=device,
        )

    with torch.inference_mode():
        prefill = batch(list(range(rows)), list(lens))
        model(prefill, kvs[0])
        # the reference pool starts from the same prompts' K/V: a copy, not a second prefill
        # (the same forward again, most of this check's time under the CPU interpreter)
        kvs[1]._buffer.copy_(kvs[0]._buffer)
        graphs = CudaGraphRunner(
            model,
            kvs[0],
            table,
            batch_sizes=(1, 2, 4, 8),
            max_batch_size=6,
            capture=capture,
            hidden=hidden,
        )
        assert graphs.batch_sizes == (1, 2, 4, 6)
        assert graphs.maybe_run(prefill, kvs[0]) is None  # not a decode batch
        ran = []
        kept = None  # (a step's hidden states, a copy of them)
        for n in (3, 6, 5, 1, 2, 4, 7, 6, 3):
            sel = torch.randperm(rows, generator=g)[:n].tolist()
            for r in sel:
                lens[r] += 1
            step = batch(sel, [1] * n)
            assert graphs.maybe_run(step, kvs[1]) is None  # another pool
            states = None
            if hidden is None:
                got, want = graphs.maybe_run(step, kvs[0]), model(step, kvs[1])
            else:
                assert graphs.maybe_run_capture(step, kvs[0], HiddenCapture((1,))) is None
                got, want, states = capture_against_eager(graphs, step, kvs, hidden, tol)
            ran.append(got is not None)
            if got is None:
                got = model(step, kvs[0])
            assert got.shape == want.shape == (n, 50), (got.shape, want.shape)
            diff = (got - want).abs().max().item()
            assert diff <= tol * want.abs().max().item(), (n, diff)
            if kept is not None:
                assert torch.equal(*kept)  # the previous step's states: not the buffer
            if states is not None:
                kept = (states, states.clone())
        assert ran == [n <= 6 for n in (3, 6, 5, 1, 2, 4, 7, 6, 3)]
        # K/V of every real slot equal; padding wrote only the dummy slot 0
        real_a, real_b = kvs[0]._buffer[:, :, 1:].float(), kvs[1]._buffer[:, :, 1:].float()
        kv_diff = (real_a - real_b).abs().max().item()
        assert kv_diff <= tol * real_b.abs().max().item(), kv_diff


def _batch(n: int, table: torch.Tensor, base: int) -> ForwardBatch:
    rows = list(range(n))
    return ForwardBatch.build(
        input_ids=[base + i for i in rows],
        out_cache_loc=[base + 10 + i for i in rows],
        req_pool_indices=rows,
        seq_lens=[base + 20 + i for i in rows],
        extend_lens=[1] * n,
        req_to_token=table,
    )


def test_decode_buffers_copy_the_batch_and_reset_padding():
    table = torch.zeros(8, 256, dtype=torch.int32)
    buffers = DecodeBuffers(8, table)
    buffers.load(_batch(7, table, 100), 8)
    buffers.load(_batch(5, table, 200), 8)  # rows 5, 6 held real slots of the previous batch
    ids, pos, loc, rows, lens = buffers.ints.tolist()
    assert ids == [200, 201, 202, 203, 204, 0, 0, 0]
    assert pos == [219, 220, 221, 222, 223, 0, 0, 0]  # ForwardBatch.build: seq_len - 1
    assert loc == [210, 211, 212, 213, 214, 0, 0, 0]  # padding writes the dummy slot only
    assert rows == [0, 1, 2, 3, 4, 0, 0, 0]
    assert lens == [220, 221, 222, 223, 224, 1, 1, 1]
    view = buffers.view(4)
    assert view.is_decode_only and view.batch_size == 4
    assert view.logits_indices.tolist() == [0, 1, 2, 3] == view.extend_start_loc.tolist()
    assert view.input_ids.data_ptr() == buffers.ints.data_ptr()  # a view: replays see new data


@requires_triton
def test_padded_static_forward_matches_eager(one_thread):
    """The graphs' inputs without capture: same logits and K/V as the eager forward."""
    run_uncaptured(check_against_eager)


@requires_triton
@pytest.mark.parametrize("hidden", HEADS, ids=["eagle3", "medusa"])
def test_padded_static_forward_hands_over_a_heads_states(hidden, one_thread):
    run_uncaptured(lambda *a: check_against_eager(*a, hidden=hidden))


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="CUDA graph capture needs a CUDA GPU (the padded static path is "
    "tested on the CPU by test_padded_static_forward_matches_eager)",
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replay_matches_eager(dtype, one_thread):
    run_captured(check_against_eager, dtype)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="CUDA graph capture needs a CUDA GPU (the padded static path is tested "
    "on the CPU by test_padded_static_forward_hands_over_a_heads_states)",
)
@pytest.mark.parametrize("hidden", HEADS, ids=["eagle3", "medusa"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replay_hands_over_a_heads_states(dtype, hidden, one_thread):
    run_captured(lambda *a: check_against_eager(*a, hidden=hidden), dtype)
