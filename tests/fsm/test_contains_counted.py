"""``contains`` beside prefixItems, maxItems or a larger minItems (json_schema/emit/arrays.py's
_Counted: the items position by position, the matches counted in the grammar): every short
array against jsonschema, through the token engine, and random walks."""

import itertools
import json

import jsonschema
import pytest
from fsm_toys import assert_random_texts_valid, byte_level_tokenizer

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.index import TokenIndex

ONE = {"const": 1}
SCHEMAS = [
    {"type": "array", "contains": ONE, "maxItems": 3},
    {"type": "array", "contains": ONE, "minContains": 2, "maxItems": 4},
    {"type": "array", "contains": ONE, "maxContains": 1, "maxItems": 3},
    {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "contains": ONE},
    {
        "type": "array",
        "prefixItems": [{"enum": [1, 2]}],
        "items": {"type": "integer"},
        "contains": ONE,
        "minContains": 2,
        "maxContains": 3,
    },
    {"type": "array", "contains": ONE, "minItems": 3},
    {"type": "array", "contains": ONE, "minItems": 3, "maxContains": 1},
    {
        "type": "array",
        "items": {"enum": [1, 2, True]},
        "contains": ONE,
        "minItems": 2,
        "maxItems": 4,
        "minContains": 0,
        "maxContains": 2,
    },
    {"type": "array", "contains": ONE, "maxItems": 3, "uniqueItems": True},
    {"type": "array", "contains": ONE, "maxItems": 3, "not": {"uniqueItems": True}},
]
# readthedocs' install list: an item of one kind may only stand alone
UV = {"type": "object", "properties": {"method": {"const": "uv"}}, "required": ["method"]}
INSTALL = {
    "type": "array",
    "items": {"type": "object", "properties": {"method": {"enum": ["pip", "uv"]}}},
    "allOf": [{"if": {"contains": UV}, "then": {"minItems": 1, "maxItems": 1}}],
}


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_every_short_array_is_judged_as_jsonschema_does(schema):
    c = Constraint.from_json_schema(schema, strict=False)  # the spec's reading
    validator = jsonschema.Draft202012Validator(schema)
    for n in range(5):
        for items in itertools.product([1, 2, True, "a"], repeat=n):
            value = list(items)
            assert c.matches(json.dumps(value)) is validator.is_valid(value), value


def test_a_kind_of_item_that_must_stand_alone():
    c = Constraint.from_json_schema(INSTALL, strict=False)
    validator = jsonschema.Draft202012Validator(INSTALL)
    kinds = [{"method": "uv"}, {"method": "pip"}, {}, {"method": "uv", "x": 1}]
    for n in range(4):
        for items in itertools.product(kinds, repeat=n):
            value = list(items)
            assert c.matches(json.dumps(value)) is validator.is_valid(value), value


def test_the_closing_bracket_waits_for_the_matches_through_the_tokens():
    tok = byte_level_tokenizer()
    schema = {"type": "array", "prefixItems": [{"type": "integer"}], "contains": ONE, "maxItems": 3}
    guide = TokenIndex.get(Constraint.from_json_schema(schema, strict=False), tok).new_guide()
    close = tok.convert_tokens_to_ids("]")
    guide.advance_all(tok.encode("[2, 3", add_special_tokens=False))
    assert not guide.is_allowed(close)  # no 1 yet, and only one more item may come
    guide.advance_all(tok.encode(", ", add_special_tokens=False))
    allowed = {tok.convert_ids_to_tokens(int(i)) for i in guide.allowed_token_ids()}
    assert allowed == {"1"}


@pytest.mark.parametrize(
    "schema, like", [(SCHEMAS[4], "[2, 1, 5, 1, 1, 7]"), (INSTALL, "[{}, {}]")]
)
def test_random_texts_are_valid(schema, like):
    assert_random_texts_valid(schema, like)


SEVERAL = [  # refused before: "two 'contains' on one array have no exact grammar"
    {"allOf": [{"contains": ONE}, {"contains": {"const": "a"}}]},
    {"allOf": [{"contains": {"type": "integer"}}, {"contains": {"const": 1}, "minContains": 2}]},
    {"allOf": [{"contains": ONE}, {"contains": {"type": "boolean"}}, {"contains": {"const": "a"}}]},
    {"type": "array", "items": {"enum": [1, 2, "a"]}, "allOf": [{"contains": ONE}, {"contains": {"enum": [2, "a"]}}]},
    {"allOf": [{"contains": {"enum": [1, True]}}, {"contains": {"enum": [1, "a"]}}], "minItems": 1},
]  # fmt: skip


@pytest.mark.parametrize("schema", SEVERAL, ids=range(len(SEVERAL)))
def test_several_contains_on_one_array(schema):
    """Each array of up to 5 items judged as jsonschema does; random texts valid."""
    c = Constraint.from_json_schema(schema, strict=False)
    validator = jsonschema.Draft202012Validator(schema)
    for n in range(6):
        for items in itertools.product([1, 2, True, "a"], repeat=n):
            value = list(items)
            assert c.matches(json.dumps(value)) is validator.is_valid(value), value
    assert_random_texts_valid(schema, '[1, "a", 1, true]', walks=60, least=20)


def test_too_many_counted_positions_are_refused_by_name():
    with pytest.raises(ConstraintError, match="contains with 5000 counted positions"):
        Constraint.from_json_schema({"type": "array", "contains": ONE, "maxItems": 5000})
    with pytest.raises(ConstraintError, match="two 'contains'.* without prefixItems, maxItems"):
        Constraint.from_json_schema(
            {"allOf": [{"contains": ONE}, {"contains": {"const": 2}}], "maxItems": 3}
        )


DISTINCT_ARRAYS = {"type": "array", "items": {"type": "array", "uniqueItems": True}}


@pytest.mark.parametrize(
    "schema",
    [
        {**DISTINCT_ARRAYS, "contains": {"maxItems": 1}},
        {**DISTINCT_ARRAYS, "contains": {"maxItems": 1}, "maxContains": 1, "maxItems": 3},
    ],
)
def test_items_checked_as_decoded_inside_a_contains_array(schema):
    # the check reads every item along `items` (distinct) while the grammar tells the matches
    # apart: exact as long as `contains` asks for nothing the check would have to do
    c = Constraint.from_json_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    inner = [[], [1], [1, 1], [1, 2], [2, 1, 2]]
    for n in range(4):
        for items in itertools.product(inner, repeat=n):
            value = list(items)
            assert c.matches(json.dumps(value)) is validator.is_valid(value), value


@pytest.mark.parametrize(
    "schema",
    [
        {"contains": {"type": "array", "uniqueItems": True}},  # accepted [[1, 1]] before
        {"contains": {"not": {"uniqueItems": True}}, "maxItems": 3},
        {"contains": {"type": "array", "uniqueItems": True}, "maxContains": 1, "maxItems": 2},
    ],
)
def test_a_check_that_cannot_tell_the_matches_apart_is_refused(schema):
    with pytest.raises(ConstraintError, match="cannot tell which items or members"):
        Constraint.from_json_schema(schema)
