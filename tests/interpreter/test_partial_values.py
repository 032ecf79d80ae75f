"""A JSON gen's value as it streams: `state.partial_iter(name)` / `partial_async_iter`
(issue 36, section 4)."""

import asyncio
import json
import time

import pydantic
import pytest
from fakes import FakeBackend, Gate, within

import lmprog as lp
from lmprog.interpreter.partial import PartialJSON

TEXTS = [
    '{"name": "Ada \\"L\\" Lovelace", "age": 36, "ratio": -1.5e3, "ok": true, "none": null}',
    '{"a": {"b": [1, 22, {"c": "x, y]"}], "d": false}, "e": [], "f": {}}',
    '[10, "ten", [100, 1000], {"k": 0.25}]',
    '  {"s": "\\u00e9t\\u00e9 \\\\ done", "n": 12345678901234567890}  ',
]


def grows_into(early, final, partial_strings):
    """`early` is a value `final` holds as far as it goes (objects and arrays growing, a
    partial string only where partial strings were asked for)."""
    if isinstance(early, dict):
        return isinstance(final, dict) and all(
            k in final and grows_into(v, final[k], partial_strings) for k, v in early.items()
        )
    if isinstance(early, list):
        return (
            isinstance(final, list)
            and len(early) <= len(final)
            and all(grows_into(a, b, partial_strings) for a, b in zip(early, final))
        )
    if isinstance(early, str) and partial_strings:
        return isinstance(final, str) and final.startswith(early)
    return type(early) is type(final) and early == final


def read(text, partial_strings=False, step=1):
    reader, values = PartialJSON(partial_strings), []
    for i in range(0, len(text), step):
        values += reader.feed(text[i : i + step])
    return values + reader.finish()


@pytest.mark.parametrize("partial_strings", [False, True])
@pytest.mark.parametrize("text", TEXTS)
def test_every_value_reported_char_by_char_is_part_of_the_final_one(text, partial_strings):
    values = read(text, partial_strings)
    final = json.loads(text)
    assert values[-1] == final and len(values) > 2
    for early in values:
        assert grows_into(early, final, partial_strings), (early, final)
    assert all(a != b for a, b in zip(values, values[1:]))  # reported when it changed


def test_numbers_only_once_complete_strings_only_once_closed_unless_asked():
    values = read('{"n": 1234, "s": "abc", "x": -5.5e3}')
    assert values == [
        {},
        {"n": 1234},
        {"n": 1234, "s": "abc"},
        {"n": 1234, "s": "abc", "x": -5500.0},
    ]
    assert read("42") == [42]  # a number at the end of the text is complete only at the end
    assert read('"ab"') == ["ab"]
    assert read('"ab"', partial_strings=True) == ["", "a", "ab"]
    assert read("[true, fals") == [[], [True]]  # a literal once written out


def test_a_text_cut_short_keeps_what_is_complete_of_it():
    assert read('{"a": 1, "b": "xy')[-1] == {"a": 1}
    assert read('{"a": 1, "b": "xy', partial_strings=True)[-1] == {"a": 1, "b": "xy"}
    assert read('{"a": 1, "b": 2')[-1] == {"a": 1}  # "2" might have gone on


def test_text_that_is_not_json_is_a_value_error():
    with pytest.raises(ValueError, match="not the start of a JSON value"):
        read("Hello, world")


class Person(pydantic.BaseModel):
    name: str
    age: int
    tags: list[str]


PERSON = '{"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry", "engines"]}'


@lp.function
def person(s):
    s += lp.user("A person as JSON:")
    s += lp.assistant(lp.gen("person", json_schema=Person, max_tokens=64))
    s += lp.user("Thanks")


def test_partial_iter_streams_the_fields_completed_so_far():
    gate = Gate()  # the last piece waits until the reader has seen a partial value
    state = person.run(backend=FakeBackend(gate=gate, responder=lambda r: PERSON), stream=True)

    def collect():
        values = []
        for value in state.partial_iter("person"):
            values.append(value)
            if "age" in value:
                gate.open()
        return values

    values = within(30, collect)
    assert values[1:3] == [{"name": "Ada Lovelace"}, {"name": "Ada Lovelace", "age": 36}]
    assert values[-1] == json.loads(PERSON) and len(values) == 6
    assert all(isinstance(v, dict) for v in values)  # plain JSON while it is being written
    assert state.parsed("person") == Person.model_validate_json(PERSON)  # the typed value


def test_partial_async_iter_and_partial_strings():
    async def collect():
        state = person.run(backend=FakeBackend(responder=lambda r: PERSON), stream=True)
        return [v async for v in state.partial_async_iter("person", partial_strings=True)]

    values = asyncio.run(collect())
    assert {"name": "Ada"} in values  # the name while it was written
    assert values[-1] == json.loads(PERSON)


def test_leaving_partial_iter_early_cancels_the_streamed_run():
    long = json.dumps({"name": "Ada", "age": 36, "tags": [f"t{i}" for i in range(200)]})
    backend = FakeBackend(responder=lambda r: long, token_latency=0.002)
    state = person.run(backend=backend, stream=True)
    for value in state.partial_iter("person"):
        if "age" in value:
            break
    assert isinstance(within(5, state.error), lp.ProgramCancelled)
    deadline = time.monotonic() + 5
    while backend.aborted != 1 and time.monotonic() < deadline:  # at the gen's next piece
        time.sleep(0.002)
    assert backend.aborted == 1 and backend.pieces_sent < 20


def test_leaving_partial_async_iter_early_cancels_the_streamed_run():
    long = json.dumps({"name": "Ada", "age": 36, "tags": [f"t{i}" for i in range(200)]})
    backend = FakeBackend(responder=lambda r: long, token_latency=0.002)

    async def read_until_the_age():
        state = person.run(backend=backend, stream=True)
        async for value in state.partial_async_iter("person"):
            if "age" in value:
                break
        return state  # asyncio.run finalizes the iterator

    state = asyncio.run(read_until_the_age())
    assert isinstance(within(5, state.error), lp.ProgramCancelled)
    deadline = time.monotonic() + 5
    while backend.aborted != 1 and time.monotonic() < deadline:
        time.sleep(0.002)
    assert backend.aborted == 1 and backend.pieces_sent < 20


def test_partial_iter_checks_its_arguments():
    state = person.run(backend=FakeBackend(responder=lambda r: PERSON))
    with pytest.raises(TypeError):
        state.partial_iter(3)
    with pytest.raises(TypeError):
        state.partial_iter("person", partial_strings="yes")
