"""Strict generation (issue 28, section 3): an object gets the keys its schema lists, unless a
keyword allows others; ``strict=False`` is JSON Schema's own reading (lmprog.fsm.json_schema.terms.strict)."""

import json
import random
import sys
from dataclasses import dataclass
from typing import Literal

import jsonschema
import pydantic
import pytest
from fsm_toys import random_text
from typing_extensions import TypedDict

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
EXTRA = '{"name": "Ava", "age": 25, "gender": "f"}'


def test_unlisted_keys_are_refused_by_default_and_accepted_under_the_spec():
    strict, spec = (
        Constraint.from_json_schema(PERSON),
        Constraint.from_json_schema(PERSON, strict=False),
    )
    assert strict.matches('{"name": "Ava", "age": 25}') and spec.matches(
        '{"name": "Ava", "age": 25}'
    )
    assert not strict.matches(EXTRA) and spec.matches(EXTRA)
    assert strict.strict is True and spec.strict is False
    # part of the constraint's identity: compiled differently, cached apart
    assert strict != spec and strict.cache_key != spec.cache_key
    assert Constraint.from_regex("a").strict is None


@pytest.mark.parametrize(
    "more, text",
    [
        ({"additionalProperties": True}, EXTRA),
        ({"additionalProperties": {"type": "string"}}, EXTRA),
        ({"patternProperties": {"^g": {"type": "string"}}}, EXTRA),
        ({"propertyNames": {"maxLength": 6}}, EXTRA),
        ({"unevaluatedProperties": {"type": "string"}}, EXTRA),
    ],
)
def test_a_keyword_that_speaks_for_other_keys_keeps_them(more, text):
    c = Constraint.from_json_schema({**PERSON, **more})
    assert c.matches(text)
    assert c.matches('{"name": "Ava", "age": 25}')


def test_what_the_keywords_refuse_stays_refused():
    c = Constraint.from_json_schema({**PERSON, "additionalProperties": {"type": "integer"}})
    assert not c.matches(EXTRA) and c.matches('{"name": "Ava", "age": 25, "id": 7}')


def test_listed_keys_of_every_part_combine():
    both = {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}, "required": ["b"]}]}
    c = Constraint.from_json_schema(both)
    assert c.matches('{"a": 1, "b": 2}') and c.matches('{"b": 2}')
    assert not c.matches('{"b": 2, "c": 3}')
    opened = {"allOf": [both, {"additionalProperties": True}]}
    assert Constraint.from_json_schema(opened).matches('{"b": 2, "c": 3}')


def test_free_form_objects_stay_open_and_empty_properties_close():
    assert Constraint.from_json_schema({"type": "object"}).matches('{"a": [1, {"b": 2}]}')
    no_parameters = Constraint.from_json_schema({"type": "object", "properties": {}})
    assert no_parameters.matches("{}") and not no_parameters.matches('{"a": 1}')
    assert Constraint.from_json_schema({}).matches('{"a": 1}')  # any value


def test_nested_objects_close_too():
    schema = {
        "type": "object",
        "properties": {"p": PERSON, "tags": {"type": "array", "items": PERSON}},
    }
    c = Constraint.from_json_schema(schema)
    assert c.matches('{"p": {"name": "a", "age": 1}, "tags": [{"name": "b", "age": 2}]}')
    assert not c.matches('{"p": ' + EXTRA + "}")
    assert not c.matches('{"tags": [' + EXTRA + "]}")
    assert not c.matches('{"q": 1}')


def test_a_recursive_schema_closes_every_level():
    tree = {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["v"],
    }
    c = Constraint.from_json_schema(tree)
    assert c.matches('{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}')
    assert not c.matches('{"v": 1, "kids": [{"v": 2, "x": 0}]}')


def test_closing_never_leaves_a_schema_without_values():
    # minProperties past the listed keys: other keys are needed, so they stay
    two = Constraint.from_json_schema({"properties": {"a": {}}, "minProperties": 2})
    assert two.matches('{"a": 1, "b": 2}') and not two.matches('{"a": 1}')
    # an item the contains needs, past the prefix
    c = Constraint.from_json_schema(
        {"type": "array", "prefixItems": [{"type": "string"}], "contains": {"type": "integer"}}
    )
    assert c.matches('["a", 1]')


def test_tuples_get_no_items_past_their_prefix():
    pair = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}
    c = Constraint.from_json_schema(pair)
    assert c.matches('[1, "a"]') and c.matches("[1]") and not c.matches('[1, "a", 2]')
    assert Constraint.from_json_schema(pair, strict=False).matches('[1, "a", 2]')
    more = Constraint.from_json_schema({**pair, "items": {"type": "integer"}})
    assert more.matches('[1, "a", 2, 3]')
    assert Constraint.from_json_schema({"type": "array"}).matches('[1, "a", {"b": 2}]')


@pytest.mark.parametrize(
    "schema, like",
    [
        (PERSON, EXTRA),
        (
            {"properties": {"a": {"type": "object", "properties": {"b": {}}}}},
            '{"a": {"b": 1, "c": 2}, "d": 3}',
        ),
        ({"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 1}, "[1, 2, 3]"),
    ],
)
def test_random_strict_texts_are_valid_and_hold_only_listed_keys(schema, like):
    c, validator, rng = (
        Constraint.from_json_schema(schema),
        jsonschema.Draft202012Validator(schema),
        random.Random(0),
    )
    texts = [t for t in (random_text(c, rng, like) for _ in range(60)) if t is not None]
    assert len(texts) > 30
    for text in texts:
        value = json.loads(text)
        assert validator.is_valid(value), text
        if isinstance(value, dict):
            assert set(value) <= set(schema["properties"]), text
            inner = value.get("a")
            assert not isinstance(inner, dict) or set(inner) <= {"b"}, text
        elif isinstance(value, list):
            assert len(value) == 1, text


def test_strict_must_be_a_bool():
    with pytest.raises(TypeError, match="strict"):
        Constraint.from_json_schema(PERSON, strict="yes")


# -- Python types as schemas (as Outlines takes them) -------------------------------------


@dataclass
class Point:
    x: int
    y: int


class Movie(TypedDict):
    title: str
    year: int


class Person(pydantic.BaseModel):
    name: str
    age: int


@pytest.mark.parametrize(
    "tp, yes, no",
    [
        (Literal["a", "b"], ['"a"', '"b"'], ['"c"', "1"]),
        (list[int], ["[]", "[1, 2]"], ['["a"]', "{}"]),
        (dict[str, int], ['{"a": 1, "b": 2}', "{}"], ['{"a": "x"}']),
        (Point, ['{"x": 1, "y": 2}'], ['{"x": 1}', '{"x": 1, "y": 2, "z": 3}']),
        (Movie, ['{"title": "t", "year": 1}'], ['{"title": "t", "year": 1, "cast": []}']),
        (Point | None, ["null", '{"x": 1, "y": 2}'], ['{"y": 2}']),
        (list[Person], ['[{"name": "a", "age": 1}]'], ['[{"name": "a", "age": 1, "x": 0}]']),
        (tuple[int, str], ['[1, "a"]'], ["[1]", '[1, "a", 2]']),
    ],
)
def test_python_types_are_schemas(tp, yes, no):
    c = Constraint.from_json_schema(tp)
    for text in yes:
        assert c.matches(text), text
    for text in no:
        assert not c.matches(text), text


def test_an_enum_is_its_values():
    import enum

    class Size(enum.Enum):
        S = "s"
        M = "m"
        ONE = 1

    c = Constraint.from_json_schema(Size)
    assert c.matches('"s"') and c.matches("1") and not c.matches('"S"')


def test_what_is_not_a_type_or_has_no_schema_is_refused():
    with pytest.raises(TypeError, match="json_schema must be"):
        Constraint.from_json_schema(5)
    with pytest.raises(TypeError, match="json_schema must be"):
        Constraint.from_json_schema([{"type": "integer"}])

    class Opaque:
        pass

    with pytest.raises(ConstraintError, match="Opaque: pydantic cannot describe"):
        Constraint.from_json_schema(Opaque)


def test_typing_typeddict_works_on_every_python():
    """`typing.TypedDict` (what users import; pydantic takes it only from Python 3.12), nested
    and with optional keys, describes the same schema as typing_extensions' and parses back."""
    import typing

    from lmprog.fsm.json_schema import type_adapter

    class Cast(typing.TypedDict, total=False):
        lead: str

    class Film(typing.TypedDict):
        title: str
        cast: list[Cast]
        year: typing.Optional[int]  # noqa: UP045 - the form users write

    c = Constraint.from_json_schema(Film)
    text = '{"title": "t", "cast": [{}, {"lead": "a"}], "year": null}'
    assert c.matches(text)
    assert not c.matches('{"title": "t", "cast": []}')  # year is required
    assert not c.matches('{"title": "t", "cast": [{"lead": 1}], "year": null}')
    assert type_adapter(Film).validate_json(text)["cast"][1] == {"lead": "a"}

    class Node(typing.TypedDict):  # refers to itself: read as written where pydantic can
        next: typing.Optional["Node"]

    if sys.version_info < (3, 12):
        with pytest.raises(ConstraintError, match="typing_extensions.TypedDict"):
            Constraint.from_json_schema(Node)
