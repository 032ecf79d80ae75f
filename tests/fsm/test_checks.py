"""Distinct items (uniqueItems over open sets of values), checked beside the grammar as the
text is decoded (lmprog.fsm.checks): whole texts, masks and guide moves, against jsonschema."""

import json

import jsonschema
import pytest
from fsm_toys import assert_random_texts_valid, byte_level_tokenizer

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.index import TokenIndex

TAGS = {"type": "array", "items": {"type": "string", "maxLength": 3}, "uniqueItems": True}
DOC = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "tags": TAGS,
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                "free": {"type": "array", "items": {"type": "string"}},
            },
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}


def test_repeated_strings_are_refused_where_the_schema_asks():
    c = Constraint.from_json_schema(DOC)
    assert c.check is not None
    good = '{"tags": ["a", "b", "ab"], "kids": [{"tags": ["a"], "free": ["x", "x"]}], "free": ["a", "a"]}'
    assert c.matches(good)
    for bad in (
        '{"tags": ["a", "b", "a"]}',
        '{"tags": ["a", "\\u0061"]}',  # the same string, spelled otherwise
        '{"kids": [{"kids": [{"tags": ["q\\"", "q\\""]}]}]}',  # nested, escaped quotes
    ):
        assert not c.matches(bad), bad
        assert not jsonschema.Draft202012Validator(DOC).is_valid(json.loads(bad))
    assert c.matches('{"tags": ["a\\\\", "a"]}')  # a backslash ends the first, not the quote


@pytest.mark.parametrize(
    "text, distinct",
    [
        ("[1, 10, -1, 1.5]", True),
        ("[1, 1.0]", False),  # equal numbers, written otherwise
        ("[1e0, 1]", False),
        ("[ 1 , 1 ]", False),
        ("[true, false, null, null]", False),
        ('[{"a": 1, "b": 2}, {"b": 2, "a": 1}]', False),  # key order does not count
        ('[{"a": 1}, {"a": 2}, [1, 2], [2, 1], "1", 1]', True),
        ("[[[1]], [[1]]]", False),
        ('[{"x": [1, 1]}, [], {}]', True),  # inner arrays need not be distinct
    ],
)
def test_any_items_compare_under_json_equality(text, distinct):
    c = Constraint.from_json_schema({"type": "array", "uniqueItems": True})
    assert c.matches(text) is distinct
    assert (
        jsonschema.Draft202012Validator({"uniqueItems": True}).is_valid(json.loads(text))
        is distinct
    )


def test_a_number_item_ends_at_the_character_after_it():
    tok = byte_level_tokenizer()
    guide = TokenIndex.get(Constraint.from_json_schema(NUMBERS), tok).new_guide()
    guide.advance_all(tok.encode("[12, 1", add_special_tokens=False))
    ids = {c: tok.convert_tokens_to_ids(c) for c in ("2", "3", ",", "]", "Ġ")}
    assert all(guide.is_allowed(ids[c]) for c in ("2", "3", ",", "]", "Ġ"))
    guide.advance(ids["2"])  # 12 again: it must not end here
    allowed = set(guide.allowed_token_ids().tolist())
    assert ids["3"] in allowed and not {ids[","], ids["]"], ids["Ġ"]} & allowed


NUMBERS = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}


def test_a_union_checks_where_either_branch_asks():
    either = Constraint.from_json_schema({"anyOf": [TAGS, {"type": "integer"}]})
    assert either.matches('["x", "y"]') and either.matches("3") and not either.matches('["x", "x"]')
    free = Constraint.from_json_schema({"anyOf": [TAGS, {}]})  # anything goes on one side
    assert free.matches('["x", "x"]')


def test_masks_remove_the_tokens_that_would_repeat_an_item():
    tok = byte_level_tokenizer()
    index = TokenIndex.get(Constraint.from_json_schema(TAGS), tok)
    guide = index.new_guide()
    guide.advance_all(tok.encode('["ab", "a', add_special_tokens=False))
    quote = tok.convert_tokens_to_ids('"')
    comma = tok.convert_tokens_to_ids('",')
    allowed = set(guide.allowed_token_ids().tolist())
    assert quote in allowed and comma in allowed  # "a" is new
    guide.advance(tok.convert_tokens_to_ids("b"))
    allowed = set(guide.allowed_token_ids().tolist())
    assert quote not in allowed and comma not in allowed and not guide.is_allowed(quote)
    with pytest.raises(ValueError, match="not allowed"):
        guide.advance(quote)
    assert guide.forced_bytes() == b""  # no jump inside a checked array
    fork = guide.copy()
    fork.rollback(1)  # back to "a: closing it is fine again
    assert fork.is_allowed(quote) and not guide.is_allowed(quote)


def test_no_distinct_item_left_is_an_error_not_an_empty_mask():
    ab = {
        "type": "array",
        "items": {"type": "string", "pattern": "^[ab]$"},
        "uniqueItems": True,
        "minItems": 3,
    }
    tok = byte_level_tokenizer()
    guide = TokenIndex.get(Constraint.from_json_schema(ab), tok).new_guide()
    guide.advance_all(tok.encode('["a", "b", "', add_special_tokens=False))
    guide.advance(tok.convert_tokens_to_ids("a"))  # a third string, which can only repeat
    with pytest.raises(ConstraintError, match="would repeat an earlier one"):
        guide.bitmask_words()


MIXED = {
    "type": "array",
    "items": {"type": ["integer", "boolean", "array"], "items": {"type": "integer"}},
    "uniqueItems": True,
}


@pytest.mark.parametrize(
    "schema, like",
    [
        (DOC, '{"tags": ["a", "b", "c"], "kids": [{"tags": ["b", "a"]}]}'),
        (MIXED, "[1, 1, 10, [1], [1], true, true, [], 2, []]"),  # strays into repeats
    ],
)
def test_random_texts_have_distinct_items(schema, like):
    assert_random_texts_valid(schema, like)


def test_checked_schemas_do_not_compose():
    from lmprog.fsm import compose

    with pytest.raises(ConstraintError, match="cannot be combined"):
        compose.embed(Constraint.from_json_schema(TAGS))


def test_a_large_enum_refuses_the_character_that_leaves_only_repeats():
    licenses = {
        "type": "array",
        "items": {"enum": [f"v{i}" for i in range(70)]},  # too many for a parametric rule
        "uniqueItems": True,
    }
    tok = byte_level_tokenizer()
    guide = TokenIndex.get(Constraint.from_json_schema(licenses), tok).new_guide()
    guide.advance_all(tok.encode('["v7", "v', add_special_tokens=False))
    allowed = set(guide.allowed_token_ids().tolist())
    seven, six = tok.convert_tokens_to_ids("7"), tok.convert_tokens_to_ids("6")
    assert six in allowed and seven not in allowed  # "v7" is the only string from "v7"


def test_a_string_filled_to_its_max_length_as_a_seen_one_is_refused_before_its_quote():
    short = {"type": "array", "items": {"type": "string", "maxLength": 2}, "uniqueItems": True}
    tok = byte_level_tokenizer()
    guide = TokenIndex.get(Constraint.from_json_schema(short), tok).new_guide()
    guide.advance_all(tok.encode('["ab", "a', add_special_tokens=False))
    b, c = tok.convert_tokens_to_ids("b"), tok.convert_tokens_to_ids("c")
    allowed = set(guide.allowed_token_ids().tolist())
    assert c in allowed and b not in allowed and not guide.is_allowed(b)  # "ab" could only close


@pytest.mark.parametrize(
    "text, distinct",
    [
        ("[0E5201305020851988478, -0.0]", False),  # zero, whatever its exponent
        ("[1e99999999999999999999, 10e99999999999999999998]", False),
        ("[1e99999999999999999999, 1e99999999999999999998]", True),
        ("[12.5e-1, 1.25, 125E-2]", False),
    ],
)
def test_numbers_compare_exactly_whatever_their_exponent(text, distinct):
    # (Decimal's default context cannot hold these exponents: jsonschema cannot judge them)
    assert Constraint.from_json_schema(NUMBERS_ANY).matches(text) is distinct


NUMBERS_ANY = {"type": "array", "items": {"type": "number"}, "uniqueItems": True}
