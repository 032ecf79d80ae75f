"""Property tests: the compiled grammar agrees with the ``jsonschema`` package.

Soundness: every text generated from a schema's grammar (a random walk through the token
engine, `fsm_toys.random_text`) is a JSON instance the schema accepts. Exactness on simple
schemas: for arbitrary JSON values, written in lmprog's canonical shape (no exponents, no
integral floats), the grammar matches exactly when ``jsonschema`` says valid.
"""

import decimal
import json
import math
from decimal import Decimal
from typing import Literal

import jsonschema
import pytest
from fsm_toys import random_text
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from lmprog.fsm import Constraint


class Address(BaseModel):
    street: str
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str = Field(min_length=1, max_length=20)
    age: int = Field(ge=0, le=150)
    email: str | None = None
    address: Address
    tags: list[str] = Field(default_factory=list, max_length=3)


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(BaseModel):
    pet: Cat | Dog = Field(discriminator="kind")
    weight: float = Field(gt=0, lt=100)


class Tree(BaseModel):
    value: int
    children: list["Tree"] = []


GENERATED = {
    "person": Person.model_json_schema(),
    "pet": Pet.model_json_schema(),
    "tree": Tree.model_json_schema(),
    "numbers": {
        "type": "array",
        "prefixItems": [
            {"type": "number", "minimum": -2.5, "exclusiveMaximum": 7.25},
            {"type": "integer", "multipleOf": 25, "minimum": -1000},
            {"type": "number", "multipleOf": 0.001, "maximum": 0},
            {"type": "number", "multipleOf": 0.25, "minimum": -10.5, "exclusiveMaximum": 3},
            {"type": "number", "multipleOf": 0.125},
            {"type": "number", "multipleOf": 0.75, "minimum": 0, "maximum": 100},
            {"not": {"type": "integer", "minimum": 0, "maximum": 9}},
        ],
        "items": False,
    },
    "strings": {
        "type": "object",
        "properties": {
            "a": {"type": "string", "minLength": 2, "maxLength": 4},
            "b": {"type": "string", "pattern": "x[0-9]+y"},
            "c": {"not": {"enum": ["ab", "abc", ""]}, "type": "string", "maxLength": 4},
            "d": {"type": "string", "format": "date"},
            "e": {"type": "string", "format": "ipv6"},
            "f": {"type": "string", "format": "email"},
        },
        "required": ["a", "b", "c", "d", "e", "f"],
    },
    "objects": {
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "patternProperties": {"^x-": {"type": "boolean"}},
        "additionalProperties": {"type": "null"},
        "propertyNames": {"maxLength": 3},
        "required": ["id"],
        "maxProperties": 3,
    },
    "combinators": {
        "oneOf": [
            {"type": "integer", "minimum": 0},
            {"type": "integer", "maximum": 5},
            {"enum": ["x", [1]]},
        ],
        "if": {"type": "integer"},
        "then": {"not": {"const": 20}},
    },
    "contains": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "contains": {"minimum": 5},
        "minContains": 2,
        "maxContains": 3,
    },
}

# Valid instances the random walks stray from (fsm_toys.random_text); "" = walk at random.
LIKE = {
    "person": '{"name": "Al", "age": 30, "email": "a@b.c", "address": {"street": "s", "zip": "12345"}}',
    "pet": '{"pet": {"kind": "cat", "lives": 9}, "weight": 3.5}',
    "tree": '{"value": 1, "children": [{"value": 2, "children": []}]}',
    "strings": '{"a": "ab", "b": "x12y", "c": "abcd", "d": "2024-02-29", "e": "::1", '
    '"f": "a.b@example.org"}',
}

SETTINGS = settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


def _validator(schema):
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_texts_are_valid_instances(name):
    schema = GENERATED[name]
    # Numbers are read as Decimals, schema and instances alike: multipleOf is exact in JSON
    # Schema but jsonschema divides floats (it rejects -0.7 as a multiple of 0.001), and a
    # float reads a valid 3.5E-1000 as 0.0 (then outside exclusiveMinimum: 0).
    parse_float = Decimal
    exact_schema = json.loads(json.dumps(schema), parse_float=parse_float)
    constraint, validator = Constraint.from_json_schema(schema), _validator(exact_schema)

    @SETTINGS
    @given(st.randoms(use_true_random=False))
    def check(rng):
        text = random_text(constraint, rng, LIKE.get(name, ""))
        assume(text is not None)
        with decimal.localcontext() as ctx:  # exponents past the default context's range
            ctx.Emax, ctx.Emin = decimal.MAX_EMAX, decimal.MIN_EMIN
            try:
                instance = json.loads(text, parse_float=parse_float)
                errors = [e.message for e in validator.iter_errors(instance)]
            except decimal.InvalidOperation:  # an exponent Decimal cannot hold: not judged
                assume(False)
        assert not errors, (text, errors)

    check()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-300, 300)
    | st.text(max_size=4)
    | st.floats(-300, 300, allow_nan=False).map(lambda x: round(x, 3)),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abcd"), inner, max_size=3)
    ),
    max_leaves=6,
)

EXACT = {
    "integer": {"type": "integer", "minimum": -17, "exclusiveMaximum": 250},
    "number": {"type": "number", "exclusiveMinimum": -1.5, "maximum": 99.125},
    "multiple": {"type": "integer", "multipleOf": 20},
    "multiple3": {"type": "integer", "multipleOf": 6, "minimum": 0},
    "string": {"type": "string", "minLength": 1, "maxLength": 3},
    "enum": {"enum": [1, "a", None, [True], {"a": 1}]},
    "array": {"type": "array", "items": {"type": ["integer", "null"]}, "maxItems": 2},
    "object": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    },
    "not": {"not": {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]}},
}


def _canonical(v, depth: int = 0) -> bool:
    """Written as lmprog writes it: floats non-integral and without exponent."""
    if isinstance(v, float):
        return not v.is_integer() and "e" not in repr(v) and math.isfinite(v)
    if isinstance(v, list):
        return all(_canonical(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(_canonical(x, depth + 1) for x in v.values())
    return True


@pytest.mark.parametrize("name", sorted(EXACT))
def test_matches_exactly_the_valid_values(name):
    schema = EXACT[name]
    c, validator = Constraint.from_json_schema(schema), _validator(schema)

    @SETTINGS
    @given(json_values)
    def check(value):
        text = json.dumps(value, ensure_ascii=False)
        valid = validator.is_valid(value)
        if c.matches(text):
            assert valid, text  # never accept an invalid instance
        elif _canonical(value):
            assert not valid, text  # canonical valid instances are all accepted

    check()
