"""The repetition penalty (CTRL's, as vLLM and SGLang apply it) in the batched sampler,
against a plain Python reference, and through DecodeState + BatchSampler."""

from __future__ import annotations

import math

import pytest
import torch

from lmprog.core.sampling import SamplingParams as SP
from lmprog.decoding.batch_sampler import BatchSampler
from lmprog.decoding.decode_state import DecodeState
from lmprog.decoding.sampler import SamplingTensors, probabilities, sample

torch.set_num_threads(1)
V = 8


def _reference_logits(logits, seen, p: SP, counts):
    """Plain Python, one row: repetition on prompt+output tokens, then frequency/presence."""
    out = []
    for t, x in enumerate(logits):
        if seen[t] or counts[t] > 0:
            x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        x -= p.frequency_penalty * counts[t] + p.presence_penalty * (counts[t] > 0)
        out.append(x)
    return out


def _softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


ROWS = [
    [2.0, -1.0, 0.5, 0.0, -3.0, 1.5, 3.0, -0.2],
    [-2.0, 1.0, 4.0, -0.5, 0.3, 0.0, -1.0, 2.2],
    [0.1, 0.2, 0.3, 0.4, -0.1, -0.2, -0.3, -0.4],
]
PROMPT = [
    [1, 0, 0, 0, 1, 0, 1, 0],
    [0, 1, 1, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 0],
]
COUNTS = [
    [0, 2, 0, 1, 0, 0, 0, 0],
    [0, 0, 0, 0, 1, 0, 0, 3],
    [1, 0, 0, 0, 0, 0, 0, 1],
]


@pytest.mark.parametrize(
    "params",
    [
        [SP(temperature=1.0, repetition_penalty=1.3)] * 3,
        [SP(temperature=1.0, repetition_penalty=0.7)] * 3,
        [
            SP(temperature=1.0, repetition_penalty=1.8, frequency_penalty=0.3),
            SP(temperature=1.0),  # no penalty in the same batch
            SP(temperature=1.0, repetition_penalty=1.2, presence_penalty=0.5),
        ],
    ],
    ids=["penalty>1", "penalty<1", "mixed"],
)
def test_distribution_matches_the_reference(params):
    tensors = SamplingTensors.from_params(params)
    probs = probabilities(
        torch.tensor(ROWS),
        tensors,
        output_counts=torch.tensor(COUNTS, dtype=torch.int32),
        prompt_mask=torch.tensor(PROMPT, dtype=torch.bool),
    )
    for b, p in enumerate(params):
        expected = _softmax(_reference_logits(ROWS[b], PROMPT[b], p, COUNTS[b]))
        assert probs[b].tolist() == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_greedy_choice_moves_off_a_seen_token():
    logits = torch.tensor([[3.0, 2.9, -5.0, 0.0]])
    prompt = torch.tensor([[True, False, False, False]])
    plain = sample(logits, SamplingTensors.from_params([SP(temperature=0)]), prompt_mask=prompt)
    assert plain.token_ids.tolist() == [0]  # no penalty: the prompt mask changes nothing
    t = SamplingTensors.from_params([SP(temperature=0, repetition_penalty=1.1)])
    assert sample(logits, t, prompt_mask=prompt).token_ids.tolist() == [1]  # 3.0 / 1.1 < 2.9
    # a negative seen logit is multiplied: a penalty < 1 rewards the repeat
    neg = torch.tensor([[-5.0, -1.0, -2.0, -3.0]])
    t = SamplingTensors.from_params([SP(temperature=0, repetition_penalty=0.1)])
    out = sample(neg, t, prompt_mask=torch.tensor([[True, False, False, False]]))
    assert out.token_ids.tolist() == [0]  # -5 * 0.1 = -0.5 > -1: the seen token wins


def test_inputs_not_modified_and_prompt_mask_checked():
    logits = torch.tensor(ROWS)
    before = logits.clone()
    t = SamplingTensors.from_params([SP(temperature=0, repetition_penalty=2.0)] * 3)
    sample(logits, t, prompt_mask=torch.tensor(PROMPT, dtype=torch.bool))
    assert torch.equal(logits, before)
    with pytest.raises(ValueError, match="prompt_mask"):
        sample(logits, t, prompt_mask=torch.ones(3, V + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="prompt_mask"):
        sample(logits, t, prompt_mask=torch.ones(3, V, dtype=torch.int32))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_sampling_params_refuse_non_positive_or_non_finite(bad):
    with pytest.raises(ValueError, match="repetition_penalty"):
        SP(repetition_penalty=bad)
    with pytest.raises(TypeError, match="repetition_penalty"):
        SP(repetition_penalty="1.2")


def _state(params, prompt):
    return DecodeState(
        params,
        tokenizer=None,
        prompt_ids=prompt,
        eos_token_ids=(),
        vocab_size=V,
        token_text=None,
        jump_forward=False,
    )


def test_decode_state_and_batch_sampler_count_prompt_and_output():
    """Greedy on constant logits: each token once penalised hands the argmax to the next."""
    params = SP(temperature=0, repetition_penalty=10.0, max_tokens=5)
    logits = torch.tensor([[8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]])
    state = _state(params, prompt=[0])
    assert state.prompt_mask.tolist() == [True] + [False] * (V - 1)
    assert not state.history_free  # its sampling reads the tokens it accepts
    sampler = BatchSampler(eos_token_ids=())
    tokens = []
    for _ in range(4):
        (draw,) = sampler.sample(logits.clone(), [state])
        tokens.append(draw.token)
        state.accept(draw.token)
    assert tokens == [1, 2, 3, 4]  # 0 is in the prompt; each output token is seen after it
    plain = _state(SP(temperature=0, max_tokens=5), prompt=[0])
    assert plain.prompt_mask is None and plain.counts is None
    (draw,) = BatchSampler(()).sample(logits.clone(), [plain])
    assert draw.token == 0


def test_mixed_batch_rows_without_the_penalty_are_untouched():
    logits = torch.tensor([[8.0, 7.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]] * 2)
    a = _state(SP(temperature=0, repetition_penalty=10.0), prompt=[0])
    b = _state(SP(temperature=0), prompt=[0])
    draws = BatchSampler(()).sample(logits, [a, b])
    assert [d.token for d in draws] == [1, 0]
