"""The batched sampler on toy vocabularies: exact checks plus statistical ones."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmprog.decoding.sampler import SamplingTensors, _top_k_top_p_keep, make_generator, sample
from lmprog.core.sampling import SamplingParams as SP

torch.set_num_threads(1)
EOS = 4


def _tensors(params, eos=(EOS,)):
    return SamplingTensors.from_params(params, eos_token_ids=eos)


def _reference_probs(logits, p: SP, counts=None):
    """Plain numpy: penalties, temperature, top-k, top-p (sorted prefix), min-p."""
    x = np.asarray(logits, dtype=np.float64).copy()
    if counts is not None:
        c = np.asarray(counts, dtype=np.float64)
        x -= p.frequency_penalty * c + p.presence_penalty * (c > 0)
    x /= p.temperature
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    keep = np.ones_like(probs, dtype=bool)
    if p.top_k > 0:
        keep[order[p.top_k:]] = False
    if p.top_p < 1.0:
        kept_sorted = np.where(keep[order], probs[order], 0.0)
        mass_before = np.cumsum(kept_sorted) - kept_sorted
        keep[order[mass_before >= p.top_p]] = False
    if p.min_p > 0:
        keep &= probs >= p.min_p * probs.max()
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


def _empirical(logits, p: SP, n: int, counts=None, seed=0):
    """Draw n samples in ONE batched call of n identical rows."""
    torch.manual_seed(seed)
    rows = torch.tensor(logits, dtype=torch.float32).repeat(n, 1)
    cnt = None if counts is None else torch.tensor(counts).repeat(n, 1)
    out = sample(rows, _tensors([p] * n), output_counts=cnt)
    return np.bincount(out.token_ids.numpy(), minlength=len(logits)) / n


LOGITS = [2.0, 1.5, 1.0, 0.2, -0.5, -1.0]


@pytest.mark.parametrize(
    "params",
    [
        SP(temperature=1.0),
        SP(temperature=0.5),
        SP(temperature=1.3, top_k=3),
        SP(temperature=1.0, top_p=0.7),
        SP(temperature=1.0, min_p=0.3),
        SP(temperature=0.8, top_k=4, top_p=0.8, min_p=0.1),
    ],
    ids=["t1", "t0.5", "topk3", "topp0.7", "minp0.3", "combined"],
)
def test_samples_follow_filtered_distribution(params):
    n = 20000
    expected = _reference_probs(LOGITS, params)
    observed = _empirical(LOGITS, params, n)
    # 5 standard deviations of a binomial proportion; zero-probability tokens never appear.
    tol = 5 * np.sqrt(expected * (1 - expected) / n) + 1e-9
    assert np.all(np.abs(observed - expected) <= tol), (observed, expected)
    assert np.all(observed[expected == 0] == 0)


def test_penalised_distribution_matches_reference():
    p = SP(temperature=1.0, frequency_penalty=0.7, presence_penalty=0.4)
    counts = [3, 0, 1, 0, 0, 0]
    expected = _reference_probs(LOGITS, p, counts)
    observed = _empirical(LOGITS, p, 20000, counts=counts)
    assert np.abs(observed - expected).max() < 0.02
    # and the penalty really moved mass away from the most repeated token
    assert observed[0] < _reference_probs(LOGITS, SP(temperature=1.0))[0] - 0.1


def test_greedy_picks_argmax_and_ignores_filters():
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0, 0.0]])
    for p in (SP(temperature=0.0), SP(temperature=0.7, top_k=1), SP(temperature=0, top_p=0.1, min_p=0.5)):
        assert sample(logits, _tensors([p])).token_ids.tolist() == [1]


def test_greedy_with_penalties_changes_the_right_logits():
    logits = torch.tensor([[0.0, 0.5, 0.2, -3.0, -3.0]])
    counts = torch.tensor([[0, 2, 0, 0, 0]])
    freq = _tensors([SP(temperature=0, frequency_penalty=0.2)])  # 0.5 - 0.4 = 0.1 < 0.2
    assert sample(logits, freq, output_counts=counts).token_ids.item() == 2
    pres = _tensors([SP(temperature=0, presence_penalty=0.35)])  # 0.5 - 0.35 = 0.15 < 0.2
    assert sample(logits, pres, output_counts=counts).token_ids.item() == 2
    weak = _tensors([SP(temperature=0, presence_penalty=0.2)])  # 0.3 > 0.2: unchanged
    assert sample(logits, weak, output_counts=counts).token_ids.item() == 1
    negative = _tensors([SP(temperature=0, frequency_penalty=-1.0)])  # rewards repeats
    assert sample(torch.tensor([[0.0, 0.5, 2.0, 0, 0]]), negative, output_counts=counts).token_ids.item() == 1


def test_min_tokens_bans_eos_and_stop_ids_until_reached():
    logits = torch.tensor([[0.0, 0.0, 5.0, 0.0, 9.0]])  # EOS (4) best, then stop id 2
    st = _tensors([SP(temperature=0, min_tokens=2, stop_token_ids=(2,))])
    assert sample(logits, st, num_output_tokens=[0]).token_ids.item() not in (2, 4)
    assert sample(logits, st, num_output_tokens=[1]).token_ids.item() not in (2, 4)
    assert sample(logits, st, num_output_tokens=[2]).token_ids.item() == 4
    ignore = _tensors([SP(temperature=0, min_tokens=2, ignore_eos=True)])
    assert sample(logits, ignore, num_output_tokens=[0]).token_ids.item() == 4


def test_min_tokens_is_per_row():
    logits = torch.tensor([[0.0, 1.0, 0.0, 0.0, 9.0]] * 2)
    st = _tensors([SP(temperature=0, min_tokens=3), SP(temperature=0)])
    assert sample(logits, st, num_output_tokens=[0, 0]).token_ids.tolist() == [1, 4]


def test_allowed_mask_is_respected():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]])
    allowed = torch.tensor([[False, False, True, True, False]])
    assert sample(logits, _tensors([SP(temperature=0)]), allowed=allowed).token_ids.item() == 2
    rows = logits.repeat(500, 1)
    out = sample(rows, _tensors([SP(temperature=2.0)] * 500), allowed=allowed.repeat(500, 1))
    assert set(out.token_ids.tolist()) == {2, 3}


def test_fully_masked_row_raises():
    with pytest.raises(ValueError, match="no token left"):
        sample(torch.zeros(1, 5), _tensors([SP()]), allowed=torch.zeros(1, 5, dtype=torch.bool))


def test_seed_reproduces_and_is_batch_independent():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(3))
    p = SP(temperature=1.0, seed=7)

    def run(seed, extra_rows=0):
        gens = [make_generator(seed)] + [make_generator(100 + i) for i in range(extra_rows)]
        st = _tensors([p] * (1 + extra_rows))
        rows = logits.repeat(1 + extra_rows, 1)
        return [sample(rows, st, generators=gens).token_ids[0].item() for _ in range(40)]

    a = run(7)
    assert a == run(7)
    assert a == run(7, extra_rows=3)
    assert a != run(8)


def test_logprobs_are_raw_model_logprobs():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0, -1.0]])
    p = SP(temperature=0.5, top_k=2, return_logprob=True, top_logprobs_num=3, seed=1)
    out = sample(logits, _tensors([p]), generators=[make_generator(1)])
    raw = torch.log_softmax(logits, dim=-1)[0]
    tok = out.token_ids.item()
    assert math.isclose(out.logprobs.item(), raw[tok].item(), rel_tol=1e-6)
    assert out.top_token_ids[0].tolist() == [1, 2, 0]
    assert torch.allclose(out.top_logprobs[0], raw[[1, 2, 0]])
    plain = sample(logits, _tensors([SP(temperature=0)]))
    assert plain.logprobs is None and plain.top_token_ids is None


def test_window_growth_matches_full_sort():
    # A flat distribution puts the top-p cut-off far beyond the first candidate window.
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(2, 5000, generator=g) * 0.1, dim=-1)
    st = _tensors([SP(temperature=1.0, top_p=0.95), SP(temperature=1.0, top_k=300, top_p=0.97)])
    keep = _top_k_top_p_keep(probs, st)
    for row, p in enumerate((SP(top_p=0.95), SP(top_k=300, top_p=0.97))):
        ref = _reference_probs(torch.log(probs[row]).numpy(), p) > 0
        assert keep[row].numpy().tolist() == ref.tolist()
    assert 4000 < int(keep[0].sum()) < 5000 and int(keep[1].sum()) <= 300
    assert torch.equal(_top_k_top_p_keep(probs, st, full_sort=True), keep)  # the GPU's way


def test_inputs_are_validated_and_not_modified():
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    before = logits.clone()
    sample(logits, _tensors([SP(temperature=0.9, frequency_penalty=1.0, min_tokens=1)]),
           output_counts=torch.ones(1, 5, dtype=torch.int32), num_output_tokens=[0])
    assert torch.equal(logits, before)
    with pytest.raises(ValueError, match="rows"):
        sample(torch.zeros(2, 5), _tensors([SP()]))
    with pytest.raises(ValueError, match="shape"):
        sample(logits, _tensors([SP()]), allowed=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(TypeError):
        SamplingTensors.from_params([{"temperature": 0}])
