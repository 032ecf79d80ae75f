"""JSON Schema compiler, keyword by keyword: accepted texts, rejected texts and refusals.

Every example is also checked against the ``jsonschema`` package, so an example cannot encode a
wrong belief: ``yes`` values must be valid and ``no`` values invalid (``narrowed`` values are valid
but deliberately not generated, e.g. ``1.0`` for an integer).
"""

import functools
import json
import math
import re
from decimal import Decimal

import jsonschema
import pytest

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.index import matches_bytes

CASES = {
    "type union and null": ({"type": ["integer", "null"]}, [0, -12, None], ["a", 1.5, True, []]),
    "boolean": ({"type": "boolean"}, [True, False], [0, "true", None]),
    "number": ({"type": "number"}, [0, -1.5, 3e10, 2.5e-3], ["1", None]),
    "integer bounds": (
        {"type": "integer", "minimum": -3, "maximum": 120},
        [-3, 0, 99, 120],
        [-4, 121, 1000, 5.5],
    ),
    "exclusive bounds": (
        {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
        [1, 9],
        [0, 10, -1],
    ),
    "number bounds": (
        {"type": "number", "minimum": 0.5, "exclusiveMaximum": 2.25},
        [0.5, 0.75, 1, 2, 2.2499],
        [0.49, 2.25, 3, -1],
    ),
    "multipleOf int": ({"type": "integer", "multipleOf": 4}, [0, 4, -8, 1000], [2, 6, -3]),
    "multipleOf automaton": (
        {"type": "integer", "multipleOf": 30},
        [0, 30, -60, 9990],
        [10, 15, 3, 7],
    ),
    "multipleOf up to zero": (  # zero written as 0 (it was only -0 here)
        {"type": "integer", "multipleOf": 3, "maximum": 0},
        [0, -3, -300],
        [3, -4, 1],
    ),
    "multipleOf from one step": (  # minimum 60: the positive multiples
        {"type": "integer", "multipleOf": 60, "minimum": 60},
        [60, 120, 3600],
        [0, 30, -60, 90],
    ),
    "multipleOf bounded": (
        {"type": "integer", "multipleOf": 7, "minimum": 0, "maximum": 50},
        [0, 7, 49],
        [1, 56, -7],
    ),
    "multipleOf decimal": ({"type": "number", "multipleOf": 0.01}, [1, 0.25, -3.1], [0.125, 1.001]),
    "multipleOf half": (  # a rating: any integer, or a fraction of .5
        {"type": "number", "multipleOf": 0.5, "minimum": 0, "maximum": 5},
        [0, 0.5, 3, 4.5, 5],
        [0.25, 5.5, -0.5, 2.05],
    ),
    "multipleOf quarter": (
        {"type": "number", "multipleOf": 0.25, "exclusiveMinimum": -1},
        [-0.75, 0, 0.25, 2.5, 1000.75],
        [-1, -1.25, 0.1, 0.125, 2.05],
    ),
    "multipleOf listed": (  # 1.5 = 15 / 10: listed over a bounded range
        {"type": "number", "multipleOf": 1.5, "minimum": -3, "maximum": 7},
        [-3, -1.5, 0, 4.5, 6],
        [1, 7.5, -4.5, 0.5],
    ),
    "string lengths": (
        {"type": "string", "minLength": 2, "maxLength": 3},
        ["ab", "abc", "é😀"],
        ["a", "abcd", ""],
    ),
    "escapes": ({"type": "string", "maxLength": 4}, ['a"b', "\\", "\n\t", "\u0001"], ["abcde"]),
    "pattern anchored": (
        {"type": "string", "pattern": "^[a-z]+[0-9]?$"},
        ["abc", "x9"],
        ["9", "ab12", "Ab"],
    ),
    "pattern contains": ({"type": "string", "pattern": "b+c"}, ["bc", "abbbcd"], ["ac", "cb"]),
    "pattern with length": (
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
        ["a", "abc"],
        ["abcd", ""],
    ),
    "enum any value": (
        {"enum": ["a", 1, None, [1, "x"], {"k": True}]},
        ["a", 1, None, [1, "x"], {"k": True}],
        ["b", 2, [1], {"k": False}, True],
    ),
    "const": ({"const": {"a": [1, 2]}}, [{"a": [1, 2]}], [{"a": [2, 1]}, {"a": [1, 2], "b": 1}]),
    "properties required": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
            "required": ["a"],
        },
        [{"a": 1}, {"a": 1, "b": "x"}, {"a": 1, "extra": [1, None]}, {"a": 1, "x": {"k": "v"}}],
        [{}, {"b": "x"}, {"a": "1"}, {"a": 1, "b": 2}, []],
    ),
    "additionalProperties false": (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        [{}, {"a": 1}],
        [{"b": 1}, {"a": 1, "b": 2}],
    ),
    "additionalProperties schema": (
        {
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "additionalProperties": {"type": "integer"},
        },
        [{"a": "x", "b": 1}, {"c": 2, "d": 3}],
        [{"b": "x"}, {"a": 1}],
    ),
    "patternProperties": (
        {
            "type": "object",
            "patternProperties": {"^x_": {"type": "integer"}},
            "additionalProperties": False,
        },
        [{}, {"x_a": 1, "x_b": 2}],
        [{"y": 1}, {"x_a": "1"}],
    ),
    "patternProperties overlapping": (
        {
            "type": "object",
            "patternProperties": {"[0-9]{2,}": {"type": "boolean"}, "X_": {"type": "string"}},
        },
        [{"a12": True}, {"X_": "s"}, {"other": None}],
        [{"a12": 1}, {"X_": 1}, {"X_12": True}],
    ),
    "propertyNames": (
        {"type": "object", "propertyNames": {"maxLength": 2}},
        [{"ab": 1}, {}],
        [{"abc": 1}],
    ),
    "min/maxProperties": (
        {"type": "object", "minProperties": 1, "maxProperties": 2},
        [{"a": 1}, {"a": 1, "b": 2}],
        [{}, {"a": 1, "b": 2, "c": 3}],
    ),
    "dependentRequired": (
        {"type": "object", "dependentRequired": {"a": ["b"]}},
        [{}, {"b": 1}, {"a": 1, "b": 2}],
        [{"a": 1}],
    ),
    "items and bounds": (
        {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
        [[1], [1, 2, 3]],
        [[], [1, 2, 3, 4], ["a"]],
    ),
    "prefixItems": (
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
        [[], ["a"], ["a", 1]],
        [[1], ["a", "b"], ["a", 1, 2]],
    ),
    "contains": (
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}, "maxContains": 1},
        [[5], [1, 5, 2]],
        [[], [1, 2], [5, 5]],
    ),
    "uniqueItems finite": (
        {
            "type": "array",
            "prefixItems": [{"type": "boolean"}] * 2,
            "items": False,
            "uniqueItems": True,
        },
        [[True, False], [False]],
        [[True, True]],
    ),
    "uniqueItems enum": (
        {"type": "array", "items": {"enum": ["r", "g", "b"]}, "uniqueItems": True},
        [[], ["g"], ["b", "r", "g"]],
        [["r", "r"], ["x"]],
    ),
    "uniqueItems over 40 values": (
        {
            "type": "array",
            "items": {"enum": [f"v{i}" for i in range(38)] + [1, True]},
            "uniqueItems": True,
            "minItems": 2,
            "maxItems": 30,
        },
        [["v3", "v1"], [1, True, "v37"], [f"v{i}" for i in range(30)]],
        [[], ["v1"], ["v1", "v2", "v1"], [1, 1.0], [f"v{i}" for i in range(31)]],
    ),
    "format with maxLength": (
        {"type": "string", "format": "email", "maxLength": 20},
        ["a@b.co"],
        ["a" * 15 + "@example.com", "nope"],
    ),
    "anyOf": (
        {"anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer", "minimum": 10}]},
        ["a", 10, 99],
        ["ab", 9, None],
    ),
    "oneOf disjoint": ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, ["a", 1], [None]),
    "oneOf overlapping": (
        {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]},
        [-5, 11],
        [0, 5, 10],
    ),
    "allOf": (
        {"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 5}, {"not": {"const": 3}}]},
        [0, 2, 5],
        [3, 6, -1],
    ),
    "not": (
        {"not": {"type": ["string", "object", "array", "null", "boolean"]}},
        [1, 2.5],
        ["a", None],
    ),
    "if then else": (
        {"if": {"type": "integer"}, "then": {"minimum": 0}, "else": {"type": "string"}},
        [0, 7, "a"],
        [-1, None, 1.5],
    ),
    "defs and ref": (
        {
            "$defs": {"pos": {"type": "integer", "minimum": 1}},
            "type": "array",
            "items": {"$ref": "#/$defs/pos"},
        },
        [[], [1, 2]],
        [[0]],
    ),
    "recursion": (
        {
            "$defs": {
                "n": {
                    "type": "object",
                    "properties": {"next": {"$ref": "#/$defs/n"}},
                    "additionalProperties": False,
                }
            },
            "$ref": "#/$defs/n",
        },
        [{}, {"next": {}}, {"next": {"next": {}}}],
        [{"next": 1}],
    ),
    "unevaluatedProperties": (
        {"type": "object", "allOf": [{"properties": {"a": True}}], "unevaluatedProperties": False},
        [{}, {"a": 1}],
        [{"b": 1}],
    ),
    "formats": (
        {
            "type": "array",
            "prefixItems": [
                {"format": "date"},
                {"format": "time"},
                {"format": "date-time"},
                {"format": "uuid"},
                {"format": "email"},
                {"format": "ipv4"},
                {"format": "ipv6"},
                {"format": "uri"},
                {"format": "duration"},
                {"format": "hostname"},
            ],
            "items": False,
        },
        [
            [
                "2024-02-29",
                "23:59:59.5Z",
                "2023-01-31T00:00:00+05:30",
                "123e4567-e89b-12d3-a456-426614174000",
                "a.b@example.com",
                "10.0.0.255",
                "::1",
                "https://x.org/a?b#c",
                "P1Y2M3DT4H",
                "my-host.example",
            ]
        ],
        [
            ["2023-02-29"],
            ["x", "24:00:00Z"],
            ["x", "x", "2023-01-01 00:00:00"],
            ["x"] * 3 + ["123"],
            ["x"] * 4 + ["no-at"],
            ["x"] * 5 + ["256.0.0.1"],
            ["x"] * 6 + ["1::2::3"],
            ["x"] * 7 + ["no scheme"],
            ["x"] * 8 + ["P1H"],
            ["x"] * 9 + ["-bad-"],
        ],
    ),
}
# JSON Schema validity of the "no" lists above where the jsonschema package lacks a format checker
UNCHECKED_FORMATS = {"formats"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_keyword(name):
    schema, yes, no = CASES[name]
    c = Constraint.from_json_schema(schema, strict=False)  # the spec's reading, as jsonschema
    checker = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    for value in yes:
        assert checker.is_valid(value), f"bad example: {value!r} is invalid"
        assert c.matches(json.dumps(value)), f"{name}: rejected {json.dumps(value)}"
    for value in no:
        if name not in UNCHECKED_FORMATS:
            assert not checker.is_valid(value), f"bad example: {value!r} is valid"
        for text in (json.dumps(value), json.dumps(value, separators=(",", ":"))):
            assert not c.matches(text), f"{name}: accepted {text}"


@pytest.mark.parametrize(
    "text, ok",
    [
        ('"\\u00e9"', True),
        ('"\\uD83D\\uDE00"', True),
        ('"\\ud83d"', True),
        ('"\\x"', False),
        ('"a\nb"', False),
        ('"\\/"', True),
    ],
)
def test_string_escapes(text, ok):
    assert Constraint.from_json_schema({"type": "string"}).matches(text) == ok


def test_min_length_counts_code_points_and_refuses_lone_surrogates():
    c = Constraint.from_json_schema({"type": "string", "minLength": 2, "maxLength": 2})
    assert c.matches('"\\u00e9\\u00e8"') and c.matches('"😀😀"') and c.matches('"\\ud83d\\ude00x"')
    assert not c.matches('"\\ud83d\\ude00"')  # one character
    assert not c.matches('"\\ud83dx"')


def test_patterns_formats_lengths_and_exclusions_combine():
    c = Constraint.from_json_schema(
        {"type": "string", "pattern": "a", "minLength": 3, "allOf": [{"pattern": "^[a-c]+$"}]}
    )
    assert c.matches('"cab"') and c.matches('"aaaa"')
    assert not c.matches('"ab"') and not c.matches('"bbb"') and not c.matches('"xaa"')
    no_a = Constraint.from_json_schema({"type": "string", "not": {"pattern": "a"}})
    assert no_a.matches('"bcd"') and not no_a.matches('"bad"')
    assert not no_a.matches('"b\\u0061d"')  # the only spelling of a string held canonical
    dated = Constraint.from_json_schema(
        {"format": "date", "not": {"enum": ["2024-01-01"]}, "maxLength": 10}
    )
    assert dated.matches('"2024-01-02"') and not dated.matches('"2024-01-01"')
    assert dated.matches("7")  # not a string: format and lengths do not apply


def test_min_and_max_properties_count_optional_and_additional_members():
    spec = functools.partial(Constraint.from_json_schema, strict=False)  # objects open
    one_of_them = spec(  # GitHub workflow's `defaults`
        {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1}
    )
    assert not one_of_them.matches("{}") and one_of_them.matches('{"x": 1}')
    assert one_of_them.matches('{"b": 1}') and one_of_them.matches('{"a": 1, "b": 2, "c": 3}')
    exactly_one = spec(  # CircleCI's steps: one key of several
        {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1, "maxProperties": 1}
    )
    assert exactly_one.matches('{"a": 1}') and exactly_one.matches('{"x": [1]}')
    for text in ("{}", '{"a": 1, "b": 2}', '{"a": 1, "x": 2}', '{"x": 1, "y": 2}'):
        assert not exactly_one.matches(text), text
    three = spec({"properties": {"a": {}, "b": {}}, "required": ["a"], "minProperties": 3})
    assert three.matches('{"a": 1, "b": 2, "x": 3}') and not three.matches('{"a": 1, "b": 2}')
    # two additional keys count as two, their keys checked distinct as the text is decoded
    assert three.matches('{"a": 1, "x": 2, "y": 3}')
    assert not three.matches('{"a": 1, "x": 2, "x": 3}')
    translations = Constraint.from_json_schema(  # a dict of at least two entries
        {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 2}
    )
    assert translations.matches('{"en": "hi", "fr": "salut"}')
    assert not translations.matches('{"en": "hi"}') and not translations.matches("{}")
    assert not translations.matches('{"en": "hi", "en": "hello"}')


def test_canonical_key_order_and_optional_subsets():
    c = Constraint.from_json_schema(
        {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "additionalProperties": False}
    )
    for keys in ("", "a", "b", "c", "ab", "ac", "bc", "abc"):
        assert c.matches("{" + ", ".join(f'"{k}": 1' for k in keys) + "}")
    # generation writes declaration order only (documented); texts are read in any order
    assert not matches_bytes(c, b'{"b": 1, "a": 1}')
    assert c.matches('{"b": 1, "a": 1}') and c.matches('{"c": 1, "a": 1, "b": 2}')
    assert not c.matches('{"b": 1, "a": 1, "b": 2}')  # each key at most once


def test_unconstrained_values_nest_without_bound():
    c = Constraint.from_json_schema({"type": "object"})  # "any value" is a recursive rule
    deep = '{"a": ' + "[" * 40 + '{"b": {"c": [1, "x", null, true]}}' + "]" * 40 + "}"
    assert c.matches('{"a": [1, "x"], "b": {"c": null}}') and c.matches(deep)
    assert not c.matches('{"a": [[1]}') and not c.matches('{"a": [1,]}')
    assert not c.matches(deep[:-1]) and not c.matches("[1]")


def test_any_depth_bounds_the_nesting_of_unconstrained_values():
    c = Constraint.from_json_schema({"type": "object"}, any_depth=1)
    assert c.matches('{"a": [1, "x"], "b": {"c": null}}')
    assert not c.matches('{"a": [[1]]}')
    assert Constraint.from_json_schema({"type": "object"}, any_depth=2).matches('{"a": [[1]]}')


def test_named_keys_are_not_reused_as_additional_keys():
    c = Constraint.from_json_schema(
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "additionalProperties": {"type": "string"},
        }
    )
    assert c.matches('{"a": 1, "b": "x"}')
    assert not c.matches('{"b": "x", "a": "x"}')
    assert not c.matches('{"a": 1, "a": "x"}')


def test_draft_07_ignores_the_siblings_of_ref():
    body = {
        "definitions": {"level": {"enum": ["debug", "info", "error"]}},
        "properties": {"quiet": {"$ref": "#/definitions/level", "enum": ["error"]}},
    }
    old = Constraint.from_json_schema(
        {"$schema": "http://json-schema.org/draft-07/schema#", **body}
    )
    new = Constraint.from_json_schema(body)  # 2020-12: $ref is one keyword among the others
    assert old.matches('{"quiet": "info"}') and not new.matches('{"quiet": "info"}')
    assert old.matches('{"quiet": "error"}') and new.matches('{"quiet": "error"}')
    assert not old.matches('{"quiet": "trace"}')


DRAFT_04 = "http://json-schema.org/draft-04/schema#"


@pytest.mark.parametrize(
    "schema",
    [
        {  # $id is not a keyword of draft-04: references inside resolve against the root
            "$schema": DRAFT_04,
            "definitions": {
                "a": {"$id": "http://other.example/a.json", "properties": {"b": {"$ref": "#/definitions/b"}}},
                "b": {"type": "integer"},
            },
            "properties": {"x": {"$ref": "#/definitions/a"}},
        },
        {  # its id is: a relative one is a resource of its own, pointers resolve inside it
            "$schema": DRAFT_04,
            "id": "http://x.example/root.json",
            "definitions": {
                "a": {"id": "sub/a.json", "definitions": {"b": {"type": "integer"}}, "properties": {"b": {"$ref": "#/definitions/b"}}},
            },
            "properties": {"x": {"$ref": "sub/a.json"}},
        },
    ],
)  # fmt: skip
def test_draft_04_documents_name_their_resources_with_id(schema):
    """(The first was refused before: `$ref '#/definitions/b': pointer does not resolve`.)"""
    c = Constraint.from_json_schema(schema, strict=False)
    validator = jsonschema.validators.validator_for(schema)(schema)
    for value in ({"x": {"b": 1}}, {"x": {"b": "s"}}, {"x": {}}):
        assert c.matches(json.dumps(value)) is validator.is_valid(value)


def test_dynamic_references_resolve_where_the_anchor_is_declared_once():
    tree = {
        "$id": "https://example.com/tree",
        "$dynamicAnchor": "node",
        "type": "object",
        "properties": {"kids": {"type": "array", "items": {"$dynamicRef": "#node"}}},
        "additionalProperties": False,
    }
    c = Constraint.from_json_schema(tree)
    assert c.matches('{"kids": [{"kids": [{}]}]}') and not c.matches('{"kids": [{"x": 1}]}')
    old = {"$recursiveAnchor": True, "items": {"$recursiveRef": "#"}, "type": "array"}
    assert Constraint.from_json_schema(old).matches("[[[]], []]")
    twice = {
        "$defs": {
            "a": {"$id": "a", "$dynamicAnchor": "node"},
            "b": {"$id": "b", "$dynamicAnchor": "node"},
        },
        "$dynamicRef": "a#node",
    }
    with pytest.raises(ConstraintError, match="declares that anchor more than once"):
        Constraint.from_json_schema(twice)


def test_recursive_references_nest_without_bound():
    schema = {
        "$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
        "$ref": "#/$defs/n",
    }
    nested = lambda d: "[" * d + "]" * d
    c = Constraint.from_json_schema(schema)
    assert c.matches(nested(1)) and c.matches(nested(60)) and c.matches("[[], [[]]]")
    assert not c.matches("[1]") and not c.matches("[[]") and not c.matches("[[1]]")
    tree = {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["v"],
        "additionalProperties": False,
    }
    t = Constraint.from_json_schema(tree)
    deep = '{"v": 1, "kids": [' * 30 + '{"v": 2}' + "]}" * 30
    assert t.matches(deep) and not t.matches(deep.replace('"v": 2', '"v": "2"'))


def test_recursion_under_allof_is_unrolled_to_a_bounded_depth():
    """Where the algebra must look inside a recursive reference (here: its meet with
    maxItems), the recursion is unrolled max_recursion_depth times instead."""
    schema = {
        "$defs": {
            "n": {"type": "array", "items": {"allOf": [{"$ref": "#/$defs/n"}, {"maxItems": 2}]}}
        },
        "$ref": "#/$defs/n",
    }
    nested = lambda d: "[" * d + "]" * d
    c = Constraint.from_json_schema(schema, max_recursion_depth=2)
    assert c.matches(nested(3)) and not c.matches(nested(4)) and not c.matches("[[[], [], []]]")
    assert Constraint.from_json_schema(schema, max_recursion_depth=4).matches(nested(5))


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"$dynamicRef": "#x"}, "$dynamicRef"),
        ({"type": "string", "format": 5}, "format must be a string at #/format"),
        ({"type": "string", "pattern": "(?<=ab)"}, "lookbehind"),
        ({"type": "integer", "multipleOf": 7}, "multipleOf 7"),
        (
            {"type": "integer", "multipleOf": 3, "minimum": 5, "maximum": 100000},
            "multipleOf 3 over a large integer range",
        ),
        (  # 29,999 multiples of 3 to list below 100,000
            {"type": "integer", "multipleOf": 3, "minimum": 10001},
            "multipleOf 3 over a large integer range",
        ),
        ({"type": "number", "multipleOf": 1.5}, "multipleOf 1.5 over non-integer numbers"),
        ({"type": "number", "multipleOf": 0.3, "minimum": 0}, "bounded range of at most 2,000"),
        ({"$ref": "https://example.com/other.json"}, "remote references"),
        ({"type": "string", "minLength": -1}, "non-negative integer at #/minLength"),
        ({"type": "strin"}, "unknown type 'strin'"),
        (False, "accepts no JSON value"),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "accepts no JSON value"),
        ({"type": "integer", "not": {"multipleOf": 37}}, "'not' over multipleOf 37"),
        ({"type": "number", "not": {"multipleOf": 0.3}}, "'not' over multipleOf 0.3"),
    ],
)
def test_refusals_name_keyword_and_path(schema, message):
    with pytest.raises(ConstraintError) as info:
        Constraint.from_json_schema(schema)
    assert message in str(info.value)


DRAFT3_CASES = [
    ({"properties": {"a": {"type": "string", "required": True}}}, ['{"a": "x"}'], ["{}"]),
    (
        {"properties": {"b": {"type": [{"type": "integer", "minimum": 3}, "null"]}}},
        ['{"b": 4}', '{"b": null}', "{}"],
        ['{"b": 2}', '{"b": "s"}'],
    ),
    (
        {"properties": {"c": {"disallow": ["string", {"type": "integer"}]}}},
        ['{"c": 1.5}', '{"c": null}'],
        ['{"c": 1}', '{"c": "s"}'],
    ),
    (
        {"properties": {"d": {"extends": {"type": "number"}, "divisibleBy": 2}}},
        ['{"d": 4}'],
        ['{"d": 3}', '{"d": "s"}'],
    ),
    ({"properties": {"e": {"type": "any"}}}, ['{"e": [1]}', '{"e": null}'], []),
    ({"dependencies": {"a": "b"}}, ['{"a": 1, "b": 2}', '{"b": 2}'], ['{"a": 1}']),
]


@pytest.mark.parametrize("schema, valid, invalid", DRAFT3_CASES)
def test_draft3_documents_read_as_later_drafts(schema, valid, invalid):
    schema = {"$schema": "http://json-schema.org/draft-03/schema#", "type": "object", **schema}
    c = Constraint.from_json_schema(schema)
    for text in valid + invalid:
        expected = jsonschema.Draft3Validator(schema).is_valid(json.loads(text))
        assert expected == (text in valid), text  # the cases agree with jsonschema
        assert c.matches(text) == expected, text


def test_draft3_keywords_are_unknown_in_other_drafts():
    """Outside draft-03 ``extends``/``disallow``/``divisibleBy`` are unknown keywords,
    ignored as annotations (as jsonschema's later-draft validators do)."""
    c = Constraint.from_json_schema({"type": "integer", "divisibleBy": 3, "extends": False})
    assert c.matches("4")


def test_references_to_metaschemas_resolve_to_bundled_copies():
    """GitHub-style schemas point at the JSON Schema metaschemas for "a schema here"; they
    resolve to jsonschema-specifications' copies (no network), other remote refs are refused."""
    pytest.importorskip("jsonschema_specifications")
    schema = {
        "type": "object",
        "properties": {
            "schema": {"$ref": "http://json-schema.org/draft-07/schema#"},
            "title": {"$ref": "http://json-schema.org/draft-04/schema#/properties/title"},
        },
    }
    c = Constraint.from_json_schema(schema)
    assert c.matches('{"schema": {"minLength": 2, "type": "string"}, "title": "t"}')
    assert c.matches('{"schema": true}')
    assert not c.matches('{"schema": {"type": "strin"}}')
    assert not c.matches('{"schema": {"minLength": -1}}')
    assert not c.matches('{"title": 5}')


def test_annotations_are_ignored():
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://x/y",
        "title": "T",
        "description": "d",
        "examples": [1],
        "default": 2,
        "$comment": "c",
        "deprecated": False,
        "readOnly": True,
        "type": "integer",
    }
    assert (
        Constraint.from_json_schema(schema).lark
        == Constraint.from_json_schema({"type": "integer"}).lark
    )


def test_pattern_does_not_depend_on_the_hash_seed():
    """The index cache (memory and disk) is keyed by the pattern: it must be the same in every
    process. Excluded-key sets are frozensets, whose order varies with PYTHONHASHSEED."""
    import os
    import subprocess
    import sys

    code = (
        "from lmprog.fsm import Constraint; print(Constraint.from_json_schema({'type': 'object', "
        "'properties': {'alpha': {}, 'beta': {}, 'gamma': {}, 'delta': {}}, "
        "'additionalProperties': {'type': 'integer'}}).cache_key)"
    )
    keys = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout
        for seed in (1, 2, 3)
    }
    assert len(keys) == 1, keys


def _nested_arrays(depth):
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_a_small_schema_cannot_ask_for_unbounded_work():
    """Each level of arrays once repeated its items in a regex: depth 60 (under 2 kB of schema)
    exhausted the memory. In the grammar each container is a rule, written once: the text grows
    with the schema. A schema whose grammar is large is refused at max_pattern_chars."""
    import time

    start = time.process_time()
    nested = Constraint.from_json_schema(_nested_arrays(60))
    assert time.process_time() - start < 5  # CPU seconds
    assert len(nested.lark) < 100 * 60 and nested.matches("[" * 59 + "[1, 2]" + "]" * 59)
    assert not nested.matches("[" * 58 + "[1, 2]" + "]" * 58)
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(500)}}
    with pytest.raises(ConstraintError, match="max_pattern_chars=10,000"):
        Constraint.from_json_schema(wide, max_pattern_chars=10_000)
    with pytest.raises(ConstraintError, match="max_pattern_chars=1,000"):
        Constraint.from_json_schema(wide, max_pattern_chars=1_000)
    assert Constraint.from_json_schema(wide).lark


def test_references_expanded_within_references_are_refused_at_the_work_limit():
    """Definitions that each intersect the root they are reached from (`$ref: "#"` beside other
    keywords, as in Renovate's schema) must be unrolled, and the unrolling multiplies: past
    MAX_WORK steps the schema is refused, after a bounded time."""
    import time

    def schema(n):
        defs = {
            f"d{i}": {"type": "object", "$ref": "#", "properties": {"x": {"type": "string"}}}
            for i in range(n)
        }
        props = {f"d{i}": {"$ref": f"#/definitions/d{i}"} for i in range(n)}
        return {"type": "object", "definitions": defs, "properties": props}

    small = Constraint.from_json_schema(schema(2))
    assert small.matches('{"d0": {"x": "a", "d1": {}}}') and not small.matches('{"d0": {"x": 1}}')
    start = time.process_time()
    with pytest.raises(ConstraintError, match="max_work=15,000"):
        Constraint.from_json_schema(schema(40))
    assert time.process_time() - start < 5  # CPU seconds (about 0.7 s here)


def test_deep_schemas_are_refused_with_the_limit_named():
    deep = {"type": "integer"}
    for _ in range(100):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ConstraintError, match="max_schema_depth=128"):
        Constraint.from_json_schema(deep)
    with pytest.raises(ConstraintError, match="max_schema_depth=128"):
        Constraint.from_json_schema(json.dumps(deep))
    with pytest.raises(ConstraintError, match="nests too deeply to parse"):
        Constraint.from_json_schema("[" * 100_000 + "]" * 100_000)
    assert Constraint.from_json_schema(deep, max_schema_depth=256).lark
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_schema_depth must be an int"):
            Constraint.from_json_schema({}, max_schema_depth=bad)


def test_deeply_nested_pydantic_models_give_a_constraint_error():
    import pydantic

    model = None
    for i in range(60):
        fields = {"x": (int, ...)} | ({"child": (model, ...)} if model is not None else {})
        model = pydantic.create_model(f"Level{i}", **fields)
    try:
        constraint = Constraint.from_json_schema(model)
    except ConstraintError as e:
        assert "nests too deeply" in str(e)
    else:
        assert constraint.lark  # (a pydantic that manages it: then it compiles)


def test_unknown_keywords_are_annotations_and_ignored(caplog):
    """JSON Schema: keywords an implementation does not know are ignored (vendor fields,
    draft-04's id, typos); the constraint is that of the schema without them."""
    import logging

    plain = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    noisy = {
        **plain,
        "id": "http://example.com/thing.json",
        "x-kubernetes-preserve-unknown-fields": True,
        "readonly": True,
        "properties": {"id": {"type": "integer", "sortIndex": 3, "x-go-name": "ID"}},
    }
    with caplog.at_level(logging.DEBUG, logger="lmprog.fsm.json_schema.read.builder"):
        assert Constraint.from_json_schema(noisy).lark == Constraint.from_json_schema(plain).lark
    assert "'x-kubernetes-preserve-unknown-fields' at # ignored" in caplog.text
    assert "'sortIndex' at #/properties/id ignored" in caplog.text


@pytest.mark.parametrize(
    "bounds, valid",
    [
        ({"minimum": 0, "exclusiveMinimum": True, "maximum": 3, "exclusiveMaximum": True}, [1, 2]),
        ({"minimum": 0, "exclusiveMinimum": False, "maximum": 3}, [0, 1, 2, 3]),
        ({"exclusiveMinimum": True, "maximum": 2}, [-1, 0, 1, 2]),  # nothing made exclusive
        ({"exclusiveMinimum": 0, "exclusiveMaximum": 3}, [1, 2]),  # 2019+ numbers still
    ],
)
def test_draft_04_boolean_exclusive_bounds(bounds, valid):
    c = Constraint.from_json_schema({"type": "integer", **bounds})
    assert [n for n in range(-1, 5) if c.matches(str(n))] == valid


def test_an_unknown_format_is_an_annotation():
    c = Constraint.from_json_schema({"type": "string", "format": "zip-code"})
    assert c.matches('"any text"') and c.matches('""') and not c.matches("5")


@pytest.mark.parametrize(
    "bounds",
    [
        {"minimum": 0},
        {"minimum": 0, "maximum": 1},
        {"exclusiveMinimum": 0.001, "exclusiveMaximum": 100},
        {"maximum": -0.001},
        {"minimum": -5, "maximum": 1e20},
    ],
)
def test_bounded_numbers_take_the_exponent_notation_of_json_dumps(bounds):
    """Floats json.dumps writes with an exponent (1e-05, 2.5e+16) are accepted where their
    whole decade is inside the bounds, never outside the bounds."""
    import random

    schema = {"type": "number", **bounds}
    c = Constraint.from_json_schema(schema)
    rng = random.Random(0)
    validator = jsonschema.Draft202012Validator(schema)
    for _ in range(300):
        x = rng.choice([1, -1]) * 10 ** rng.uniform(-30, 30)
        for text in (json.dumps(x), f"{x:e}", f"{x:.2E}", f"{x:.0e}".replace("e+", "e")):
            valid = validator.is_valid(json.loads(text))
            assert c.matches(text) <= valid, text  # never an invalid one
            if valid and "e" in json.dumps(x) and text == json.dumps(x):
                lo = bounds.get("minimum", bounds.get("exclusiveMinimum"))
                hi = bounds.get("maximum", bounds.get("exclusiveMaximum"))
                decade = 10 ** math.floor(math.log10(abs(x)))
                inside = sorted((x, math.copysign(decade, x), math.copysign(decade * 10, x)))
                if (lo is None or inside[0] > lo) and (hi is None or inside[-1] < hi):
                    assert c.matches(text), text


AVOIDED_STEPS = [
    {"type": "integer", "not": {"multipleOf": 2}},
    {"type": "number", "not": {"multipleOf": 2}},
    {"not": {"multipleOf": 3}},
    {"type": "integer", "not": {"multipleOf": 60}, "minimum": -5000},
    {"type": "number", "not": {"multipleOf": 0.5}},
    {"type": "number", "not": {"multipleOf": 0.25}, "exclusiveMaximum": 3},
    {"type": "integer", "minimum": 0, "maximum": 20, "not": {"multipleOf": 3}},
    {"type": "integer", "multipleOf": 2, "not": {"multipleOf": 4}},
    {"type": "number", "minimum": -5, "maximum": 5, "not": {"multipleOf": 0.3}},
    {"type": "integer", "not": {"multipleOf": 1.5}},
    {"type": "number", "not": {"multipleOf": 1}, "maximum": 100},
    {"oneOf": [{"type": "integer"}, {"type": "integer", "multipleOf": 3}]},
    {"not": {"anyOf": [{"multipleOf": 2}, {"multipleOf": 5}]}, "type": "integer"},
    {"if": {"multipleOf": 2}, "then": {"minimum": 10}, "else": {"maximum": 3}},
]


def _number_texts(rng):
    """Numbers as JSON writes them and near them: integers of 1-20 digits, decimals with
    trailing zeros, exponents, -0, multiples of small steps."""
    out = ["0", "-0", "-0.0", "0.000", "1e2", "4.0000000000000001", "12345678901234567890"]
    for _ in range(150):
        n = rng.choice([rng.randint(-30, 30), rng.randint(-(10**6), 10**6), rng.getrandbits(64)])
        out.append(str(n))
        out.append(f"{n}.{rng.choice(['0', '00', '5', '25', '3', '30', '1', '75', '0001'])}")
        out.append(f"{rng.choice([0.3, 0.25, 0.5, 1.5, 0.1]) * rng.randint(-40, 40):.6g}")
        out.append(f"{rng.uniform(-100, 100):.{rng.randint(0, 17)}f}")
    return out


def _float_agrees(text, schema):
    """Whether jsonschema's float division and exact arithmetic agree on whether the number
    is a multiple of each multipleOf in the schema (2.7 / 0.3 is not whole in floats)."""
    from fractions import Fraction

    steps = re.findall(r'"multipleOf": ([0-9.]+)', json.dumps(schema))
    x = json.loads(text)
    for m in steps:
        exact = (Fraction(text) / Fraction(m)).denominator == 1
        step = json.loads(m)
        floating = (
            x % step == 0
            if isinstance(x, int) and isinstance(step, int)
            else ((x / step) == int(x / step))
        )
        if exact != floating:
            return False
    return True


@pytest.mark.parametrize("schema", AVOIDED_STEPS, ids=lambda s: json.dumps(s)[:60])
def test_not_multiple_of_agrees_with_jsonschema(schema):
    """``not`` over ``multipleOf``: no number jsonschema rejects is accepted (floats read as
    jsonschema reads them: the 15-digit cap keeps its float division from finding a
    whole quotient the decimal lacks), every short canonical one it accepts is, and random
    walks through the token engine write valid instances only."""
    import random

    from fsm_toys import random_text

    c = Constraint.from_json_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(36)
    for text in _number_texts(rng):
        valid = validator.is_valid(json.loads(text))
        assert c.matches(text) <= valid, text
        short = len(text.lstrip("-").replace(".", "")) <= 14 and "e" not in text
        integral = "." in text and Decimal(text) % 1 == 0  # 4.0: not written under multipleOf
        canonical = text == json.dumps(json.loads(text))
        if valid and short and not integral and canonical and _float_agrees(text, schema):
            assert c.matches(text), text
    for _ in range(30):
        text = random_text(c, rng)
        if text is not None:
            assert validator.is_valid(json.loads(text)), text


SUFFIXES = ["id", "name", "at", "count", "url", "ref", "key", "tag"]


@pytest.mark.parametrize(
    "patterns",
    [
        {f"^.*_{w}$": {"type": "integer" if i % 2 else "string"} for i, w in enumerate(SUFFIXES)},
        {"^x-.*-a$": {"type": "integer"}, "^x-.*-b$": {"type": "string"}, "-": {"enum": [1, "s"]}},
    ],
    ids=["eight suffixes", "three patterns"],
)
def test_pattern_properties_that_cannot_overlap(patterns):
    """Patterns whose first characters may overlap but whose automata share no key (issue 36:
    eight suffix patterns made 256 key classes, refused past 64): exact against jsonschema
    over random objects of keys matching none, one or two of them."""
    import random

    schema = {"type": "object", "patternProperties": patterns, "additionalProperties": False}
    c = Constraint.from_json_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    keys = [f"{w[0]}_{w}" for w in SUFFIXES] + ["zz", "_id_name", "id", "x-1-a", "x--b", "x-a-"]
    rng = random.Random(36)
    for _ in range(400):
        obj = {k: rng.choice([1, "s", None]) for k in rng.sample(keys, rng.randint(0, 4))}
        text = json.dumps(obj)
        assert c.matches(text) == validator.is_valid(obj), text


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "multipleOf": 0.5},
        {"type": "number", "multipleOf": 0.25, "minimum": -2.5, "exclusiveMaximum": 3.75},
        {"type": "number", "multipleOf": 0.125, "exclusiveMinimum": 0},
        {"type": "number", "multipleOf": 0.2, "maximum": 0},
        {"type": "number", "multipleOf": 0.05, "minimum": -1, "maximum": 1},
        {"type": "number", "multipleOf": 1.5, "minimum": -4, "maximum": 4.5},
        {"type": "number", "multipleOf": 0.75, "exclusiveMinimum": -3, "exclusiveMaximum": 3},
        {"multipleOf": 0.5, "not": {"type": "integer"}},
    ],
    ids=lambda s: f"{s['multipleOf']}-{len(s)}",
)
def test_decimal_multiples_agree_with_exact_arithmetic(schema):
    """Every value n / 40 in [-5, 5], as its shortest decimal and with a trailing zero: the
    constraint accepts it exactly when it is in bounds and a whole multiple of the step
    (Fractions, not floats)."""
    from fractions import Fraction

    c = Constraint.from_json_schema(schema)
    step = Fraction(str(schema["multipleOf"]))
    lo = schema.get("minimum", schema.get("exclusiveMinimum"))
    hi = schema.get("maximum", schema.get("exclusiveMaximum"))
    for n in range(-200, 201):
        v = Fraction(n, 40)
        ok = (v / step).denominator == 1
        ok &= (
            lo is None or v > Fraction(str(lo)) or (v == Fraction(str(lo)) and "minimum" in schema)
        )
        ok &= (
            hi is None or v < Fraction(str(hi)) or (v == Fraction(str(hi)) and "maximum" in schema)
        )
        ok &= "not" not in schema or v.denominator != 1
        text = format(Decimal(v.numerator) / Decimal(v.denominator), "f")
        text = text.rstrip("0").rstrip(".") if "." in text else text
        for t in (text, text + ("0" if "." in text else ".0")):
            if t.startswith("-") and v == 0:
                continue
            assert c.matches(t) is ok, (t, ok)


@pytest.mark.parametrize("step", [3, 6, 15, 60])
@pytest.mark.parametrize(
    "bound", [("minimum", 5), ("minimum", -130), ("exclusiveMinimum", 345), ("maximum", -61),
              ("exclusiveMaximum", 99), ("maximum", 4000)]
)  # fmt: skip
def test_integer_multiples_over_a_range_open_on_one_side(step, bound):
    """Steps with a factor coprime to 10 (the divisibility automaton) beside one bound: every
    integer in [-700, 700] and a few large ones, against arithmetic."""
    side, b = bound
    c = Constraint.from_json_schema({"type": "integer", "multipleOf": step, side: b})
    keep = {
        "minimum": lambda v: v >= b,
        "exclusiveMinimum": lambda v: v > b,
        "maximum": lambda v: v <= b,
        "exclusiveMaximum": lambda v: v < b,
    }[side]
    for v in [*range(-700, 701), 10**6 + 20, -(10**6) - 20, 123456780, -987654300]:
        assert c.matches(str(v)) is (v % step == 0 and keep(v)), v


def _chain_schema(k):
    """A linked list whose allOf asks for k links (each a recursive node with a 'v')."""
    wanted: dict = {"required": ["next"]}
    for _ in range(k - 1):
        wanted = {"required": ["next"], "properties": {"next": wanted}}
    node = {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/n"}},
        "required": ["v"],
    }
    return {"$defs": {"n": node}, "allOf": [{"$ref": "#/$defs/n"}, wanted]}


@pytest.mark.parametrize("k", [4, 7])
def test_recursion_deeper_than_the_unroll_bound(k):
    """Instances of an allOf over a recursive reference that all nest deeper than
    max_recursion_depth (3): unrolled deeper instead of "accepts no JSON value" (issue 36);
    chains of 0..k+3 links, some links without 'v' or with a string one, against jsonschema
    (exact up to k links; past the depth unrolled, valid chains may be rejected)."""
    import random

    schema = _chain_schema(k)
    c = Constraint.from_json_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(k)
    for _ in range(120):
        value: dict = {"v": 1}
        links = rng.randint(0, k + 3)
        for _ in range(links):
            value = {"next": value, **rng.choice([{"v": 2}, {"v": 2}, {"v": "x"}, {}])}
        text = json.dumps(value)
        valid = validator.is_valid(value)
        assert c.matches(text) <= valid, text  # deeper than unrolled: a narrowing
        assert c.matches(text) == valid or links > k, text
    deepest: dict = {"v": 0}
    for _ in range(k):
        deepest = {"v": 1, "next": deepest}
    assert c.matches(json.dumps(deepest))


TYPES = ["string", "integer", "boolean", "null", "array", "object"]
SAMPLES = {"string": "s", "integer": 3, "boolean": True, "null": None, "array": [1], "object": {}}


@pytest.mark.parametrize(
    "schema",
    [
        {
            "oneOf": [
                {"type": "object", "properties": {f"p{i}": {"type": TYPES[i % 6]}}, "required": [f"p{i}"]}
                for i in range(8)
            ]
        },
        {
            "type": "object",
            "allOf": [
                {"if": {"properties": {f"k{i}": {"const": "x"}}, "required": [f"k{i}"]},
                 "then": {"required": [f"v{i}"]}}
                for i in range(6)
            ],
        },
    ],
    ids=["oneOf of 8 objects", "allOf of 6 if-then"],
)  # fmt: skip
def test_complements_of_required_typed_keys_stay_linear(schema):
    """not (k required, of type T) is one term (k absent, or not of type T), not two: a oneOf
    of 8 such objects was 2**7 terms a branch and refused past 512 (issue 36, "schema too
    complex"); exact against jsonschema over random objects."""
    import random

    c = Constraint.from_json_schema(schema, strict=False)
    validator = jsonschema.Draft202012Validator(schema)
    keys = [f"p{i}" for i in range(8)] + [f"k{i}" for i in range(6)] + [f"v{i}" for i in range(6)]
    rng = random.Random(36)
    for _ in range(250):
        obj = {k: rng.choice(["x", *SAMPLES.values()]) for k in rng.sample(keys, rng.randint(0, 4))}
        text = json.dumps(obj)
        assert c.matches(text) == validator.is_valid(obj), text
