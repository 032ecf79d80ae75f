"""On the real model: a constrained gen cut short keeps its text as SGLang's does, and
`state.parsed` gives typed values (issue 15: difference 6, typed results)."""

import pydantic
import pytest

import lmprog as sgl  # as an SGLang program imports it


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")  # no further keys: a short object

    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)


@sgl.function
def describe(s, budget):
    s += sgl.user("Describe a person as JSON.")
    s += sgl.assistant(sgl.gen("person", json_schema=Person, max_tokens=budget))
    s += sgl.user("How many legs does a spider have? Answer with a number.")
    s += sgl.assistant(sgl.gen("legs", dtype=int, max_tokens=4))


def test_a_cut_short_json_gen_keeps_its_text_and_a_long_enough_one_parses(backend):
    short = describe.run(budget=3, temperature=0, backend=backend)
    assert short.get_meta_info("person")["finish_reason"]["type"] == "length"
    assert short["person"].startswith("{") and len(short["person"]) < 40
    with pytest.raises(sgl.ConstraintError, match="person.*length"):
        short.parsed("person")
    assert isinstance(short.parsed("legs"), int)  # the program ran on past the cut

    full = describe.run(budget=60, max_new_tokens=60, temperature=0, backend=backend)
    person = full.parsed("person")
    assert isinstance(person, Person) and Person.model_validate_json(full["person"]) == person


@sgl.function
def counted(s):  # typed numbers inside a text, as SGLang's test_decode_int writes them
    s += "Q: How many legs does a spider have?\nA: " + sgl.gen_int("legs") + "\n"
    s += "Q: How many days are in a week?\nA: " + sgl.gen_int("days") + "\n"


def test_a_typed_number_ends_where_the_model_ends_it(backend):
    state = counted.run(temperature=0, max_new_tokens=8, backend=backend)
    for name in ("legs", "days"):
        value, meta = state.parsed(name), state.get_meta_info(name)
        assert isinstance(value, int) and state[name] == str(value)  # the text, as in SGLang
        # it ended at a space or newline (a stop string, not kept) or the end of text;
        # no digits were forced after the number the model meant
        assert meta["finish_reason"]["type"] == "stop", (name, state.text())
        assert meta["completion_tokens"] < 8
        assert f"A: {value}\n" in state.text()


@sgl.function
def streamed_answer(s, question):  # SGLang's test_stream_logprobs
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", return_logprob=True))


def test_text_async_iter_with_meta_data_reports_each_pieces_tokens(backend):
    import asyncio

    async def collect():
        state = streamed_answer(
            question="Write two sentences about Hawaii.",
            stream=True,
            temperature=0,
            max_new_tokens=24,
            backend=backend,
        )
        return state, [c async for c in state.text_async_iter("answer", return_meta_data=True)]

    state, chunks = asyncio.run(collect())
    assert len(chunks) > 1 and "".join(text for text, _ in chunks) == state["answer"]
    previous = 0
    for text, meta in chunks:
        assert text
        n = meta["completion_tokens"]
        assert meta["output_token_logprobs_length"] == n
        assert len(meta["output_token_logprobs"]) == n - previous
        previous = n
    assert previous == state.get_meta_info("answer")["completion_tokens"]
    sync = [
        m
        for _, m in streamed_answer(
            question="Hi", stream=True, max_new_tokens=4, backend=backend
        ).text_iter("answer", True)
    ]
    assert sync and all("output_token_logprobs" in m for m in sync)


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@sgl.function
def ava(s, schema):
    s += sgl.user("Describe a person named Ava as JSON.")
    s += sgl.assistant(sgl.gen("person", json_schema=schema, max_tokens=64))


def test_an_object_schema_gets_only_its_listed_keys(backend):
    """Issue 28: without additionalProperties, this model went on inventing keys ("gender",
    "skills"...) until max_tokens; strict generation (the default) closes the object."""
    state = ava.run(schema=PERSON, temperature=0, backend=backend)
    assert state.get_meta_info("person")["finish_reason"]["type"] == "stop"
    assert set(state.parsed("person")) == {"name", "age"}


def test_python_types_give_their_values_on_the_model(backend):
    import dataclasses
    import enum
    from typing import Literal

    @dataclasses.dataclass
    class Someone:
        name: str
        age: int

    class Mood(enum.Enum):
        HAPPY = "happy"
        SAD = "sad"

    state = ava.run(schema=Someone, temperature=0, backend=backend)
    assert isinstance(state.parsed("person"), Someone)
    for tp, kind in ((Mood, Mood), (Literal["yes", "no"], str), (tuple[int, int], tuple)):
        state = ava.run(schema=tp, temperature=0, backend=backend)
        assert isinstance(state.parsed("person"), kind), state["person"]
