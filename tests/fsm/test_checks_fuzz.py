"""Random schemas where decode-time checks meet the algebra (``not``, ``oneOf``/``anyOf``/
``allOf``, ``contains`` with counts, patternProperties, additionalProperties, uniqueItems, nested
three deep): no random value that jsonschema finds invalid is accepted, in any key order. A
schema may be refused (ConstraintError), never compiled wrong."""

import itertools
import json
import random

import jsonschema
import pytest

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint

LEAVES = [
    {"type": "integer"},
    {"type": "string"},
    {"const": 1},
    {"enum": [1, "a"]},
    {},
    {"type": "array"},
    {"type": "object"},
    {"minimum": 2},
]


def _schema(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(LEAVES)
    sub = lambda: _schema(rng, depth - 1)
    kind = rng.randrange(9)
    if kind == 0:
        return {"not": sub()}
    if kind == 1:
        return {rng.choice(["oneOf", "anyOf", "allOf"]): [sub() for _ in range(rng.randint(2, 3))]}
    if kind == 2:
        s: dict = {"type": "object"}
        for key, value in (
            ("additionalProperties", sub),
            ("patternProperties", lambda: {"^x": sub()}),
            ("properties", lambda: {"a": sub()}),
        ):
            if rng.random() < 0.5:
                s[key] = value()
        return s
    if kind == 3:
        return {"uniqueItems": True, "items": sub()}
    if kind == 4:
        s = {"contains": sub()}
        for key in ("maxItems", "minItems", "minContains", "maxContains"):
            if rng.random() < 0.4:
                s[key] = rng.randint(0, 3)
        if rng.random() < 0.3:
            s["prefixItems"] = [sub()]
        return s
    if kind == 5:
        return {"not": {"uniqueItems": True}}
    if kind == 6:
        return {"not": {"additionalProperties": sub()}}
    if kind == 7:
        return {"not": {"patternProperties": {"^x": sub()}}}
    return {"type": "array", "items": sub(), "maxItems": 3}


def _value(rng: random.Random, depth: int):
    r = rng.random()
    if depth == 0 or r < 0.4:
        return rng.choice([1, 2, "a", "b", None, True, 1.0])
    if r < 0.7:
        return [_value(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    keys = ["a", "b", "xa", "xb"]
    return {rng.choice(keys): _value(rng, depth - 1) for _ in range(rng.randint(0, 3))}


def _texts(value) -> list[str]:
    if not isinstance(value, dict) or len(value) < 2:
        return [json.dumps(value)]
    return [
        "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(value[k])}" for k in order) + "}"
        for order in itertools.permutations(value)
    ]


@pytest.mark.parametrize("seed", [0, 1])
def test_random_schemas_accept_no_invalid_value(seed):
    rng = random.Random(seed)
    compiled = 0
    for _ in range(400):
        schema = _schema(rng, 3)
        try:
            c = Constraint.from_json_schema(schema)
        except ConstraintError:
            continue
        compiled += 1
        validator = jsonschema.Draft202012Validator(schema)
        for _ in range(30):
            value = _value(rng, 3)
            if not validator.is_valid(value):
                assert not any(c.matches(t) for t in _texts(value)), (schema, value)
    assert compiled > 300
