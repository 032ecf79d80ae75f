import pytest
import torch

from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.models import preset

SMOL = preset("smollm2-135m")


def test_layout_is_per_layer_slots_heads_dim_with_a_dummy_slot():
    pool = KVPool(
        num_slots=10, num_layers=3, num_kv_heads=2, head_dim=4, dtype=torch.bfloat16, device="cpu"
    )
    assert len(pool.k) == len(pool.v) == 3
    for buf in pool.k + pool.v:
        assert buf.shape == (11, 2, 4) and buf.dtype == torch.bfloat16
        assert buf.is_contiguous() and not buf.any()
    assert pool.nbytes == 3 * 2 * 11 * 2 * 4 * 2


def test_write_touches_only_the_given_slots_of_the_given_layer():
    pool = KVPool(8, 2, 2, 4, torch.float32, "cpu")
    k, v = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    loc = torch.tensor([5, 1, 8])
    pool.write(1, loc, k, v)
    assert torch.equal(pool.k[1][loc], k) and torch.equal(pool.v[1][loc], v)
    untouched = torch.tensor([0, 2, 3, 4, 6, 7])
    assert not pool.k[1][untouched].any() and not pool.v[1][untouched].any()
    assert not pool.k[0].any() and not pool.v[0].any()


def test_bytes_per_token_counts_k_and_v_of_every_layer():
    # SmolLM2-135M: 30 layers * 3 kv heads * 64 dims * (K and V)
    assert KVPool.bytes_per_token(SMOL, torch.float32) == 30 * 3 * 64 * 2 * 4
    assert KVPool.bytes_per_token(SMOL, torch.bfloat16) == 30 * 3 * 64 * 2 * 2


def test_size_for_budget_fits_the_budget_including_the_dummy_slot():
    per_token = KVPool.bytes_per_token(SMOL, torch.float32)
    budget = 1000 * per_token + per_token // 2
    n = KVPool.size_for_budget(budget, SMOL, torch.float32)
    assert n == 999
    pool = KVPool.for_model(SMOL, n, torch.float32, "cpu")
    assert pool.nbytes <= budget < pool.nbytes + per_token


def test_budget_too_small_says_what_to_fix():
    with pytest.raises(ValueError, match="raise it"):
        KVPool.size_for_budget(100, SMOL, torch.float32)
    with pytest.raises(ValueError, match="num_slots"):
        KVPool(0, 1, 1, 2, torch.float32, "cpu")
