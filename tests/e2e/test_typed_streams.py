"""On the real model, both backends: a JSON gen's value as it streams (issue 36, section 4)."""

import asyncio

import pydantic
import pytest

import lmprog as lp


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")  # no further keys: a short object

    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)


@lp.function
def describe(s):
    s += lp.user("Describe a person as JSON.")
    s += lp.assistant(lp.gen("person", json_schema=Person, max_tokens=60))


def run(backend, asynchronous):
    state = describe.run(temperature=0, backend=backend, stream=True)
    if not asynchronous:
        return state, list(state.partial_iter("person"))

    async def collect():
        return [v async for v in state.partial_async_iter("person")]

    return state, asyncio.run(collect())


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_partial_values_grow_into_the_parsed_model(backend, asynchronous):
    state, values = run(backend, asynchronous)
    person = state.parsed("person")
    assert isinstance(person, Person)
    final = person.model_dump()
    assert values[-1] == final
    # {}, then the name once its string closed, then the age once its number ended
    assert values[:3] == [{}, {"name": final["name"]}, final], values
