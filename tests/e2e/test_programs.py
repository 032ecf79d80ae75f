"""Whole programs a user writes first, on every backend (and on CUDA where there is one):
multi-turn chat, pydantic extraction, min_tokens, errors that leave the backend serving,
and a batch whose failing program leaves the others untouched."""

import pydantic
import pytest
from greedy_agreement import assert_greedy_agrees, top2_logprobs

import lmprog as lp

pytestmark = pytest.mark.e2e


@lp.function
def two_turns(s):
    s += lp.system("You are a terse assistant.")
    s += lp.user("My name is Ada. Say hello.")
    s += lp.assistant(lp.gen("hello", max_tokens=16, stop="\n"))
    s += lp.user("What is my name? Answer with one word.")
    s += lp.assistant(lp.gen("name", max_tokens=6, stop=[".", "\n"]))


def test_multi_turn_chat_keeps_the_conversation(backend):
    state = two_turns.run(backend=backend, temperature=0)
    roles = [m["role"] for m in state.messages()]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert state.messages()[2]["content"] == state["hello"]
    assert state.messages()[4]["content"] == state["name"] and state["name"].strip()
    # the second turn reused the first turn's prompt from the cache
    assert state.get_meta_info("name")["cached_tokens"] > 0


class City(pydantic.BaseModel):
    # Closed, as extraction models are: pydantic's default schema leaves the object open
    # (JSON Schema: any further key is allowed), and on the GPU's numerics the model wrote a
    # key "population_millions_by_..." until max_tokens cut the JSON off.
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(max_length=16)
    country: str = pydantic.Field(max_length=16)
    population_millions: int = pydantic.Field(ge=0, le=50)


@lp.function
def extract(s, text):
    s += lp.user(f"Extract the city as JSON.\n\n{text}")
    s += lp.assistant(lp.gen("city", json_schema=City, max_tokens=60))


def test_pydantic_extraction_parses_into_the_model(backend):
    state = extract.run(
        "Paris, in France, has about 2 million people.", backend=backend, temperature=0
    )
    city = City.model_validate_json(state["city"])  # the text parses into the model
    assert 0 <= city.population_millions <= 50 and len(city.name) <= 16


@lp.function
def at_least(s):
    s += lp.user("Say OK.")
    s += lp.assistant(lp.gen("x", max_tokens=12, min_tokens=6, temperature=0))


def test_min_tokens_holds_back_the_end_of_turn(backend):
    meta = at_least.run(backend=backend).get_meta_info("x")
    assert 6 <= meta["completion_tokens"] <= 12


@lp.function
def fails_midway(s, i):
    s += lp.user(f"Count to {i}.")
    s += lp.assistant(
        lp.gen("count", max_tokens=8, temperature=0, return_logprob=True, top_logprobs_num=2)
    )
    if i == 2:
        raise RuntimeError("program 2 gave up")
    s += lp.user("Thanks.")


def test_errors_raise_at_their_call_and_the_backend_serves_on(backend):
    with pytest.raises((TypeError, ValueError)):
        lp.gen("x", max_tokens=-1)
    with pytest.raises(lp.ConstraintError):
        lp.gen("x", regex=r"(?<=ab)c")  # a lookbehind of two characters: refused
    with pytest.raises(RuntimeError, match="program 2 gave up"):
        fails_midway.run(2, backend=backend)
    alone = [
        fails_midway.run(i, backend=backend).get_meta_info("count")["output_token_logprobs"]
        for i in (1, 3)
    ]
    # in one batch: the failing program fails alone (its state carries the error), the
    # others give what they give alone (greedy, up to a near tie: the batch computes the
    # shared prompt in another order; see greedy_agreement)
    states = fails_midway.run_batch([{"i": i} for i in (1, 2, 3)], backend=backend)
    assert isinstance(states[1].error(), RuntimeError)
    assert states[0].error() is None and states[2].error() is None
    for state, ref in zip((states[0], states[2]), alone):
        got = [t.token_id for t in state.get_meta_info("count")["output_token_logprobs"]]
        assert_greedy_agrees(got, [t.token_id for t in ref], top2_logprobs(ref), 0.5)


@lp.function
def optional_digits(s):
    s += lp.user("Give a number, or nothing.")
    s += lp.assistant(lp.gen("n", regex=r"[0-9]*", max_tokens=4, temperature=0))


def test_a_regex_that_matches_the_empty_string_runs(backend):
    import re

    value = optional_digits.run(backend=backend)["n"]
    assert re.fullmatch(r"[0-9]*", value)
    with pytest.raises(lp.ConstraintError, match="only the empty string"):
        lp.gen("x", regex="")


SUMS = 'root ::= num (op num){0,3}\nop ::= "+" | "-"\nnum ::= [1-9] [0-9]?\n'


@lp.function
def arithmetic(s):
    s += lp.user("Write a short sum of two numbers.")
    s += lp.assistant(lp.gen("expr", ebnf=SUMS, max_tokens=24))


def test_an_ebnf_grammar_constrains_the_output(backend):
    state = arithmetic.run(backend=backend, temperature=0)
    # the grammar's longest sentence is 11 characters: it always finishes within 24 tokens
    assert state.get_meta_info("expr")["finish_reason"]["type"] == "stop"
    assert lp.Constraint.from_ebnf(SUMS).matches(state["expr"]), state["expr"]
