"""Texts read in every JSON spelling (issue 36): ``Constraint.matches`` (a constraint's
``spelled``) takes each string character under enum/const/pattern/format and in keys in any
of its JSON spellings -- itself, ``\\uXXXX`` in either hex case, a surrogate pair past the BMP,
a short escape, ``\\/`` -- and an integer with a zero fraction (``2.0``); generation keeps
the canonical spelling. Judged by jsonschema, on random values in random spellings."""

import functools
import importlib.util
import json
import random

import jsonschema
import pytest
from fsm_toys import json_spelled

from lmprog.core.errors import ConstraintError
from lmprog.core.models import BUNDLED_MODELS, DEFAULT_MODEL
from lmprog.fsm import Constraint, json_schema
from lmprog.fsm.index import matches_bytes

CAFE = {"type": "string", "pattern": "^[a-zé]+$"}


def _all_read(schema: dict, value, rng: random.Random, n: int = 8) -> bool:
    c = Constraint.from_json_schema(schema, strict=False)
    texts = [json.dumps(value), json.dumps(value, ensure_ascii=False)]
    texts += [json_spelled(value, rng) for _ in range(n)]
    return all(c.matches(t) for t in texts)


@pytest.mark.parametrize(
    "schema, value",
    [
        ({"enum": ["café", "x"]}, "café"),
        ({"const": "naïve"}, "naïve"),
        (CAFE, "café"),
        ({"const": "a/b \"q\" \\ \n\t😀"}, "a/b \"q\" \\ \n\t😀"),
        ({"type": "string", "pattern": "^[^a]😀$"}, "é😀"),
        ({"type": "string", "format": "date"}, "2024-02-29"),
        ({"type": "string", "format": "email", "maxLength": 9}, "a.b@x.com"),
        ({"properties": {"é": {"type": "integer"}}, "required": ["é"], "additionalProperties": False}, {"é": 1}),
        ({"patternProperties": {"^ü": {"type": "integer"}}, "additionalProperties": False}, {"üx": 1, "ü": 2}),
        ({"propertyNames": {"pattern": "^[a-zß]+$"}}, {"groß": 1, "a": [1]}),
        ({"propertyNames": {"enum": ["ö", "/"]}}, {"ö": 1, "/": 2}),
        ({"type": "array", "items": {"enum": ["é", "e", "😀"]}, "uniqueItems": True}, ["é", "e", "😀"]),
        ({"type": "string", "pattern": "^(é)\\1$"}, "éé"),
        ({"type": "string", "not": {"enum": ["é", "a"]}}, "b"),
        ({"type": "string", "minLength": 2, "maxLength": 2}, "😀é"),
    ],
)  # fmt: skip
def test_valid_instances_are_read_in_every_spelling(schema, value):
    assert jsonschema.Draft202012Validator(schema).is_valid(value)
    assert _all_read(schema, value, random.Random(json.dumps(schema)))


@pytest.mark.parametrize(
    "schema, text",
    [
        (CAFE, '"caf\\u00C9"'),  # an escape of a character the pattern refuses
        (CAFE, '"caf\\u00e9\\u0041"'),
        ({"enum": ["café"]}, '"caf\\u00e8"'),
        ({"const": "😀"}, '"\\ud83d"'),  # a lone surrogate where the schema needs a character
        ({"const": "😀"}, '"\\ude00\\ud83d"'),
        ({"type": "string", "pattern": "^😀$"}, '"\\ud83d"'),
        ({"type": "string", "pattern": "^..$"}, '"\\ud83d\\ude00"'),  # one character, not two
        ({"type": "string", "pattern": "^a", "maxLength": 3}, '"ab\\u0063d"'),  # past maxLength
        ({"type": "string", "pattern": "^a", "maxLength": 3}, '"ab\\n\\/"'),
        ({"type": "string", "not": {"enum": ["é", "a"]}}, '"\\u00E9"'),
        ({"type": "string", "not": {"pattern": "^é"}}, '"\\u00e9x"'),
        ({"properties": {"é": {"type": "integer"}}, "additionalProperties": False}, '{"\\u00e9": "1"}'),
        ({"propertyNames": {"pattern": "^[a-z]+$"}}, '{"\\u00e9": 1}'),
        ({"type": "array", "items": {"enum": ["é", "e"]}, "uniqueItems": True}, '["\\u00e9", "é"]'),
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, '["\\u0061", "a"]'),
        ({"type": "string", "pattern": "^(é)\\1$"}, '"\\u00e9e"'),
    ],
)  # fmt: skip
def test_invalid_spellings_are_refused(schema, text):
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    assert not Constraint.from_json_schema(schema, strict=False).matches(text)


def test_generation_keeps_the_canonical_spelling():
    for schema in (CAFE, {"enum": ["café", "x"]}, {"properties": {"é": {"type": "integer"}}}):
        c = Constraint.from_json_schema(schema, strict=False)
        assert c.lark == json_schema.build_grammar(schema, strict=False).lark
        assert c.spelled.lark != c.lark and dict(c.spelled.options)["read_spellings"] is True
    c = Constraint.from_json_schema(CAFE)
    assert matches_bytes(c, '"café"'.encode()) and not matches_bytes(c, b'"caf\\u00e9"')
    assert c.matches('"caf\\u00e9"')
    # a key in two spellings is a key written twice, refused as that is (test_key_order)
    c = Constraint.from_json_schema({"properties": {"é": {"type": "integer"}}}, strict=False)
    assert c.matches('{"\\u00e9": 1}') and not c.matches('{"\\u00e9": 1, "é": 2}')
    n = Constraint.from_json_schema({"type": "integer"})
    assert not matches_bytes(n, b"2.0") and n.matches("2.0")


@pytest.mark.parametrize(
    "schema, good, bad",
    [
        ({"type": "integer"}, ["2.0", "-0.0", "7.000"], ["2.5", "2.01", "-0.5"]),
        ({"type": "integer", "minimum": 2}, ["2.0", "30.00"], ["1.0", "-2.0"]),
        ({"type": "integer", "multipleOf": 3}, ["6.0", "-3.0"], ["7.0"]),
        ({"type": "integer", "not": {"multipleOf": 3}}, ["7.0"], ["6.0", "0.0"]),
        ({"type": "integer", "minimum": 0, "maximum": 9, "not": {"const": 3}}, ["4.0"], ["3.0"]),
        ({"not": {"type": "integer"}}, ["2.5", "1.01"], ["2.0", "3"]),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, ["[1, 2.0]"], ["[1, 1.0]"]),
    ],
)  # fmt: skip
def test_integers_are_read_with_a_zero_fraction(schema, good, bad):
    """Draft 6 on counts 2.0 an integer (jsonschema does): reading takes it where the bounds,
    steps and exclusions take the integer."""
    c = Constraint.from_json_schema(schema, strict=False)
    validator = jsonschema.Draft202012Validator(schema)
    for text, want in [(t, True) for t in good] + [(t, False) for t in bad]:
        assert validator.is_valid(json.loads(text)) == want, text
        assert c.matches(text) == want, text


# ---- random string schemas, random values in random spellings -----------------------------
ALPHABET = ["a", "b", "z", "é", "ß", "😀", "/", '"', "\\", "\t", " ", "-", "\x01", "\u00a0"]
PATTERNS = ["^[a-zé]*$", "é", "^.{1,3}$", "[^a-z]", "^(a|😀)+$", "\\s", "^[a-z/]+$", '^"', "^.$"]


def _string_schema(rng: random.Random) -> dict:
    kind = rng.randrange(5)
    if kind == 0:
        return {"enum": [_string(rng) for _ in range(rng.randint(1, 4))]}
    if kind == 1:
        return {"const": _string(rng)}
    s: dict = {"type": "string", "pattern": rng.choice(PATTERNS)}
    if rng.random() < 0.4:
        s["maxLength"] = rng.randint(1, 4)
    if rng.random() < 0.3:
        s["not"] = {"enum": [_string(rng) for _ in range(2)]}
    if kind == 3:
        return {"type": "object", "propertyNames": s, "additionalProperties": {"type": "integer"}}
    if kind == 4:
        key = _string(rng)
        return {
            "properties": {key: s},
            "required": [key],
            "patternProperties": {"^é": {"type": "integer"}},
        }
    return s


def _string(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 4)))


def _value(rng: random.Random, schema: dict):
    if "enum" in schema and rng.random() < 0.5:
        return rng.choice(schema["enum"])
    if "const" in schema and rng.random() < 0.5:
        return schema["const"]
    if "properties" in schema and rng.random() < 0.6:
        key = next(iter(schema["properties"]))
        return {key: _string(rng), "é" + _string(rng): rng.choice([1, "1"])}
    if "propertyNames" in schema:
        return {_string(rng): rng.choice([1, 2.0, "x"]) for _ in range(rng.randint(0, 3))}
    return _string(rng)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_strings_in_random_spellings(seed):
    """Every spelling of a valid value accepted, of an invalid one refused."""
    rng = random.Random(seed)
    compiled = valid = invalid = 0
    for _ in range(40):
        schema = _string_schema(rng)
        try:
            c = Constraint.from_json_schema(schema, strict=False)
        except ConstraintError:
            continue
        compiled += 1
        validator = jsonschema.Draft202012Validator(schema)
        for _ in range(12):
            value = _value(rng, schema)
            ok = validator.is_valid(value)
            valid, invalid = valid + ok, invalid + (not ok)
            for text in [json.dumps(value)] + [json_spelled(value, rng) for _ in range(3)]:
                assert c.matches(text) == ok, (schema, text)
    assert compiled >= 35 and valid >= 60 and invalid >= 60, (compiled, valid, invalid)


@pytest.mark.parametrize(
    "schema, good",
    [
        ({"type": "number", "multipleOf": 0.5}, ["1e+20", "1.5e+20", "-2E3", "5e0", "1.25e2"]),
        ({"type": "integer"}, ["1e2", "1.5e1", "-3E+05", "1e307"]),
        ({"type": "integer", "minimum": 0, "maximum": 1000}, ["1e2", "1.5e2", "9.99e2"]),
        ({"type": "number", "multipleOf": 1, "maximum": -10}, ["-1e2", "-2.5e+1"]),
    ],
)  # fmt: skip
def test_integral_numbers_are_read_with_an_exponent(schema, good):
    """``json.dumps`` writes a large float with an exponent; read where its value is an
    integer and its whole decade is inside the bounds (every integer a multiple)."""
    c = Constraint.from_json_schema(schema, strict=False)
    assert all(jsonschema.Draft202012Validator(schema).is_valid(json.loads(t)) for t in good)
    assert all(c.matches(t) for t in good)
    assert not matches_bytes(c, good[0].encode())  # generation writes no exponent here


NUMBER_SCHEMAS = [
    {"type": "number", "multipleOf": 0.5},
    {"type": "number", "multipleOf": 0.25, "maximum": -10},
    {"type": "integer"},
    {"type": "integer", "minimum": 0, "maximum": 1000},
    {"type": "integer", "multipleOf": 3},
    {"type": "integer", "exclusiveMinimum": 100},
    {"type": "integer", "maximum": -1e20},
    {"type": "integer", "minimum": 1e5, "maximum": 1e300},
    {"type": "integer", "not": {"multipleOf": 3}},
    {"not": {"type": "integer"}},
    {"type": "number", "minimum": 0},
]


def test_random_exponents_accepted_only_where_valid():
    """No number text read that jsonschema refuses (an exponent past a float's range reads
    inf, a mantissa with more fraction digits than E is not an integer)."""
    rng = random.Random(36)
    mantissas = ["1", "5", "9", "1.5", "2.25", "1.125", "3.0", "7.00001", "1.2345678901234567"]
    exponents = ["0", "1", "2", "3", "5", "16", "17", "20", "22", "300", "307", "308", "400"]
    accepted = 0
    for schema in NUMBER_SCHEMAS:
        c = Constraint.from_json_schema(schema, strict=False)
        validator = jsonschema.Draft202012Validator(schema)
        for _ in range(150):
            text = rng.choice(["", "-"]) + rng.choice(mantissas) + rng.choice("eE")
            text += rng.choice(["", "+", "-"]) + rng.choice(["", "0"]) + rng.choice(exponents)
            if c.matches(text):
                accepted += 1
                assert validator.is_valid(json.loads(text)), (schema, text)
    assert accepted >= 300


def test_a_length_counted_apart_counts_decoded_characters():
    """A maxLength the guide's check counts (``lengths``) counts each spelling as the one
    character it decodes to: 2,000 escaped é or escaped pairs fit, 2,001 do not."""
    words = r"^$|(^(?:\S+\s+){0,499}\S+$)"
    schema = {"type": "string", "maxLength": 2000, "pattern": words}
    c = Constraint.from_json_schema(schema, strict=False)
    assert c.check is not None and "{0,2000}" not in (c.spelled.lark or "")
    for spelled in ("\\u00e9", "\\u00E9", "é", "\\ud83d\\ude00", "\\/"):
        assert c.matches('"' + spelled * 2000 + '"'), spelled
        assert not c.matches('"' + spelled * 2001 + '"'), spelled


def test_the_token_reader_keeps_repeated_patterns_canonical_within_llguidances_limits():
    """A counted repetition of spelled characters (CloudFormation's identifiers:
    ``(?:-?[a-zA-Z0-9]){0,62}``) passes llguidance's lexer limits when masks explore a
    model's vocabulary; so the token-level ``reading`` spells literals (the key ``Id``) but
    keeps a repeated pattern's characters canonical, while ``matches`` reads every spelling
    over bytes."""
    ident = {"type": "string", "pattern": "^[a-zA-Z]{1}(?:-?[a-zA-Z0-9]){0,62}$"}
    schema = {"type": "object", "properties": {"Id": ident, "Version": {"type": "string"}}}
    c = Constraint.from_json_schema(schema, strict=False)
    assert dict(c.reading.options)["read_spellings"] == json_schema.LITERALS
    text = json.dumps({"Id": "o-tijM-6-41Lf-0-c-Z", "Version": "5.0"}, indent=2)
    assert _token_read(c, text)
    assert _token_read(c, '{"\\u0049d": "o-ab", "Version": "\\u00e9\\ud83d\\ude00\\/"}')
    assert not _token_read(c, '{"Id": "\\u006f-ab"}')  # the pattern's characters: canonical
    assert c.matches('{"Id": "\\u006f-ab", "Version": "\\u00e9"}')


# ---- the token reader (Constraint.reading over the default model's vocabulary) ------------
_PACKAGE, _, _INSTALL = BUNDLED_MODELS[DEFAULT_MODEL]
requires_default_model = pytest.mark.skipif(
    importlib.util.find_spec(_PACKAGE) is None,
    reason=f"the default model's package {_PACKAGE!r} is not installed ({_INSTALL})",
)


@functools.cache
def _tokenizer():
    from lmprog.core.models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model())


def _token_read(c: Constraint, text: str) -> bool:
    """Whether a guide of ``c.reading``'s index over the default model's tokens reads ``text``
    (as prefilled text is read) to a point where it may stop."""
    from lmprog.fsm.index import TokenIndex

    tok = _tokenizer()
    guide = TokenIndex.get(c.reading, tok).new_guide()
    for t in tok.encode(text, add_special_tokens=False):
        if not guide.is_allowed(t):
            return False
        guide.advance(t)
    return guide.can_stop()


GROESSE = {
    "type": "object",
    "properties": {"Größe": {"enum": ["groß", "klein", "😀/"]}, "n": {"type": "integer"}},
    "required": ["Größe"],
    "additionalProperties": False,
}
LITERAL_SCHEMAS = [  # literals read in every spelling through the tokens
    (GROESSE, {"Größe": "groß", "n": 2.0}),
    (GROESSE, {"Größe": "😀/", "n": 1e20}),
    ({"const": "naïve \"q\" \\ \n"}, "naïve \"q\" \\ \n"),
    ({"type": "array", "items": {"enum": ["é", "e", "😀"]}, "uniqueItems": True}, ["é", "e", "😀"]),
    ({"propertyNames": {"enum": ["ö", "/"]}}, {"ö": 1, "/": [2]}),
    ({"properties": {"é": {"type": "integer"}}, "additionalProperties": {"type": "string"}}, {"é": 1, "ß😀": "ü"}),
    ({"type": "string", "pattern": "^(Größe|über)$"}, "Größe"),  # a pattern without repetition
    ({"type": "string", "not": {"enum": ["é", "a"]}}, "è😀/"),
    ({"type": "string", "maxLength": 2}, "😀/"),  # free strings: pairs and \/ count one
    ({"type": "string", "minLength": 2, "maxLength": 3}, "😀é/"),
    ({"type": "integer", "minimum": 2}, 30.0),
    ({"type": "number", "multipleOf": 0.5}, 1e20),
]  # fmt: skip


@requires_default_model
@pytest.mark.parametrize("schema, value", LITERAL_SCHEMAS)
def test_the_token_reader_reads_every_spelling_of_literals(schema, value):
    """``json.dumps``'s default (``ensure_ascii=True``: ``"Gr\\u00f6\\u00dfe"``), indented, and
    random spellings of keys, enum/const strings, free strings and numbers through the model's
    tokens; each text also judged by jsonschema and ``matches``."""
    assert jsonschema.Draft202012Validator(schema).is_valid(value)
    c = Constraint.from_json_schema(schema, strict=False)
    rng = random.Random(json.dumps(schema))
    texts = [json.dumps(value), json.dumps(value, indent=2, ensure_ascii=False)]
    texts += [json_spelled(value, rng, escape=0.5) for _ in range(4)]
    for text in texts:
        assert c.matches(text) and _token_read(c, text), text


@requires_default_model
@pytest.mark.parametrize(
    "schema, text",
    [
        (GROESSE, '{"Gr\\u00f7\\u00dfe": "klein"}'),  # an escape of another character
        (GROESSE, '{"Gr\\u00f6\\u00dfe": "gro\\u00dd"}'),
        (GROESSE, '{"Gr\\u00f6\\u00dfe": "\\ud83d/"}'),  # half a surrogate pair
        (GROESSE, '{"Gr\\u00f6\\u00dfe": "\\ude00\\ud83d/"}'),
        (GROESSE, '{"Gr\\u00f6\\u00dfe": "groß", "n": 2.5}'),
        (GROESSE, '{"Gr\\u00f6\\u00dfe": "groß", "n": 1e-20}'),
        ({"properties": {"é": {"type": "integer"}}, "additionalProperties": {"type": "string"}}, '{"\\u00e9": "1"}'),
        ({"properties": {"é": {"type": "integer"}}, "additionalProperties": {"type": "string"}}, '{"\\u00e8": 1}'),
        ({"type": "string", "not": {"enum": ["é", "a"]}}, '"\\u00E9"'),
        ({"type": "string", "not": {"enum": ["é", "a"]}}, '"\\u0061"'),
        ({"type": "array", "items": {"enum": ["é", "e"]}, "uniqueItems": True}, '["\\u00e9", "é"]'),
        ({"type": "string", "maxLength": 1}, '"\\ud83d\\ude00\\/"'),
        ({"type": "string", "pattern": "^(Größe|über)$"}, '"Gr\\u00f6\\u00dfee"'),
    ],
)  # fmt: skip
def test_the_token_reader_refuses_invalid_spellings(schema, text):
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    c = Constraint.from_json_schema(schema, strict=False)
    assert not _token_read(c, text) and not c.matches(text)


@requires_default_model
def test_the_token_reader_on_random_strings_in_random_spellings():
    """``_string_schema``'s random enum/const/pattern/key schemas, random values in random
    spellings through the tokens: no invalid text read; a valid one read in its canonical
    spelling, and in every spelling where no pattern repeats its characters (the literals)."""
    rng = random.Random(37)
    valid = invalid = spelled = 0
    for _ in range(40):
        s = _string_schema(rng)
        try:
            c = Constraint.from_json_schema(s, strict=False)
        except ConstraintError:
            continue
        validator = jsonschema.Draft202012Validator(s)
        literal = "pattern" not in json.dumps(s)
        for _ in range(5):
            value = _value(rng, s)
            ok = validator.is_valid(value)
            valid, invalid = valid + ok, invalid + (not ok)
            texts = [json.dumps(value, ensure_ascii=False), json.dumps(value)]
            texts.append(json_spelled(value, rng, escape=0.5))
            for n, text in enumerate(texts):
                read = _token_read(c, text)
                assert read == ok if n == 0 or literal else not read or ok, (s, text)
                spelled += read and n > 0 and literal
    assert valid >= 40 and invalid >= 40 and spelled >= 30, (valid, invalid, spelled)
