"""The batched sampler on toy vocabularies: exact checks plus statistical ones."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmprog.core.sampling import SamplingParams as SP
from lmprog.decoding.rng import make_generator
from lmprog.decoding.sampler import (
    NO_TOKEN,
    SamplingTensors,
    _top_k_top_p_keep,
    probabilities,
    sample,
)

torch.set_num_threads(1)
EOS = 4


def _tensors(params, eos=(EOS,)):
    return SamplingTensors.from_params(params, eos_token_ids=eos)


def _bitmask(allowed):
    """bool [B, V] -> the int32 bitmask [B, ceil(V / 32)] of lmprog.fsm.mask."""
    allowed = np.asarray(allowed, dtype=bool)
    words = -(-allowed.shape[1] // 32)
    bits = np.zeros((allowed.shape[0], words * 32), dtype=bool)
    bits[:, : allowed.shape[1]] = allowed
    return torch.from_numpy(np.packbits(bits, axis=1, bitorder="little").view(np.int32).copy())


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
        keep[order[p.top_k :]] = False
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
    for p in (
        SP(temperature=0.0),
        SP(temperature=0.7, top_k=1),
        SP(temperature=0, top_p=0.1, min_p=0.5),
    ):
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
    assert (
        sample(
            torch.tensor([[0.0, 0.5, 2.0, 0, 0]]), negative, output_counts=counts
        ).token_ids.item()
        == 1
    )


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


def test_bitmask_is_respected():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]])
    mask = _bitmask([[False, False, True, True, False]])
    assert sample(logits, _tensors([SP(temperature=0)]), bitmask=mask).token_ids.item() == 2
    rows = logits.repeat(500, 1)
    out = sample(rows, _tensors([SP(temperature=2.0)] * 500), bitmask=mask.repeat(500, 1))
    assert set(out.token_ids.tolist()) == {2, 3}


def test_bitmask_in_place_only_when_allowed():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]])
    mask = _bitmask([[False, True, True, True, True]])
    before = logits.clone()
    sample(logits, _tensors([SP(temperature=0)]), bitmask=mask)
    assert torch.equal(logits, before)
    assert (
        sample(
            logits, _tensors([SP(temperature=0)]), bitmask=mask, mask_in_place=True
        ).token_ids.item()
        == 1
    )
    assert logits[0, 0] == float("-inf") and torch.equal(logits[0, 1:], before[0, 1:])
    # penalties change the logits: they go to a copy, mask and all
    counts = torch.zeros(1, 5, dtype=torch.int32)
    fresh = before.clone()
    sample(
        fresh,
        _tensors([SP(temperature=0, presence_penalty=1.0)]),
        output_counts=counts,
        bitmask=mask,
        mask_in_place=True,
    )
    assert torch.equal(fresh, before)


def test_fully_masked_row_gets_no_token():
    # min_tokens bans EOS, the mask allows only EOS: row 0 has nothing left; row 1 is fine
    logits = torch.zeros(2, 5)
    mask = _bitmask([[False, False, False, False, True], [True] * 5])
    tensors = _tensors([SP(min_tokens=3), SP(temperature=0, return_logprob=True)])
    out = sample(logits, tensors, bitmask=mask, num_output_tokens=[0, 0])
    assert out.token_ids[0] == NO_TOKEN and 0 <= out.token_ids[1] < 5
    p = probabilities(logits, tensors, bitmask=mask, num_output_tokens=[0, 0])
    assert torch.equal(p[0], torch.zeros(5)) and math.isclose(p[1].sum().item(), 1.0, rel_tol=1e-6)


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
    sample(
        logits,
        _tensors([SP(temperature=0.9, frequency_penalty=1.0, min_tokens=1)]),
        output_counts=torch.ones(1, 5, dtype=torch.int32),
        num_output_tokens=[0],
    )
    assert torch.equal(logits, before)
    with pytest.raises(ValueError, match="rows"):
        sample(torch.zeros(2, 5), _tensors([SP()]))
    with pytest.raises(ValueError, match="shape"):
        sample(logits, _tensors([SP()]), bitmask=torch.ones(1, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="int32"):
        sample(logits, _tensors([SP()]), bitmask=torch.ones(1, 1, dtype=torch.int64))
    with pytest.raises(TypeError):
        SamplingTensors.from_params([{"temperature": 0}])


def test_mixed_batch_follows_each_rows_own_distribution():
    """Chi-square per row kind in one batch of interleaved kinds (own temperature, filter and
    mask, distinct seeds): taking another row's temperature, filter or mask fails it."""
    logits = [2.0, 1.5, 1.0, 0.5, 0.2, 0.0, -0.5, -1.0]
    v = len(logits)
    kinds = [
        (SP(temperature=0.5), [True] * 6 + [False] * 2),
        (SP(temperature=1.5, top_k=5), [False] * 2 + [True] * 6),
        (SP(temperature=1.0, min_p=0.2), [True] * v),
    ]
    n = 3000  # rows per kind
    rows = [kinds[i % 3] for i in range(3 * n)]
    gens = [make_generator(1000 + i) for i in range(3 * n)]
    out = sample(
        torch.tensor([logits] * (3 * n)),
        _tensors([p for p, _ in rows]),
        generators=gens,
        bitmask=_bitmask([m for _, m in rows]),
    ).token_ids.numpy()
    for k, (p, allowed) in enumerate(kinds):
        masked = np.where(allowed, logits, -np.inf)
        expected = _reference_probs(masked, p) * n
        counts = np.bincount(out[k::3], minlength=v)
        assert np.all(counts[expected == 0] == 0), (k, counts)
        seen = expected > 0
        chi2 = (((counts - expected)[seen]) ** 2 / expected[seen]).sum()
        assert chi2 < 40, (k, chi2, counts, expected.round())  # 7 dof: p ~ 1e-6


def test_seeded_rows_draw_the_same_in_any_batch_order():
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    params = [
        SP(temperature=1.0, seed=1),
        SP(temperature=0.7, top_p=0.9, seed=2),
        SP(temperature=1.3, seed=3),
        SP(temperature=1.0, top_k=10, seed=4),
    ]

    def run(order, steps=20):
        gens = {i: make_generator(params[i].seed) for i in order}
        st = _tensors([params[i] for i in order])
        draws = {i: [] for i in order}
        for _ in range(steps):
            ids = sample(logits[list(order)], st, generators=[gens[i] for i in order]).token_ids
            for i, t in zip(order, ids.tolist()):
                draws[i].append(t)
        return draws

    together = run((0, 1, 2, 3))
    assert together == run((3, 1, 0, 2))
    assert together[2] == run((2,))[2]


def test_the_device_path_never_reads_the_device():
    """On the meta device every data-dependent host read (item, tolist, bool, nonzero, a
    boolean index) raises: the GPU path of the sampler has none."""
    dev = "meta"
    params = [
        SP(
            temperature=0.7,
            top_k=5,
            top_p=0.9,
            min_p=0.05,
            min_tokens=2,
            frequency_penalty=0.5,
            seed=3,
            return_logprob=True,
            top_logprobs_num=2,
        ),
        SP(temperature=0),
        SP(temperature=1.2),
    ]
    st = SamplingTensors.from_params(params, eos_token_ids=(EOS,), device=dev)
    logits = torch.empty(3, 100, device=dev)
    kwargs = dict(
        output_counts=torch.empty(3, 100, dtype=torch.int32, device=dev),
        num_output_tokens=[0, 1, 5],
        bitmask=torch.empty(3, 4, dtype=torch.int32, device=dev),
    )
    out = sample(
        logits,
        st,
        generators=[make_generator(1), None, make_generator(2)],
        mask_in_place=True,
        **kwargs,
    )
    assert out.token_ids.device.type == "meta" and out.top_token_ids.shape == (3, 2)
    assert probabilities(logits, st, **kwargs).shape == (3, 100)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_step_never_waits_for_the_gpu():
    """Under sync debug mode "error" a CUDA call that waits for the device raises: building
    the tensors, masking, seeded and unseeded draws and queueing the draws wait for nothing."""
    from lmprog.decoding.batch_sampler import BatchSampler
    from lmprog.decoding.decode_state import DecodeState

    dev, v = "cuda", 300
    params = [
        SP(temperature=0.7, top_k=5, top_p=0.9, seed=3),
        SP(temperature=0),
        SP(temperature=1.2, min_p=0.1),
        SP(temperature=1.0, seed=4),
    ]
    states = [
        DecodeState(
            p,
            tokenizer=None,
            prompt_ids=[1],
            eos_token_ids=[EOS],
            vocab_size=v,
            token_text=str,
            device=dev,
        )
        for p in params
    ]
    logits = torch.randn(len(params), v, device=dev)
    mask = torch.full((len(params), (v + 31) // 32), -1, dtype=torch.int32, device=dev)
    mask[0, 0] = 0x0F0F0F0F
    BatchSampler([EOS]).sample(logits.clone(), states)  # first calls: tables, kernels
    sample(logits, SamplingTensors.from_params(params, device=dev), bitmask=mask)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        st = SamplingTensors.from_params(params, eos_token_ids=(EOS,), device=dev)
        gens = [make_generator(1), None, None, make_generator(2)]
        out = sample(logits, st, generators=gens, bitmask=mask, num_output_tokens=[0, 1, 2, 3])
        probabilities(logits, st, bitmask=mask)
        pending = BatchSampler([EOS]).sample_async(logits.clone(), states)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert out.token_ids.shape == (4,) and len(pending.draws()) == 4
