"""SGLang's constrained gens: text in `s[name]`, partial text when cut short, and
lmprog's `state.parsed(name)` for the typed value (issue 15: difference 6, typed results)."""

import pydantic
import pytest
from fakes import FakeBackend

import lmprog as sgl  # as an SGLang program imports it


class Capital(pydantic.BaseModel):
    name: str
    population: int


def answering(*texts):
    """A backend that answers each gen with the next text (finish_reason "length")."""
    it = iter(texts)
    return FakeBackend(responder=lambda r: next(it))


def test_a_pydantic_json_schema_gen_returns_text_and_parses_to_the_model():
    @sgl.function
    def capital(s, country):
        s += f"The capital of {country} as JSON: "
        s += sgl.gen("json_output", max_tokens=64, json_schema=Capital)

    text = '{"name": "Paris", "population": 2100000}'
    state = capital.run(country="France", backend=answering(text))
    assert state["json_output"] == text
    assert state.parsed("json_output") == Capital(name="Paris", population=2100000)


def test_a_dict_schema_parses_to_the_dict_and_dtypes_to_their_values():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}

    @sgl.function
    def typed(s):
        s += "json: " + sgl.gen("j", json_schema=schema) + "\n"
        s += "int: " + sgl.gen("i", dtype=int) + "\n"
        s += "float: " + sgl.gen("f", dtype=float) + "\n"
        s += "bool: " + sgl.gen("b", dtype=bool) + "\n"
        s += "str: " + sgl.gen("t", dtype=str) + "\n"
        s += "regex: " + sgl.gen("r", regex=r"[a-z]+") + "\n"
        s += "free: " + sgl.gen("g", max_tokens=4)

    state = typed.run(backend=answering('{"ok": true}', "17", "2.5", "False", '"hi"', "abc", "x y"))
    assert state["j"] == '{"ok": true}' and state.parsed("j") == {"ok": True}
    # every variable is the text, as in SGLang
    assert [state[n] for n in "ifbt"] == ["17", "2.5", "False", '"hi"']
    assert state.parsed("i") == 17 and state.parsed("f") == 2.5 and state.parsed("b") is False
    assert state.parsed("t") == "hi"
    assert state.parsed("r") == "abc" and state.parsed("g") == "x y"  # unconstrained: the text


def test_a_string_gen_cut_short_returns_its_partial_text_with_finish_reason_length():
    @sgl.function
    def tip(s):
        s += "Tip: " + sgl.gen("tip", max_tokens=3, dtype=str)
        s += "\nDone."  # the program goes on after the cut-short gen

    state = tip.run(backend=answering('"Drink water and'))
    assert state["tip"] == '"Drink water and'
    assert state.text() == 'Tip: "Drink water and\nDone.'
    assert state.get_meta_info("tip")["finish_reason"]["type"] == "length"
    assert state.error() is None
    with pytest.raises(sgl.ConstraintError, match=r"'tip'.*finish_reason 'length'"):
        state.parsed("tip")


def test_a_json_schema_gen_cut_short_inside_the_quotes_keeps_its_text():
    @sgl.function
    def capital(s):
        s += sgl.gen("json_output", max_tokens=8, json_schema=Capital)

    state = capital.run(backend=answering('{"name": "Par'))
    assert state["json_output"] == '{"name": "Par'
    assert state.get_meta_info("json_output")["finish_reason"]["type"] == "length"
    with pytest.raises(sgl.ConstraintError, match="json_output.*max_tokens"):
        state.parsed("json_output")


def test_output_that_does_not_parse_although_the_gen_stopped_is_still_an_error():
    @sgl.function
    def number(s):
        s += sgl.gen("n", dtype=int, stop="\n")

    with pytest.raises(sgl.ConstraintError, match="does not parse"):
        number.run(backend=answering("4x\n"))


def test_parsed_values_follow_forks_and_gather():
    @sgl.function
    def forked(s):
        forks = s.fork(2)
        for f in forks:
            f += sgl.gen("n", dtype=int)
        forks.join(mode="gather")

    state = forked.run(backend=answering("1", "2"))
    assert sorted(state.parsed("n")) == [1, 2]


def test_parsed_of_an_unknown_variable_is_a_key_error():
    @sgl.function
    def plain(s):
        s += "hi"

    with pytest.raises(KeyError, match="nope"):
        plain.run(backend=FakeBackend()).parsed("nope")


def test_python_types_as_json_schema_parse_back_to_their_type():
    """Issue 28: json_schema= takes what Outlines takes; parsed() builds the type."""
    import dataclasses
    import enum
    from typing import Literal

    @dataclasses.dataclass
    class Point:
        x: int
        y: int

    class Size(enum.Enum):
        S = "s"
        M = "m"

    @sgl.function
    def typed(s):
        s += sgl.gen("p", json_schema=Point) + sgl.gen("z", json_schema=Size)
        s += sgl.gen("l", json_schema=Literal["yes", "no"]) + sgl.gen("n", json_schema=list[int])
        s += sgl.gen("d", json_schema=dict[str, int]) + sgl.gen("o", json_schema=Point | None)

    texts = ('{"x": 1, "y": 2}', '"m"', '"no"', "[1, 2]", '{"a": 3}', "null")
    state = typed.run(backend=answering(*texts))
    assert state["p"] == '{"x": 1, "y": 2}' and state.parsed("p") == Point(1, 2)
    assert state.parsed("z") is Size.M and state.parsed("l") == "no"
    assert state.parsed("n") == [1, 2] and state.parsed("d") == {"a": 3}
    assert state.parsed("o") is None


def test_a_json_schema_constraint_is_taken_as_it_is_built():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    spec = sgl.Constraint.from_json_schema(schema, strict=False)

    @sgl.function
    def open_object(s):
        s += sgl.gen("j", json_schema=spec)

    state = open_object.run(backend=answering('{"a": 1, "b": 2}'))
    assert state.parsed("j") == {"a": 1, "b": 2}
    assert sgl.gen("j", json_schema=spec).constraint is spec
    assert sgl.gen("j", json_schema=schema).constraint.strict is True  # the default
    with pytest.raises(TypeError, match="json_schema Constraint"):
        sgl.gen("x", json_schema=sgl.Constraint.from_regex("a+"))


def test_parsed_with_a_type_returns_it_to_type_checkers_and_checks_it():
    """Issue 36, section 4: `parsed(name, Model)` is a `Model` to a type checker (the
    overload returns the type given) and checked at run time."""
    import typing

    from lmprog.interpreter.state import ProgramState

    @sgl.function
    def typed(s):
        s += sgl.gen("c", json_schema=Capital) + sgl.gen("i", dtype=int)
        s += sgl.gen("n", json_schema=list[Capital])

    many = '[{"name": "Rome", "population": 2800000}]'
    state = typed.run(backend=answering('{"name": "Paris", "population": 1}', "17", many))
    capital = state.parsed("c", Capital)
    typing.assert_type(capital, Capital)
    assert capital is state.parsed("c") and capital.name == "Paris"
    assert state.parsed("i", int) == 17 and state.parsed("n", list[Capital])[0].name == "Rome"
    with pytest.raises(TypeError, match=r"parsed\('c'\) is a Capital .* not dict"):
        state.parsed("c", dict)
    with pytest.raises(TypeError, match=r"not str"):
        state.parsed("i", str)
    with pytest.raises(TypeError, match=r"not list\[int\]"):
        state.parsed("n", list[int])  # checked item by item
    with pytest.raises(TypeError, match="as_type must be a type"):
        state.parsed("i", 3)

    plain, typed_overload = typing.get_overloads(ProgramState.parsed)
    hints = typing.get_type_hints(typed_overload)
    (t,) = typing.get_args(hints["as_type"])  # type[T] -> T
    assert isinstance(t, typing.TypeVar) and hints["return"] is t
    assert typing.get_type_hints(plain)["return"] is typing.Any


def test_parsed_with_a_type_checks_a_gathered_variable_as_its_list():
    @sgl.function
    def forked(s):
        forks = s.fork(2)
        for f in forks:
            f += sgl.gen("n", dtype=int)
        forks.join(mode="gather")

    state = forked.run(backend=answering("1", "2"))
    assert sorted(state.parsed("n", list[int])) == [1, 2]
    with pytest.raises(TypeError):
        state.parsed("n", int)
