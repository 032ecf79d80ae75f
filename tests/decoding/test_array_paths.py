"""The sampler over numpy arrays (llama.cpp) and over torch tensors (the runtime) on the same
logits: equal tokens on greedy and seeded rows, logprobs within float32 rounding, for every
SamplingParams feature; the numpy path imports no torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from lmprog.core.sampling import SamplingParams as SP
from lmprog.decoding.batch_sampler import BatchSampler
from lmprog.decoding.decode_state import DecodeState
from lmprog.decoding.rng import make_generator
from lmprog.decoding.sampler import SamplingTensors, probabilities, sample

EOS = 4
V = 3000  # wide enough that top-p windows grow past the first 256 candidates

# one row per feature, then every feature at once
ROWS = [
    SP(temperature=0),
    SP(temperature=0.8, seed=1),
    SP(temperature=1.3, top_k=7, seed=2),
    SP(temperature=1.0, top_p=0.9, seed=3),
    SP(temperature=2.0, top_p=0.999, seed=4),  # the top-p window grows
    SP(temperature=1.0, min_p=0.05, seed=5),
    SP(temperature=1.0, repetition_penalty=1.4, seed=6),
    SP(temperature=1.0, frequency_penalty=0.7, presence_penalty=0.4, seed=7),
    SP(temperature=1.0, min_tokens=3, stop_token_ids=[9], seed=8),
    SP(temperature=0, repetition_penalty=1.2, frequency_penalty=0.3, min_tokens=2),
    SP(temperature=0.9, return_logprob=True, top_logprobs_num=5, seed=9),
    SP(
        temperature=0.7,
        top_k=50,
        top_p=0.8,
        min_p=0.02,
        repetition_penalty=1.1,
        frequency_penalty=0.2,
        presence_penalty=0.2,
        min_tokens=1,
        top_logprobs_num=3,
        seed=10,
    ),
]


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    b = len(ROWS)
    logits = (rng.standard_normal((b, V)) * 3).astype(np.float32)
    counts = rng.integers(0, 3, (b, V)).astype(np.int32) * (rng.random((b, V)) < 0.01)
    prompt = rng.random((b, V)) < 0.01
    allowed = rng.random((b, V)) < 0.5
    allowed[:, EOS] = True
    words = -(-V // 32)
    bits = np.zeros((b, words * 32), dtype=bool)
    bits[:, :V] = allowed
    bitmask = np.packbits(bits, axis=1, bitorder="little").view(np.int32).copy()
    n_out = rng.integers(0, 4, b).tolist()
    return logits, counts.astype(np.int32), prompt, bitmask, n_out


def _run(device, seed: int, masked: bool):
    logits, counts, prompt, bitmask, n_out = _inputs(seed)
    arrays = [logits, counts, prompt, bitmask]
    if device is not None:
        arrays = [torch.from_numpy(a.copy()) for a in arrays]
    logits, counts, prompt, bitmask = arrays
    st = SamplingTensors.from_params(ROWS, eos_token_ids=(EOS,), device=device)
    gens = [make_generator(p.seed) for p in ROWS]
    kwargs = dict(output_counts=counts, prompt_mask=prompt, num_output_tokens=n_out)
    if masked:
        kwargs["bitmask"] = bitmask
    outs = [sample(logits, st, generators=gens, **kwargs) for _ in range(4)]  # 4 draws each
    probs = probabilities(logits, st, **kwargs)
    return outs, probs


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_numpy_and_torch_sample_the_same_tokens(seed, masked):
    np_outs, np_probs = _run(None, seed, masked)
    pt_outs, pt_probs = _run("cpu", seed, masked)
    assert isinstance(np_outs[0].token_ids, np.ndarray)
    for a, b in zip(np_outs, pt_outs):
        assert a.token_ids.tolist() == b.token_ids.tolist()  # every row is greedy or seeded
        np.testing.assert_allclose(a.logprobs, b.logprobs.numpy(), rtol=0, atol=2e-5)
        assert a.top_token_ids.tolist() == b.top_token_ids.tolist()
        np.testing.assert_allclose(a.top_logprobs, b.top_logprobs.numpy(), rtol=0, atol=2e-5)
    np.testing.assert_allclose(np_probs, pt_probs.numpy(), rtol=1e-4, atol=1e-7)


def _states(device, params):
    return [
        DecodeState(
            p,
            tokenizer=None,
            prompt_ids=[1, 2, 3, 17, 17],
            eos_token_ids=[EOS],
            vocab_size=V,
            token_text=str,
            device=device,
        )
        for p in params
    ]


def test_batch_sampler_decodes_the_same_sequences_on_both():
    """Whole decodes through BatchSampler and DecodeState (penalty counts and prompt masks as
    numpy arrays or tensors): the same tokens, step after step."""
    rng = np.random.default_rng(5)
    steps = [(rng.standard_normal((len(ROWS), V)) * 2).astype(np.float32) for _ in range(12)]
    got = {}
    for device in (None, "cpu"):
        states, sampler, tokens = _states(device, ROWS), BatchSampler([EOS]), []
        for logits in steps:
            live = [s for s in states if not s.done]
            rows = np.stack([logits[states.index(s)] for s in live])
            draws = sampler.sample(rows if device is None else torch.from_numpy(rows), live)
            for s, d in zip(live, draws):
                assert d.error is None
                s.accept(d.token, logprob=d.logprob, top=d.top)
            tokens.append([d.token for d in draws])
        if device is None:
            assert all(isinstance(s.counts, np.ndarray) for s in states if s.counts is not None)
        got[device] = tokens
    assert got[None] == got["cpu"]


def test_the_numpy_path_imports_no_torch():
    code = """
import sys
import numpy as np
from lmprog.core.sampling import SamplingParams as SP
from lmprog.decoding.batch_sampler import BatchSampler
from lmprog.decoding.decode_state import DecodeState
from lmprog.fsm.mask import apply_bitmask_
params = [SP(temperature=0), SP(temperature=0.9, top_p=0.9, top_k=9, min_p=0.01, seed=1,
          repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.1, min_tokens=2,
          top_logprobs_num=2)]
states = [DecodeState(p, tokenizer=None, prompt_ids=[1, 2], eos_token_ids=[0], vocab_size=64,
          token_text=str, device=None) for p in params]
logits = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
draws = BatchSampler([0]).sample(logits, states)
assert all(d.error is None for d in draws), draws
apply_bitmask_(logits, np.full((2, 2), -1, dtype=np.int32))
print("torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
