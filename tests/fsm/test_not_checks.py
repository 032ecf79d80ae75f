"""``not`` over uniqueItems (two equal items) and over additionalProperties/patternProperties
(a member whose value breaks them, keys distinct), and ``minProperties`` beyond the named keys
(keys distinct), checked beside the grammar as the text is decoded (lmprog.fsm.checks): whole
texts in every key order, masks and guide moves, random walks, against jsonschema."""

import itertools
import json
import random

import jsonschema
import pytest
from fsm_toys import assert_random_texts_valid, byte_level_tokenizer

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.index import TokenIndex

INT = {"type": "integer"}
REPEATS = {"type": "array", "not": {"uniqueItems": True}}
# dependabot's shape: exactly one of two keys, one of them a distinct-items array
ONE_KEY = {
    "type": "object",
    "properties": {
        "dirs": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "dir": {"type": "string"},
    },
    "oneOf": [
        {"properties": {"dirs": {"uniqueItems": True}}, "required": ["dirs"]},
        {"required": ["dir"]},
    ],
}
# bitbucket-pipelines' shape: a script item is a string, a pipe or an agent task (open objects)
PIPE = {
    "type": "object",
    "properties": {
        "pipe": {"type": "string"},
        "variables": {
            "type": "object",
            "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "array"}]},
        },
    },
    "required": ["pipe"],
}
AGENT = {"type": "object", "properties": {"agent": {"type": "string"}}, "required": ["agent"]}
SCRIPT_ITEM = {"oneOf": [{"type": "string"}, PIPE, AGENT]}
OBJECTS = [
    {"type": "object", "not": {"additionalProperties": INT}},
    {"properties": {"a": {}}, "not": {"additionalProperties": INT}},  # a named key meets it
    {"not": {"patternProperties": {"^x": INT}}},
    {
        "not": {
            "properties": {"a": {"type": "string"}},
            "patternProperties": {"^x": INT},
            "additionalProperties": {"type": "string"},
        }
    },
    {"not": {"not": {"additionalProperties": INT}}},
    {"not": {"not": {"patternProperties": {"^x": INT}}}},
    {"oneOf": [{"required": ["a"]}, {"additionalProperties": INT}]},
    {"type": "object", "not": {"additionalProperties": INT}, "maxProperties": 2},
    {
        "type": "object",
        "required": ["a"],
        "properties": {"a": INT},
        "not": {"additionalProperties": INT},
    },
    SCRIPT_ITEM,
    {"type": "object", "minProperties": 2},  # two keys the schema does not name
    {"type": "object", "additionalProperties": INT, "minProperties": 2, "maxProperties": 3},
    {
        "properties": {"a": {}},
        "required": ["a"],
        "patternProperties": {"^x": INT},
        "minProperties": 3,
    },  # fmt: skip
    {  # bitbucket-pipelines' items: closed objects of one optional key, {} in every branch
        "oneOf": [
            {"properties": {"a": {"additionalProperties": INT}}, "additionalProperties": False},
            {"properties": {"b": {"type": "array"}}, "additionalProperties": False},
        ]
    },
]


def _texts(value) -> list[str]:
    """The value's JSON text, an object's in every key order (the grammar writes named keys
    in the schema's order)."""
    if not isinstance(value, dict):
        return [json.dumps(value)]
    return [
        "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(value[k])}" for k in order) + "}"
        for order in itertools.permutations(value)
    ]


def _agrees(schema, values) -> None:
    c = Constraint.from_json_schema(schema, strict=False)  # the spec's reading
    validator = jsonschema.Draft202012Validator(schema)
    for value in values:
        accepted = [c.matches(t) for t in _texts(value)]
        if validator.is_valid(value):
            assert any(accepted), (schema, value)
        else:
            assert not any(accepted), (schema, value)


def _random_objects(n: int, seed: int) -> list:
    rng = random.Random(seed)
    keys, values = ["a", "b", "xa", "pipe", "agent", "variables"], [1, "s", None, [1], {"b": 1}]
    out = [{}, 1, "x", [1]]
    for _ in range(n):
        out.append({rng.choice(keys): rng.choice(values) for _ in range(rng.randint(1, 3))})
    return out


def test_not_unique_items_means_two_equal_items():
    arrays = [
        list(a) for n in range(5) for a in itertools.product([1, 1.0, "1", True, [1]], repeat=n)
    ]
    arrays += [[{"a": 1, "b": 2}, {"b": 2, "a": 1}], [{"a": 1}, {"a": 2}], [[1, 2], [2, 1]]]
    _agrees(REPEATS, arrays)
    assert Constraint.from_json_schema(REPEATS).check is not None
    for schema in ({"not": REPEATS}, {"anyOf": [REPEATS, INT]}):  # double negation; a union
        _agrees(schema, arrays + [3, "x"])


def test_one_of_with_a_distinct_items_branch():
    values = [
        {"dirs": ["a"]},
        {"dir": "a"},
        {"dirs": ["a"], "dir": "b"},  # both branches
        {"dirs": ["a", "a"], "dir": "b"},  # dirs repeats: invalid under the properties
        {"dirs": ["a", "b"]},
        {},
    ]
    _agrees(ONE_KEY, values)


@pytest.mark.parametrize("schema", OBJECTS, ids=range(len(OBJECTS)))
def test_not_over_open_objects_agrees_with_jsonschema(schema):
    _agrees(schema, _random_objects(250, 0))


TWO_NOTS = [  # two or three 'not's over objects that the additional keys must meet together
    {"type": "object", "allOf": [{"not": {"additionalProperties": INT}}, {"not": {"patternProperties": {"^x": {"type": "string"}}}}]},
    {"type": "object", "allOf": [{"not": {"additionalProperties": False}}, {"not": {"propertyNames": {"pattern": "^[ab]"}}}]},
    {"properties": {"a": {}}, "allOf": [{"not": {"additionalProperties": INT}}, {"not": {"additionalProperties": {"type": "array"}}}]},
    {"type": "object", "allOf": [{"not": {"additionalProperties": INT}}, {"not": {"additionalProperties": {"type": "string"}}}, {"not": {"propertyNames": {"pattern": "^x"}}}]},
]  # fmt: skip


@pytest.mark.parametrize("schema", TWO_NOTS, ids=range(len(TWO_NOTS)))
def test_several_nots_over_objects_met_by_the_additional_keys(schema):
    """(Refused before: "two 'not's over objects left for the additional properties to meet
    are not supported".)"""
    _agrees(schema, _random_objects(300, 1))


@pytest.mark.parametrize(
    "text, ok",
    [
        ('{"a": 1, "b": "s"}', True),
        ('{"a": 1, "b": 2}', False),
        ('{"b": "s", "b": 2}', False),  # the last one counts: every value an integer
        ('{"b": 2, "b": "s"}', False),  # (the same value, with a repeated key: refused too)
        ('{"b": "s", "c": {"b": 1, "b": 1}}', True),  # keys of inner objects may repeat
    ],
)
def test_a_key_written_twice_cannot_hide_the_value_that_breaks_the_rule(text, ok):
    c = Constraint.from_json_schema(OBJECTS[0])
    assert c.matches(text) is ok
    if ok:
        assert jsonschema.Draft202012Validator(OBJECTS[0]).is_valid(json.loads(text))


def test_script_items_of_both_kinds_are_told_apart_by_the_variables():
    c = Constraint.from_json_schema(SCRIPT_ITEM, strict=False)
    both = {"pipe": "p", "variables": {"A": "s"}, "agent": "x"}  # a pipe and an agent: invalid
    assert not any(c.matches(t) for t in _texts(both))
    agent = {"pipe": "p", "variables": {"A": 1}, "agent": "x"}  # not a pipe: an agent only
    assert any(c.matches(t) for t in _texts(agent))
    assert not c.matches('{"pipe": "p", "variables": {"A": 1, "A": "s"}, "agent": "x"}')


def test_masks_hold_the_closing_bracket_until_an_item_repeats():
    tok = byte_level_tokenizer()
    guide = TokenIndex.get(Constraint.from_json_schema(REPEATS), tok).new_guide()
    close = tok.convert_tokens_to_ids("]")
    guide.advance_all(tok.encode("[1, 2", add_special_tokens=False))
    assert close not in set(guide.allowed_token_ids().tolist()) and not guide.is_allowed(close)
    guide.advance_all(tok.encode(", 2.0", add_special_tokens=False))  # equal to 2
    assert close in set(guide.allowed_token_ids().tolist())
    guide.advance(close)
    assert guide.can_stop()


def test_masks_refuse_the_quote_of_a_key_written_before():
    tok = byte_level_tokenizer()
    guide = TokenIndex.get(Constraint.from_json_schema(OBJECTS[0]), tok).new_guide()
    guide.advance_all(tok.encode('{"ab": "s", "ab', add_special_tokens=False))
    quote, colon = tok.convert_tokens_to_ids('"'), tok.convert_tokens_to_ids('":')
    allowed = set(guide.allowed_token_ids().tolist())
    assert quote not in allowed and colon not in allowed and not guide.is_allowed(quote)
    guide.advance(tok.convert_tokens_to_ids("c"))  # "abc" is new
    assert guide.is_allowed(quote) and colon in set(guide.allowed_token_ids().tolist())


def test_masks_hold_a_repeated_key_and_the_brace_until_min_properties_is_met():
    tok = byte_level_tokenizer()
    schema = {"type": "object", "minProperties": 2}
    guide = TokenIndex.get(Constraint.from_json_schema(schema), tok).new_guide()
    guide.advance_all(tok.encode('{"ab": 1', add_special_tokens=False))
    brace = tok.convert_tokens_to_ids("}")
    assert not guide.is_allowed(brace)  # one key: the object may not close
    guide.advance_all(tok.encode(', "ab', add_special_tokens=False))
    quote = tok.convert_tokens_to_ids('"')
    assert quote not in set(guide.allowed_token_ids().tolist()) and not guide.is_allowed(quote)
    guide.advance_all(tok.encode('c": 2', add_special_tokens=False))  # "abc" is new
    guide.advance(brace)
    assert guide.can_stop()


def test_an_array_that_cannot_repeat_any_more_is_an_error_not_an_empty_mask():
    schema = {
        "type": "array",
        "items": {"enum": [{"a": 1}, {"b": 1}]},
        "maxItems": 2,
        "not": {"uniqueItems": True},
    }
    tok = byte_level_tokenizer()
    guide = TokenIndex.get(Constraint.from_json_schema(schema), tok).new_guide()
    # (an object that cannot repeat one is not foreseen: only "}" is left, which is refused)
    guide.advance_all(tok.encode('[{"a": 1}, {"b": 1 ', add_special_tokens=False))
    with pytest.raises(ConstraintError, match="two equal items"):
        guide.bitmask_words()
    strings = Constraint.from_json_schema({**schema, "items": {"enum": ["a", "b"]}})
    assert _takes(strings, '["a", "a') and not _takes(strings, '["a", "b')  # foreseen


@pytest.mark.parametrize(
    "schema, like",
    [
        (REPEATS, '[1, [2], {"a": 1}, 1.0, 3]'),
        (
            {"type": "array", "items": SCRIPT_ITEM},
            '[{"pipe": "p", "variables": {"A": 1, "B": "s"}, "agent": "x"}]',
        ),
        (OBJECTS[3], '{"a": "s", "xa": "s", "b": 1}'),
        (OBJECTS[1], '{"a": 1, "b": 1, "b": "x"}'),  # strays into a repeated key
        (OBJECTS[10], '{"ab": 1, "ab": 2, "b": 3}'),  # minProperties 2: a repeat refused
        (OBJECTS[12], '{"a": 1, "x1": 2, "x1": 3, "b": "s"}'),
    ],
)
def test_random_texts_are_valid(schema, like):
    assert_random_texts_valid(schema, like)


def _takes(c: Constraint, text: str) -> bool:
    """Whether the byte-level guide takes `text` (its mask and `is_allowed` agreeing)."""
    from lmprog.fsm.index import BYTES

    guide = TokenIndex.get(c, BYTES).new_guide()
    for byte in text.encode():
        allowed = byte in guide.allowed_token_ids().tolist()
        assert allowed == guide.is_allowed(byte), (text, chr(byte))
        if not allowed:
            return False
        guide.advance(byte)
    return True


def test_the_last_item_that_can_repeat_one_must_become_one():
    """An array that must repeat an item, at the last item its maxItems allows: an item that
    cannot equal one seen is refused as it is written (its first byte by its kind, a string
    by its characters, any item as it ends), not at the "]" (a dead end)."""
    schema = {**REPEATS, "maxItems": 3}
    c = Constraint.from_json_schema(schema)
    head = '[1, "ab", '
    for refused in ("t", "n", "[", "{", '"b', '"abc', '"a"', "2]"):
        assert not _takes(c, head + refused), refused
    for taken in ("1", '"a', '"ab"', "1.0"):
        assert _takes(c, head + taken), taken
    assert _takes(c, '[1, "\u0432", "\u0432')
    assert not _takes(c, '[1, "\u0432", "\u0433')
    # escapes: read as the characters they stand for, a surrogate pair unit by unit
    assert _takes(c, '[1, "\u00e9", "\\u00e9"]') and _takes(c, '[1, "\u00e9", "\\u00e')
    assert not _takes(c, '[1, "\u00e9", "\\u00e8') and not _takes(c, '[1, "\u00e9", "\\n')
    assert _takes(c, '[1, "\U0001f600", "\\ud83d\\ude00"]')
    assert not _takes(c, '[1, "\U0001f600", "\\ud83d\\ude01')
    _agrees(
        schema,
        [[1, "ab", 1], [1, "ab", "ab"], ["ab", 1, 1.0], [[1], 2, [1]], [1, "ab", "a"], [1, 2]],
    )
    assert_random_texts_valid(schema, '[1, "ab", "ab"]', walks=80, least=30)
