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
    assert short.get_meta_info("person")["finish_reason"] == "length"
    assert short["person"].startswith("{") and len(short["person"]) < 40
    with pytest.raises(sgl.ConstraintError, match="person.*length"):
        short.parsed("person")
    assert isinstance(short.parsed("legs"), int)  # the program ran on past the cut

    full = describe.run(budget=60, max_new_tokens=60, temperature=0, backend=backend)
    person = full.parsed("person")
    assert isinstance(person, Person) and Person.model_validate_json(full["person"]) == person
