"""Distinct string items (uniqueItems over strings), checked beside the grammar as the text is
decoded (lmprog.fsm.checks): whole texts, masks and guide moves, against jsonschema."""

import json
import random

import jsonschema
import pytest
from fsm_toys import byte_level_tokenizer, random_text

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


def test_random_texts_have_distinct_items():
    c = Constraint.from_json_schema(DOC)
    validator = jsonschema.Draft202012Validator(DOC)
    rng, like = random.Random(0), '{"tags": ["a", "b", "c"], "kids": [{"tags": ["b", "a"]}]}'
    texts = [t for t in (random_text(c, rng, like) for _ in range(150)) if t is not None]
    assert len(texts) > 50
    for text in texts:
        assert validator.is_valid(json.loads(text)), text


def test_checked_schemas_do_not_compose():
    from lmprog.fsm import compose

    with pytest.raises(ConstraintError, match="cannot be combined"):
        compose.embed(Constraint.from_json_schema(TAGS))
