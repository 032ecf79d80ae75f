"""SGLang's names for run()/run_batch() sampling defaults (issue 15, difference 2)."""

import pytest
from fakes import FakeBackend

import lmprog as sgl  # as an SGLang program imports it


@sgl.function
def tip_suggestion(s, topic):
    s += "Here is a tip about " + topic + ": "
    s += sgl.gen("tip", stop="\n")


def params(backend):
    return [r.params for r in backend.generations()]


def test_run_takes_sglang_s_sampling_defaults():
    backend = FakeBackend()
    state = tip_suggestion.run(
        topic="sleep",
        max_new_tokens=16,
        stop=None,
        stop_token_ids=None,
        temperature=0,
        top_p=0.9,
        top_k=5,
        min_p=0.05,
        frequency_penalty=0.1,
        presence_penalty=0.2,
        ignore_eos=False,
        return_logprob=None,
        logprob_start_len=None,
        top_logprobs_num=None,
        return_text_in_logprobs=None,
        stream=False,
        backend=backend,
    )
    assert state["tip"]
    (p,) = params(backend)
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (16, 0, 0.9, 5, 0.05)
    assert (p.frequency_penalty, p.presence_penalty, p.stop) == (0.1, 0.2, ("\n",))


def test_run_batch_takes_max_new_tokens_and_an_item_s_max_tokens_wins():
    backend = FakeBackend()
    tip_suggestion.run_batch(
        [{"topic": "sleep"}, {"topic": "food", "max_tokens": 3}],
        max_new_tokens=32,
        temperature=0,
        num_threads=1,
        progress_bar=False,
        backend=backend,
    )
    assert sorted(p.max_tokens for p in params(backend)) == [3, 32]


def test_logprobs_with_text_as_sglang_asks_for_them():
    backend = FakeBackend()
    state = tip_suggestion.run(
        topic="sleep",
        max_new_tokens=4,
        return_logprob=True,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
        backend=backend,
    )
    (p,) = params(backend)
    assert p.return_logprob and p.top_logprobs_num == 2 and state["tip"] is not None


def test_both_spellings_with_different_values_is_a_clear_error():
    with pytest.raises(ValueError, match="max_tokens and max_new_tokens.*different values"):
        tip_suggestion.run(topic="x", max_tokens=8, max_new_tokens=16, backend=FakeBackend())
    with pytest.raises(ValueError, match="max_new_tokens"):
        tip_suggestion.run_batch([{"topic": "x", "max_new_tokens": 4, "max_tokens": 5}])
    # the same value twice is fine
    backend = FakeBackend()
    tip_suggestion.run(topic="x", max_tokens=8, max_new_tokens=8, backend=backend)
    assert params(backend)[0].max_tokens == 8


def test_prompt_logprobs_are_refused_not_ignored():
    with pytest.raises(ValueError, match="logprob_start_len"):
        tip_suggestion.run(topic="x", logprob_start_len=0, backend=FakeBackend())


def test_a_program_parameter_named_like_a_sampling_default_stays_an_argument():
    @sgl.function
    def budget(s, max_new_tokens):
        s += f"budget {max_new_tokens}: " + sgl.gen("x", max_tokens=2)

    backend = FakeBackend()
    state = budget.run(max_new_tokens=7, backend=backend)
    assert state.text().startswith("budget 7: ") and params(backend)[0].max_tokens == 2
    budget.run_batch([{"max_new_tokens": 9}], backend=backend)
    assert backend.generations()[-1].prompt == "budget 9: "
