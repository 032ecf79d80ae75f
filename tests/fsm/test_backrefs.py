"""Patterns with backreferences (regex.backrefs, json_schema.terms.matched): the grammar holds
the pattern widened, the guide's check matches the real one on the decoded string. Judged by
jsonschema: valid instances accepted, invalid ones refused, generated strings valid, masks
refusing exactly the tokens after which no match can follow."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import regex
from fsm_toys import assert_random_texts_valid, byte_level_tokenizer, random_text

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.index import BYTES, TokenIndex
from lmprog.fsm.regex import parse_regex
from lmprog.fsm.regex.backrefs import backreferences

WORD_TWICE = r"^(\w+)-\1$"
QUOTED = r"^(?<q>['x]).{0,3}\k<q>$"  # ECMA's named group; `re` (jsonschema) cannot read it
NOT_ALL_SAME = r"^(?!(\d)\1{3})\d{4}$"  # the CPF/phone-number shape: a lookahead over it
DOUBLED = r"(a)\1"  # unanchored: any text can be followed by a match


def _obj(pattern: str, **more: object) -> dict:
    d = {"type": "string", "pattern": pattern, **more}
    return {"type": "object", "properties": {"d": d}, "required": ["d"]}


def _quoted_ok(s: str) -> bool:  # QUOTED, written out
    return 2 <= len(s) <= 5 and s[0] in "'x" and s[-1] == s[0] and "\n" not in s[1:-1]


def test_the_widened_pattern_is_a_superset_and_python_reads_the_real_one():
    found = backreferences(WORD_TWICE)
    assert found is not None
    assert found.widened == r"^(\w+)-(?:(?:\w+)?)$" and found.python == r"^(\w+)-(?:\1)$"
    named = backreferences(QUOTED)
    assert named is not None and named.python == r"^(?P<q>['x]).{0,3}(?:\1)$"
    # inside a negative lookahead the reference matches nothing: the lookahead's body shrinks,
    # the pattern grows (here to every 4 digits)
    lookahead = backreferences(NOT_ALL_SAME)
    assert lookahead is not None and r"(\d)[^\s\S]{3}" in lookahead.widened
    twice = backreferences(r"(?!(?!(a)\1))b")  # two negations: widened again
    assert twice is not None and "(?:(?:a)?)" in twice.widened
    assert backreferences(r"[\1]") is None and backreferences("abc") is None
    for pattern in (WORD_TWICE, QUOTED, NOT_ALL_SAME, DOUBLED, r"(a)(b\1)\2"):
        b = backreferences(pattern)
        assert b is not None
        widened = parse_regex(b.widened, "ecma")
        rng = random.Random(pattern)
        for _ in range(300):
            s = "".join(rng.choice("ab'x-0123") for _ in range(rng.randint(0, 6)))
            if regex.search(b.python, s):
                assert _search(widened, s), (pattern, s)


def _search(parsed, s: str) -> bool:
    from lmprog.fsm.regex import value_matcher

    return value_matcher(parsed).fullmatch(s) is not None


@pytest.mark.parametrize(
    "pattern, why",
    [
        (r"(a\1)", "not closed before it"),
        (r"\1(a)", "not closed before it"),
        (r"(a)\2", "group 2"),
        (r"(?i)(a)\1", "inline flags"),
        (r"\k<x>(?<x>a)", "not closed before it"),
        (r"(?<x>a)\k<y>", "named 'y'"),
    ],
)
def test_references_without_a_reading_are_refused(pattern, why):
    with pytest.raises(ConstraintError, match=why):
        Constraint.from_json_schema({"type": "string", "pattern": pattern})


CASES = [
    (_obj(WORD_TWICE), ["abc-abc", "a-a", "x_1-x_1"], ["abc-ab", "abc-abd", "-", "ab-abc", "a-"]),
    (_obj(NOT_ALL_SAME), ["1231", "0001", "9899"], ["1111", "0000", "123", "12345"]),
    (_obj(DOUBLED), ["xaay", "aa", "baab"], ["a", "xay", ""]),
    (_obj(DOUBLED, maxLength=3, minLength=2), ["aa", "aab"], ["a", "aaaa", "ab"]),
    ({"type": "string", "not": {"pattern": DOUBLED}}, ["a", "xay", ""], ["xaay", "aa"]),
    (
        {"type": "array", "items": {"pattern": r"^(.)\1$"}, "uniqueItems": True},
        [["aa", "bb"], [], [1, "cc"]],
        [["aa", "aa"], ["ab"], ["aa", "a"]],
    ),
    ({"enum": ["aa", "ab", 3], "pattern": r"^(.)\1$"}, ["aa", 3], ["ab", "bb"]),
    (
        {"type": "string", "allOf": [{"pattern": WORD_TWICE}, {"pattern": r"^[a-c]"}]},
        ["ab-ab"],
        ["x-x", "ab-ac"],
    ),
    # a quantifier after a reference
    ({"type": "string", "pattern": r"^(ab?)\1*$"}, ["a", "abab", "aaa"], ["aba", "ab a", ""]),
    # `regex` finds no match of this in "baab" where `re` does: a pattern to avoid is matched
    # by either, one to match by both
    (
        {"type": "string", "not": {"pattern": r"([ab]*)(a+)\1?\1?$"}},
        ["b", "", "bb"],
        ["baab", "a", "ba"],
    ),
    # (matched by both: "baab" is rejected there, a narrowing)
    ({"type": "string", "pattern": r"([ab]*)(a+)\1?\1?$"}, ["ba", "a"], ["b", ""]),
    # (?<name>...) and \k<name> are ECMA's: jsonschema's `re` cannot read them
    (_obj(QUOTED), ["'ab'", "xx", "x'x"], ["'ab", "'abx", "xabcdx", "a"]),
]


@pytest.mark.parametrize("schema, valid, invalid", CASES)
def test_matches_is_jsonschema(schema, valid, invalid):
    c = Constraint.from_json_schema(schema, strict=False)
    assert c.check is not None or "enum" in schema
    wrap = "properties" in schema
    named = QUOTED in json.dumps(schema).replace("\\\\", "\\")
    validator = jsonschema.Draft202012Validator(schema)
    for value, expected in [(v, True) for v in valid] + [(v, False) for v in invalid]:
        instance = {"d": value} if wrap else value
        if not named:
            assert validator.is_valid(instance) == expected, value
        else:
            assert _quoted_ok(value) == expected, value
        assert c.matches(json.dumps(instance)) == expected, value


@pytest.mark.parametrize(
    "schema, like",
    [
        (_obj(WORD_TWICE), '{"d": "ab-ab"}'),
        ({"type": "array", "items": {"pattern": NOT_ALL_SAME}, "minItems": 1}, '["1231"]'),
        ({"type": "string", "pattern": DOUBLED}, '"xaa"'),
        ({"type": "string", "not": {"pattern": DOUBLED}}, '"xab"'),
    ],
)
def test_random_texts_are_valid(schema, like):
    assert_random_texts_valid(schema, like, walks=80, least=25)


def test_random_texts_of_a_named_reference_match_it():
    c = Constraint.from_json_schema(_obj(QUOTED), strict=False)
    rng = random.Random(0)
    texts = [t for t in (random_text(c, rng, '{"d": "xabx"}') for _ in range(80)) if t]
    assert len(texts) > 25
    for text in texts:
        assert _quoted_ok(json.loads(text)["d"]), text


def test_masks_refuse_exactly_the_tokens_no_match_can_follow():
    tok = byte_level_tokenizer()
    c = Constraint.from_json_schema({"type": "string", "pattern": WORD_TWICE})
    index = TokenIndex.get(c, tok)
    vocab = index.vocab
    for prefix in ('"abc', '"abc-', '"abc-a', '"abc-abc', '"ab-ab'):
        guide = index.new_guide()
        guide.advance_all(vocab.token_id(bytes([b])) for b in prefix.encode())
        allowed = set(guide.allowed_token_ids().tolist())
        for token, data in enumerate(vocab.token_bytes):
            if data is None:
                continue
            text = (prefix + data.decode("utf-8", "replace"))[1:]
            body, quote, rest = text.partition('"')
            if not quote:
                expected = _grammar_allows(c, prefix + data.decode("utf-8", "replace")) and bool(
                    regex.search(WORD_TWICE, body, partial=True)
                )
            else:
                expected = not rest and bool(regex.search(WORD_TWICE, body))
            assert (token in allowed) == expected, (prefix, data)


def _grammar_allows(c: Constraint, text: str) -> bool:
    """Whether the text is a prefix the grammar (the widened pattern) allows."""
    guide = TokenIndex.get(c, BYTES).new_guide()
    for byte in text.encode():
        if not guide.is_allowed(byte):
            return False
        guide.advance(byte)
    return True


def test_the_closing_quote_is_refused_until_the_string_matches():
    c = Constraint.from_json_schema({"type": "string", "pattern": WORD_TWICE})
    guide = TokenIndex.get(c, BYTES).new_guide()
    guide.advance_all(b'"ab-a')
    assert not guide.is_allowed(ord('"')) and not guide.is_allowed(ord("c"))
    guide.advance(ord("b"))
    assert guide.is_allowed(ord('"')) and not guide.is_allowed(ord("b"))
    guide.advance(ord('"'))
    assert guide.can_stop()


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "patternProperties": {r"^(a)\1$": {}}},
        {"type": "object", "propertyNames": {"pattern": r"^(a)\1$"}},
        {"anyOf": [{"type": "string", "pattern": r"^(a)\1$"}, {"type": "string", "maxLength": 1}]},
        {"type": "array", "contains": {"type": "string", "pattern": r"^(a)\1$"}},
    ],
)
def test_places_the_check_cannot_read_are_refused(schema):
    with pytest.raises(ConstraintError, match="backreference"):
        Constraint.from_json_schema(schema, strict=False)


def test_a_composed_grammar_refuses_it():
    from lmprog.fsm.compose import _lengths_in_lexemes

    c = Constraint.from_json_schema({"type": "string", "pattern": DOUBLED})
    with pytest.raises(ConstraintError, match="backreference"):
        _lengths_in_lexemes(c)


@pytest.mark.parametrize(
    "pattern, chars, qs",
    [
        (WORD_TWICE, "abcd-", ("", "ab", "ab-", "abc-ab")),
        (r"^(a+)b\1$", "aaab", ("", "a", "aa", "aab")),
        (r"^(?:(x)|y)+-\1?z$", "xyy-", ("", "x", "xy", "xy-")),
    ],
)
def test_fits_each_is_fits_in_fewer_matches(pattern, chars, qs):
    """A mask's plain tokens are matched in text order, a token that an allowed one extends
    taking that one's verdict where it fits: the verdicts of one match per token, in fewer."""
    from lmprog.fsm.json_schema.terms.matched import PatternMatch
    from lmprog.fsm.json_schema.terms.nodes import StrT

    match = PatternMatch(StrT(patterns=(pattern,)))
    rng = random.Random(pattern)
    words = {"".join(rng.choice(chars) for _ in range(rng.randint(2, 6))) for _ in range(300)}
    texts = sorted(words | {w[:k] for w in words for k in range(2, len(w))})
    calls = 0
    compiled = match._partial[0]

    class Counting:
        def search(self, s, **kw):
            nonlocal calls
            calls += 1
            return compiled.search(s, **kw)

    match._partial = (Counting(),)
    for q in qs:
        calls = 0
        got = match.fits_each(q, texts)
        assert got == [bool(compiled.search(q + t, partial=True)) for t in texts], q
        if sum(got) > len(texts) / 2:  # (a mask's tokens mostly fit: the grammar's own)
            assert calls < 0.8 * len(texts), q  # (three probes included)
