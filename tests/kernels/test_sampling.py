"""Logit processing and token sampling on the device against PyTorch references."""

from __future__ import annotations

import math

import pytest
import torch
from kernel_helpers import DEVICE, ON_GPU, requires_kernels

pytest.importorskip("triton", reason="triton is not installed: pip install triton==3.9.0")
pytestmark = requires_kernels

from lmprog.runtime.kernels.logits import (  # noqa: E402
    pack_bitmask,
    process_logits,
    process_logits_ref,
    unpack_bitmask,
)
from lmprog.runtime.kernels.sampling import (  # noqa: E402
    sample_tokens,
    sample_tokens_ref,
    top_k_top_p_min_p,
)

VOCAB = [49152, 128256] if ON_GPU else [77, 3000]


def _same_logits(out, ref):
    assert torch.equal(out.isinf(), ref.isinf())
    finite = ~ref.isinf()
    torch.testing.assert_close(out[finite], ref[finite], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("vocab", VOCAB)
def test_bitmask_round_trip(vocab):
    allowed = torch.rand(3, vocab, device=DEVICE) < 0.5
    packed = pack_bitmask(allowed)
    assert packed.dtype == torch.int32 and packed.shape == (3, (vocab + 31) // 32)
    assert torch.equal(unpack_bitmask(packed, vocab), allowed)


@pytest.mark.parametrize("vocab", VOCAB)
@pytest.mark.parametrize("features", ["temperature", "bias", "mask", "penalty", "all"])
def test_process_logits(vocab, features):
    b = 4
    logits = torch.randn(b, vocab, device=DEVICE) * 3
    everything = {
        "temperature": dict(temperatures=torch.tensor([0.7, 0.0, 1.0, 2.5], device=DEVICE)),
        "bias": dict(bias=torch.randn(b, vocab, device=DEVICE)),
        "mask": dict(allowed_bitmask=pack_bitmask(torch.rand(b, vocab, device=DEVICE) < 0.2)),
        "penalty": dict(
            token_counts=torch.randint(0, 3, (b, vocab), dtype=torch.int32, device=DEVICE),
            frequency_penalties=torch.tensor([0.5, 0.0, -0.3, 1.0], device=DEVICE),
            presence_penalties=torch.tensor([0.2, 1.5, 0.0, -1.0], device=DEVICE),
        ),
    }
    kwargs = {}
    for name, args in everything.items():
        if features in (name, "all"):
            kwargs.update(args)
    before = logits.clone()
    ref = process_logits_ref(logits, **kwargs)
    out = process_logits(logits, **kwargs)
    assert out is logits  # in place
    _same_logits(out, ref)
    assert not torch.equal(out, before)


def test_process_logits_rejects_bad_inputs():
    logits = torch.randn(2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="allowed_bitmask must have shape"):
        process_logits(logits, allowed_bitmask=torch.zeros(2, 3, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="together"):
        process_logits(logits, token_counts=torch.zeros(2, 64, dtype=torch.int32, device=DEVICE))
    with pytest.raises(TypeError, match="logits must have dtype"):
        process_logits(logits.half())


def _filter_ref(logits, top_k, top_p, min_p):
    """Row by row, transformers' order: top-k, then top-p and min-p on the renormalized rest."""
    out = torch.full_like(logits, float("-inf"))
    for b in range(logits.shape[0]):
        order = logits[b].argsort(descending=True).tolist()
        k = top_k[b] if top_k[b] >= 1 else len(order)
        kept = order[:k]
        probs = logits[b, kept].softmax(0).tolist()
        keep, mass = [], 0.0
        for tok, p in zip(kept, probs):
            if keep and (mass > top_p[b] or p < min_p[b] * probs[0]):
                continue
            keep.append(tok)
            mass += p
        out[b, keep] = logits[b, keep]
    return out


def test_top_k_top_p_min_p_matches_row_by_row_reference():
    logits = torch.randn(5, 300, device=DEVICE) * 2
    top_k = [1, -1, 20, 300, 7]
    top_p = [1.0, 0.5, 0.9, 0.3, 1.0]
    min_p = [0.0, 0.0, 0.05, 0.0, 0.2]
    out = top_k_top_p_min_p(
        logits,
        top_k=torch.tensor(top_k, device=DEVICE),
        top_p=torch.tensor(top_p, device=DEVICE),
        min_p=torch.tensor(min_p, device=DEVICE),
    )
    ref = _filter_ref(logits.cpu(), top_k, top_p, min_p)
    assert torch.equal(out.cpu().isinf(), ref.isinf())
    assert (~out.isinf()).sum(1).tolist()[0] == 1


def test_greedy_rows_take_the_first_argmax():
    logits = torch.randn(3, 5000, device=DEVICE)
    logits[0, 4097] = logits[0, 17] = 50.0  # a tie across blocks: the first index wins
    logits[2, -1] = 40.0
    greedy = torch.tensor([True, False, True], device=DEVICE)
    seeds = torch.tensor([1, 2, 3], device=DEVICE)
    tokens = sample_tokens(logits, seeds, torch.zeros(3, dtype=torch.int64, device=DEVICE),
                           greedy=greedy)  # fmt: skip
    assert tokens[0].item() == 17 and tokens[2].item() == 4999


def test_sampling_is_reproducible_per_seed_and_step():
    logits = torch.zeros(4, 1000, device=DEVICE)  # uniform: every draw depends on the noise
    seeds = torch.tensor([7, 7, 8, 7], device=DEVICE)
    steps = torch.tensor([0, 0, 0, 1], device=DEVICE)
    a = sample_tokens(logits, seeds, steps)
    b = sample_tokens(logits, seeds, steps)
    assert torch.equal(a, b) and a[0] == a[1]
    assert a[0] != a[2] and a[0] != a[3]  # other seed / other step: another draw


def test_masked_tokens_are_never_sampled():
    rows, vocab = (64 if ON_GPU else 24), 200
    logits = torch.randn(rows, vocab, device=DEVICE)
    allowed = torch.zeros(rows, vocab, dtype=torch.bool, device=DEVICE)
    allowed[:, 3::7] = True
    process_logits(logits, allowed_bitmask=pack_bitmask(allowed))
    steps = torch.zeros(rows, dtype=torch.int64, device=DEVICE)
    tokens = sample_tokens(logits, torch.arange(rows, device=DEVICE), steps)
    assert allowed.gather(1, tokens[:, None]).all()


def test_sample_distribution_matches_softmax():
    """Chi-square of the token counts over many independently seeded rows."""
    draws = 20000 if ON_GPU else 200
    probs = torch.tensor([0.05, 0.15, 0.3, 0.5])
    logits = (probs.log() * 0.5).repeat(draws, 1).to(DEVICE)  # temperature 0.5 undone below
    process_logits(logits, temperatures=torch.full((draws,), 0.5, device=DEVICE))
    seeds = torch.arange(draws, device=DEVICE) * 7919 + 11
    tokens = sample_tokens(logits, seeds, torch.zeros(draws, dtype=torch.int64, device=DEVICE))
    ref = sample_tokens_ref(logits[:1].cpu(), None)  # same distribution through torch's RNG
    assert 0 <= ref.item() < 4
    counts = torch.bincount(tokens.cpu(), minlength=4).double()
    expected = probs.double() * draws
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 16.27, f"chi2={chi2:.1f} over 3 dof (p=0.001 threshold), counts={counts}"
    assert math.isclose(counts.sum().item(), draws)
