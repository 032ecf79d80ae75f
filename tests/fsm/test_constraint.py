"""Constraint values: constructors, matching, parsing, identity."""

import json

import pytest
from pydantic import BaseModel, Field

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.index import BYTES, TokenIndex, matches_bytes


def test_regex_constraint_is_whole_string():
    c = Constraint.from_regex(r"\d{3}-\d{4}")
    assert (c.kind, c.source, c.pattern) == ("regex", r"\d{3}-\d{4}", "[0-9]{3}-[0-9]{4}")
    assert c.matches("555-1234")
    assert not c.matches("555-12345") and not c.matches("x555-1234")
    assert c.parse("555-1234") == "555-1234"
    with pytest.raises(ConstraintError, match="does not match"):
        c.parse("nope")


def test_choices_escape_metacharacters():
    c = Constraint.from_choices(["a.b", "(c)", "yes"])
    assert c.kind == "choices" and c.source == ("a.b", "(c)", "yes")
    assert c.matches("a.b") and c.matches("(c)") and c.matches("yes")
    assert not c.matches("axb") and not c.matches("ye")
    for bad in ([], "abc", [1, 2]):
        with pytest.raises(ConstraintError):
            Constraint.from_choices(bad)


@pytest.mark.parametrize(
    "dtype, good, bad",
    [
        # SGLang's patterns (REGEX_INT, REGEX_FLOAT, REGEX_BOOL, REGEX_STR); a number ends at
        # a terminator (space, newline, punctuation), followed by anything in its token: the
        # gen stops there (SGLang's typed numbers end at " " or "\n")
        (
            int,
            {"0": 0, "-17": -17, "42 ": 42, "4 2": 4, "24 hours": 24, "7.\n": 7, "+3": 3, "007": 7},
            ["x1", "", " 4", "4a", "--1", "+"],
        ),
        (
            float,
            {"1.5": 1.5, "3": 3.0, "2.5\n": 2.5, "2.5, 3": 2.5, ".5": 0.5, "+1.5": 1.5},
            ["1.", "1e3", "nan", " 1", "1.x", "2a"],
        ),
        (bool, {"True": True, "False": False}, ["true", "TRUE", "1", "yes"]),
        (
            str,
            {'"hi"': "hi", '"Paris France"': "Paris France", '""': "", '"a\tb\n"': "a\tb\n"},
            ['"a', 'a"', '"a,b"', r'"a\"b"', '"\u00e9"'],
        ),
    ],
)
def test_dtypes_match_and_parse(dtype, good, bad):
    c = Constraint.from_dtype(dtype)
    assert c.kind == "dtype" and Constraint.from_dtype(dtype.__name__) == c
    for text, value in good.items():
        assert c.parse(text) == value and type(c.parse(text)) is dtype
    for text in bad:
        assert not c.matches(text), text


def test_unsupported_dtype():
    with pytest.raises(ConstraintError, match="dtype"):
        Constraint.from_dtype(list)


def test_json_schema_from_dict_string_and_pydantic_are_the_same_constraint():
    class Point(BaseModel):
        x: int = Field(ge=0)
        y: int

    as_dict = Constraint.from_json_schema(Point.model_json_schema())
    assert Constraint.from_json_schema(Point) == as_dict
    assert Constraint.from_json_schema(json.dumps(Point.model_json_schema())) == as_dict
    assert as_dict.matches('{"x": 1, "y": -2}') and not as_dict.matches('{"x": -1, "y": 2}')
    assert as_dict.parse('{"x":1,"y":2}') == '{"x":1,"y":2}'  # json_schema parses to its text


def test_values_are_hashable_with_stable_cache_keys():
    a = Constraint.from_json_schema({"type": "integer"})
    b = Constraint.from_json_schema({"type": "integer"})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a.cache_key == b.cache_key and len(a.cache_key) == 64
    assert a.cache_key != Constraint.from_json_schema({"type": "number"}).cache_key
    assert Constraint.from_regex("a") != Constraint.from_choices(["a"])  # same pattern, other kind
    with pytest.raises(AttributeError):
        a.pattern = "x"


def test_whitespace_option():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    default = Constraint.from_json_schema(schema)
    # generation writes what `whitespace` allows (the constraint's own grammar)
    assert matches_bytes(default, b'{"a": 1}') and matches_bytes(default, b'{"a":1}')
    assert not matches_bytes(default, b'{"a":  1}') and not matches_bytes(default, b'{\n"a": 1}')
    loose = Constraint.from_json_schema(schema, whitespace=r"[ \n]{0,2}")
    assert matches_bytes(loose, b'{\n "a":1\n}') and loose != default
    assert not matches_bytes(loose, b'{"a":   1}')
    # Texts are read in any JSON whitespace, whatever generation writes (a tool's output,
    # json.dumps(indent=2)); only JSON's own four characters
    for c in (default, loose):
        assert c.matches('{"a": 1}') and c.matches('{"a":1}') and c.matches('{"a":  1}')
        assert c.matches('{\n  "a": 1\n}\n') and c.matches(' \t{"a" :\r\n1 } ')
        assert not c.matches('{\u00a0"a": 1}') and not c.matches('{"a": 1}}')
        assert not c.matches('{\n  "a": "1"\n}')
    with pytest.raises(ConstraintError, match="lookbehind"):
        Constraint.from_json_schema(schema, whitespace="(?<=  ) ")


def test_errors_raise_at_construction():
    with pytest.raises(ConstraintError, match="lookbehind"):
        Constraint.from_regex("(?<=ab)b")
    with pytest.raises(ConstraintError, match="unknown type 'strin' at #/properties/a/type"):
        Constraint.from_json_schema({"properties": {"a": {"type": "strin"}}})
    with pytest.raises(ConstraintError, match="not valid JSON"):
        Constraint.from_json_schema("{not json")
    with pytest.raises(TypeError):
        Constraint.from_json_schema(42)


def test_compilers_import_without_torch_or_outlines():
    import subprocess
    import sys

    code = (
        "import sys, lmprog.fsm; lmprog.fsm.Constraint.from_json_schema({'type': 'object'}); "
        "print(sorted(m for m in ('torch', 'outlines_core', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "schema",
    [
        False,
        {"not": {}},
        {"allOf": [{"type": "string"}, {"type": "integer"}]},
        {"type": "object", "properties": {"a": False}, "required": ["a"]},
        {"type": "array", "items": False, "minItems": 1},
    ],
)
def test_a_schema_that_accepts_no_value_matches_nothing_when_read(schema):
    """strict=False (the spec's reading, for validation): a schema no value is valid under is
    a constraint no text matches, as jsonschema judges every instance invalid; generating
    from it is a ConstraintError where its index is built. strict=True (generation) refuses
    it where it is given."""
    import jsonschema

    read = Constraint.from_json_schema(schema, strict=False)
    assert read.accepts_nothing and read.reading is read
    for text in ["1", '"x"', "{}", '{"a": 1}', "[]", "[1]", "null", "", "a"]:
        assert not read.matches(text)
    for value in [1, "x", {}, {"a": 1}, [], [1], None]:
        assert not jsonschema.Draft202012Validator(schema).is_valid(value)
    with pytest.raises(ConstraintError, match="nothing can be generated"):
        TokenIndex.get(read, BYTES)
    with pytest.raises(ConstraintError, match="accepts no JSON value"):
        Constraint.from_json_schema(schema)
    assert not Constraint.from_json_schema({"type": "integer"}, strict=False).accepts_nothing
