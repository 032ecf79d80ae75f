"""The attention plan is host bookkeeping: checked on CPU tensors, no kernel runs."""

from __future__ import annotations

import pytest
import torch
from attention_batches import make_batch

from lmprog.runtime.kernels.attention_plan import (
    MAX_SPLITS,
    MIN_SPLIT_TOKENS,
    TileConfig,
    choose_num_splits,
    plan_attention,
)

CPU = torch.device("cpu")


def _plan(seq, ext, hq=8, hk=2, **kwargs):
    batch = make_batch(seq, ext, hq, hk, 16, torch.float32, CPU)
    return plan_attention(*batch.tensors, num_q_heads=hq, num_kv_heads=hk, head_dim=16,
                          **kwargs)  # fmt: skip


def test_routes_short_rows_to_the_split_launch():
    plan = _plan([100, 30, 50, 9], [100, 1, 4, 0], split_max_tokens=4, num_kv_splits=2,
                 extend_config=TileConfig(32, 16, 4, 1))  # fmt: skip
    assert plan.split.tile_req.tolist() == [1, 2]
    assert plan.split.tile_out.tolist() == [0, 1]
    assert plan.split_rows.tolist() == [[1, 2, 2, 2, 2], [0, 0, 1, 2, 3]]
    assert plan.partial_o.shape == (5, 8, 2, 16) and plan.partial_lse.shape == (5, 8, 2)
    # group 4: 32 rows hold 8 tokens, so 100 new tokens need 13 tiles, all of request 0
    assert plan.extend.num_tiles == 13 and set(plan.extend.tile_req.tolist()) == {0}
    assert plan.num_tokens == 105


def test_extend_tiles_run_longest_first():
    plan = _plan([40, 300, 64], [40, 20, 64], split_max_tokens=0,
                 extend_config=TileConfig(16, 16, 4, 1))  # fmt: skip
    req, m = plan.extend.tile_req.tolist(), plan.extend.tile_m.tolist()
    seq, ext = [40, 300, 64], [40, 20, 64]
    work = [seq[b] - ext[b] + min(mm + 4, ext[b]) for b, mm in zip(req, m)]
    assert work == sorted(work, reverse=True)
    assert sorted(zip(req, m)) == [(b, mm) for b in range(3) for mm in range(0, ext[b], 4)]


def test_decode_tables_depend_only_on_batch_size():
    # What a CUDA graph replay needs: new lengths, same tables.
    a = _plan([10, 500, 33], [1, 1, 1], num_kv_splits=4)
    b = _plan([900, 7, 64], [1, 1, 1], num_kv_splits=4)
    for name in ("tile_req", "tile_m", "tile_out"):
        assert torch.equal(getattr(a.split, name), getattr(b.split, name))
    assert torch.equal(a.split_rows, b.split_rows) and a.extend is None


def test_num_splits_fill_the_chip_without_tiny_chunks():
    assert choose_num_splits(512, 4096, 132) == 2  # ceil(6 * 132 / 512)
    assert choose_num_splits(8, 100_000, 132) == MAX_SPLITS
    assert choose_num_splits(8, 3 * MIN_SPLIT_TOKENS, 132) == 3
    assert choose_num_splits(8, 100, 132) == 1


def test_small_group_blocks_grow_to_hold_a_group():
    plan = _plan([20], [20], hq=32, hk=1, split_max_tokens=0,
                 extend_config=TileConfig(16, 16, 4, 1))  # fmt: skip
    assert plan.extend.config.block_m == 32 and plan.extend.num_tiles == 20


def test_host_lengths_must_match():
    with pytest.raises(ValueError, match="seq_lens_cpu has 1 entries"):
        _plan([5, 6], [1, 1], seq_lens_cpu=[5])
    with pytest.raises(ValueError, match="power of two"):
        TileConfig(24, 16, 4, 1)
    with pytest.raises(ValueError, match="num_kv_splits"):
        _plan([5, 6], [1, 1], num_kv_splits=0)
