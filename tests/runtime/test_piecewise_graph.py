"""Piecewise CUDA graphs (lmprog.runtime.executor.piecewise_graph): prefill chunks, mixed
prefill + decode steps and verify rows replayed through token-bucketed segments give the
eager forward's logits and K/V, padding included.

The segmented, padded forward runs on the CPU under Triton's interpreter (tests/conftest.py
sets it up); capture and replay need CUDA.
"""

import pytest
import torch
from triton_testing import (  # noqa: F401 - one_thread is a fixture
    one_thread,
    requires_triton,
    run_captured,
    run_uncaptured,
    setup,
)

from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.piecewise_graph import PiecewiseGraphRunner


def check_against_eager(device, capture, dtype, tol, moe=False):
    """Tiny Llama, 6 requests in a 64-wide table: a prefill of several chunks, then mixed
    steps (chunks + decodes + a 3-token verify row) of shrinking and growing token counts
    inside and across buckets, and one step larger than the biggest bucket (eager fallback)."""
    model, g, table, kvs = setup(device, dtype, num_layers=3, rows=6, num_slots=500, moe=moe)
    rows = table.shape[0]
    done = [0] * rows  # tokens whose K/V are in the pool

    def batch(sel, ext, logits_rows):
        loc = torch.cat([table[r, done[r] : done[r] + n].cpu() for r, n in zip(sel, ext)])
        return ForwardBatch.build(
            input_ids=torch.randint(0, 50, (len(loc),), generator=g),
            out_cache_loc=loc,
            req_pool_indices=sel,
            seq_lens=[done[r] + n for r, n in zip(sel, ext)],
            extend_lens=ext,
            req_to_token=table,
            device=device,
            logits_indices=logits_rows,
        )

    with torch.inference_mode():
        graphs = PiecewiseGraphRunner(
            model, kvs[0], table, max_tokens=40, buckets=(8, 16, 32), capture=capture
        )
        assert graphs.token_buckets == (8, 16, 32, 40)
        served = []
        steps = [
            ([0, 1, 2], [12, 7, 9]),
            ([0, 1, 2, 3], [1, 1, 5, 20]),
            ([3, 4, 5, 0], [3, 8, 1, 3]),
            ([0, 1, 2, 3, 4, 5], [1, 1, 1, 1, 30, 11]),
            ([0, 4, 5], [2, 1, 1]),
            ([1, 2], [20, 9]),
        ]
        for sel, ext in steps:
            total = sum(ext)
            want_rows = [i for i in range(total) if i % 3 == 0] + [total - 1]
            step = batch(sel, ext, want_rows)
            got = graphs.maybe_run(step, kvs[0])
            want = model(step, kvs[1])
            served.append(got is not None)
            if got is None:
                got = model(step, kvs[0])
            assert got.shape == want.shape == (len(want_rows), 50), (got.shape, want.shape)
            diff = (got - want).abs().max().item()
            assert diff <= tol * want.abs().max().item(), (ext, diff)
            for r, n in zip(sel, ext):
                done[r] += n
        assert served == [True, True, True, False, True, True]
        real_a, real_b = kvs[0]._buffer[:, :, 1:].float(), kvs[1]._buffer[:, :, 1:].float()
        kv_diff = (real_a - real_b).abs().max().item()
        assert kv_diff <= tol * real_b.abs().max().item(), kv_diff
        decode = batch([0, 1], [1, 1], [0, 1])
        assert graphs.maybe_run(decode, kvs[0]) is None  # the decode graphs' business


@requires_triton
def test_segmented_padded_forward_matches_eager(one_thread):
    """The graphs' segments and buffers without capture: same logits and K/V as eager."""
    run_uncaptured(check_against_eager)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="CUDA graph capture needs a CUDA GPU (the segmented path is tested "
    "on the CPU by test_segmented_padded_forward_matches_eager)",
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_piecewise_replay_matches_eager(dtype, one_thread):
    run_captured(check_against_eager, dtype)
