"""Masks: batched bias application, bool masks, numpy (llama.cpp) path, against a reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fsm_toys import byte_level_tokenizer

from lmprog.fsm.index import TokenIndex
from lmprog.fsm.mask import apply_guide_, apply_mask_, batch_allowed_mask, fill_mask_row

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def toy():
    return byte_level_tokenizer()


@pytest.fixture(scope="module")
def guides(toy):
    """Three guides in different states of two constraints, plus an unconstrained row."""
    digits = TokenIndex.get(r"[0-9]{1,3}", toy).new_guide()
    word = TokenIndex.get(r"(true|false) ok", toy).new_guide()
    word_mid = word.copy()
    word_mid.advance_all(toy.encode("tru", add_special_tokens=False))
    done = TokenIndex.get(r"[0-9]{1,3}", toy).new_guide()
    done.advance_all(toy.encode("12", add_special_tokens=False))
    return [digits, None, word_mid, done]


def reference_allowed(guide, width):
    row = torch.ones(width, dtype=torch.bool)
    if guide is not None:
        row[:] = False
        ids = [t for t in guide.allowed_token_ids().tolist() if t < width]
        row[ids] = True
    return row


@pytest.mark.parametrize("width_extra", [0, 7])  # logits padded beyond the vocabulary
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_mask_matches_reference(toy, guides, width_extra, dtype):
    width = len(toy) + width_extra
    logits = torch.randn(len(guides), width).to(dtype)
    expected = logits.clone()
    for b, g in enumerate(guides):
        expected[b][~reference_allowed(g, width)] = float("-inf")
    assert apply_mask_(logits, guides) is logits
    assert torch.equal(logits, expected)


def test_eos_only_where_accepting(toy, guides):
    eos = toy.eos_token_id
    digits, _, word_mid, done = guides
    mask = batch_allowed_mask(guides, len(toy))
    assert not mask[0, eos] and not mask[2, eos] and mask[3, eos]
    assert mask[1].all()
    assert mask[2].sum() == 1 and mask[2, toy.convert_tokens_to_ids("e")]
    assert torch.equal(mask, torch.stack([reference_allowed(g, len(toy)) for g in guides]))


def test_finished_guide_keeps_eos_only(toy):
    guide = TokenIndex.get(r"[0-9]", toy).new_guide()
    guide.advance_all([*toy.encode("7", add_special_tokens=False), toy.eos_token_id])
    logits = torch.zeros(1, len(toy))
    apply_mask_(logits, [guide])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [toy.eos_token_id]


def test_numpy_and_torch_1d_paths(toy, guides):
    guide = guides[2]
    width = len(toy) + 3
    ref = reference_allowed(guide, width).numpy()
    arr = np.random.default_rng(0).standard_normal(width).astype(np.float32)
    expected = np.where(ref, arr, -np.inf)
    assert apply_guide_(arr, guide) is arr
    np.testing.assert_array_equal(arr, expected)
    t = torch.from_numpy(np.random.default_rng(1).standard_normal(width).astype(np.float32))
    exp_t = torch.where(torch.from_numpy(ref), t, torch.tensor(float("-inf")))
    apply_guide_(t, guide)
    assert torch.equal(t, exp_t)


def test_fill_mask_row_torch_and_numpy(toy, guides):
    guide = guides[0]
    row = torch.ones(len(toy) + 5, dtype=torch.bool)
    guide.fill_mask(row)
    assert torch.equal(row, reference_allowed(guide, len(toy) + 5))
    arr = np.ones(len(toy), dtype=bool)
    fill_mask_row(arr, guide)
    np.testing.assert_array_equal(arr, reference_allowed(guide, len(toy)).numpy())


def test_rows_are_shared_between_states_with_equal_sets(toy):
    index = TokenIndex.get(r"[0-9]{3}x", toy)
    guide = index.new_guide()
    first = batch_allowed_mask([guide], len(toy))
    g2 = guide.copy()
    g2.advance_all(toy.encode("1", add_special_tokens=False))
    assert g2.state != guide.state
    assert torch.equal(first, batch_allowed_mask([g2], len(toy)))
    assert len(index.state_cache(("bool", torch.device("cpu"), len(toy), "set"))) == 1


def test_validation_errors(toy, guides):
    with pytest.raises(ValueError, match="guides for a batch"):
        apply_mask_(torch.zeros(2, len(toy)), guides)
    with pytest.raises(ValueError, match="2-D floating"):
        apply_mask_(torch.zeros(len(toy)), guides[:1])
    with pytest.raises(ValueError, match="2-D floating"):
        apply_mask_(torch.zeros(1, len(toy), dtype=torch.long), guides[:1])
    with pytest.raises(TypeError, match="torch.Tensor"):
        apply_mask_([[0.0]], guides[:1])
    with pytest.raises(ValueError, match="1-D floating"):
        apply_guide_(np.zeros((1, 3), dtype=np.float32), guides[0])
    with pytest.raises(ValueError, match="bool"):
        fill_mask_row(torch.zeros(len(toy)), guides[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", ["all", "some"])  # every row constrained, or a None row among them
def test_cuda_masks_match_reference(toy, guides, rows):
    batch = guides if rows == "some" else [g for g in guides if g is not None]
    width = len(toy) + 64
    logits = torch.randn(len(batch), width, device="cuda", dtype=torch.bfloat16)
    expected = logits.clone()
    for b, g in enumerate(batch):
        expected[b][~reference_allowed(g, width).cuda()] = float("-inf")
    apply_mask_(logits, batch)
    assert torch.equal(logits, expected)
    mask = batch_allowed_mask(batch, width, "cuda")
    assert mask.device.type == "cuda"
    assert torch.equal(mask.cpu(), torch.stack([reference_allowed(g, width) for g in batch]))
