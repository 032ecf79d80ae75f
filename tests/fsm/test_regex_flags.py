"""Inline flags ((?i), (?s), (?m), scoped (?i:...)), \\A/\\Z, word boundaries and one-character
lookbehinds in JSON Schema patterns: each read exactly as Python's ``re`` searches (the
validators people run), checked on every short string over the pattern's alphabet through the
value matcher and through the token engine, or refused naming the construct."""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest
import regex

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.json_schema.terms.values import pattern_matcher
from lmprog.fsm.regex import ANY_CHAR, CharSet, compile_user_regex, cs, parse_regex
from lmprog.fsm.regex.casefold import fold


@pytest.mark.parametrize(
    "cls, chars, negated",
    [
        ("[a-z]", cs("a-z"), False),
        ("[^k-s]", cs("k-s"), True),
        ("\u0130", CharSet.of("\u0130"), False),
        ("[\u0370-\u03ff]", cs("\u0370-\u03ff"), False),
        ("[\U00010400-\U0001044f]", cs("\U00010400-\U0001044f"), False),
    ],
)
def test_case_folding_is_pythons_on_every_code_point(cls, chars, negated):
    """``fold`` (a class under (?i)) admits exactly the code points ``re`` does: ``s`` and
    ``ſ``, ``k`` and the Kelvin sign, ``İ`` and ``ı``, Greek final sigma, Deseret."""
    python = re.compile("(?i)" + cls)
    folded = ANY_CHAR - fold(chars) if negated else fold(chars)
    scalars = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    want = [cp for cp in scalars if python.fullmatch(chr(cp))]
    assert [cp for cp in scalars if chr(cp) in folded] == want


CASES = [
    (r"(?i)^[a-c]+$", "aBc-"),
    (r"(?i)ab|^C", "aAbBc"),
    (r"(?i)[^a]b", "aAbB-"),
    (r"a(?i:b)c", "abcABC"),
    (r"(?i)a(?-i:b)", "aAbB"),
    (r"(?s)a.b", "ab\n."),
    (r"(?s:.)x|^y", "xy\n"),
    (r"(?m)^ab$", "ab\n"),
    (r"(?m)^a|b$", "ab\n"),
    (r"(?ms)^a.$", "ab\n"),
    (r"(?m)^(a\n)?b", "ab\n"),
    (r"\A[^\n]*\Z", "a\n"),
    (r"\bab\b", "ab -"),
    (r"a:\b(b|cd)\b:", "a:bcd"),
    (r"((1[0-2]|\d)\.?\b){2}", "12.a"),
    (r"^[a-z0-9-]+(?<!-)$", "a0-"),
    (r"(?<=a)b|\Bc", "abc "),
    (r"^a\B", "ab-"),
    (r"\B-|a\B", "a-"),
    (r"x\b|^\b", "x_ "),
    (r"(?i)\bab", "aAb-"),
    (r"(?<![0-9])[0-9]{2}(?![0-9])", "0a"),
    (r"^([a-z\d]|[a-z\d]([a-z\d-](?!--))*[a-z\d])$", "a-1"),  # lookaheads that move
    (r"^(-?)P(?=\d|T\d)(?:(\d+)Y)?(?:T(?:(\d+)H)?)?$", "P1YT-H"),
    (r"(?=[a-z]+)((?!ab\.).*)|(\$x)", "ab.$x"),
    (r"(?!\s*$).+", " a"),
    (r"a(?=bc)|c(?!ab)", "abc"),
    (r"(?=(ab)+c)a", "abc"),
    (r"^(?=a(?!b))..|(?=a\b)", "ab "),
]


REGEX_MODULE_CASES = [  # flags past the start, which re refuses: the regex module's reading
    (r"^(0.5|1|2)\s*(?i)GB$", "1 gGb"),
    (r"^(?:a(?i)b|c)$", "aAbBcC"),
    (r"(?i)a(?-i)b|c", "aAbBcC"),
    (r"^(?:a(?i))b", "aAbB"),
    (r"^a(?s).|b(?m)$", "ab\n"),
    (r"^[\w-.~]+$|^[.-\d]$", "a-.~,1"),  # a class escape beside '-': the '-' itself
]


def _texts(alphabet: str) -> list[str]:
    short = ["".join(t) for n in range(5) for t in itertools.product(alphabet, repeat=n)]
    rng = random.Random(0)
    return short + ["".join(rng.choices(alphabet, k=rng.randint(5, 9))) for _ in range(200)]


@pytest.mark.parametrize(
    "pattern, alphabet, python",
    [(p, a, re) for p, a in CASES] + [(p, a, regex) for p, a in REGEX_MODULE_CASES],
)
def test_flags_and_assertions_search_as_python_does(pattern, alphabet, python):
    values = pattern_matcher(pattern)
    tokens = Constraint.from_json_schema({"type": "string", "pattern": pattern})
    for text in _texts(alphabet):
        want = python.search(pattern, text) is not None
        assert bool(values.fullmatch(text)) == want, repr(text)
    for text in _texts(alphabet)[:400]:
        want = python.search(pattern, text) is not None
        assert tokens.matches(json.dumps(text)) == want, repr(text)


@pytest.mark.parametrize(
    "pattern, construct",
    [
        (r"(?x)a b", "inline flag 'x'"),
        (r"(?a)\w", "inline flag 'a'"),
        (r"(?<=ab)c", "lookbehind of other than one character class"),
        (r"(?m)a$\nb", "multiline anchor"),
        (r"(?m)x^a", "multiline anchor"),
        (r"\b(?<=ab)", "lookbehind of other than one character class"),
        (r"\b[a-z]{500}", "too large"),
        # lookaheads from a moving position whose automaton is too large, longer lookbehinds
        (r"(?!ab)[a-c]{1,200}x", "not anchored at its start"),
        (r"(?=a[a-c]{150})", "not anchored at its start"),
        (r"^(?<!ab)b", "lookbehind"),
    ],
)
def test_what_stays_inexact_is_refused(pattern, construct):
    with pytest.raises(ConstraintError, match=re.escape(construct)):
        Constraint.from_json_schema({"type": "string", "pattern": pattern})


@pytest.mark.parametrize(
    "pattern, alphabet",
    [(r"(?i)ab", "aAbB"), (r"(?m)^a\n?$", "a\n"), (r"\ba-?\b", "a-"), (r"a(?=b).", "ab")],
)
def test_a_gen_regex_matches_the_whole_text_as_fullmatch_does(pattern, alphabet):
    """A gen's regex (Python dialect) matches the whole output: assertions and multiline
    anchors see the text's edges, not characters around a match."""
    emitted = re.compile(compile_user_regex(pattern))
    for text in _texts(alphabet):
        assert bool(emitted.fullmatch(text)) == bool(re.fullmatch(pattern, text)), repr(text)


@pytest.mark.parametrize("pattern", [r"a\bb", r'"^a$"', r"x(?<=y)"])
def test_a_pattern_no_string_matches_leaves_no_string(pattern):
    """As for a validator, whose search never finds it: the string there is impossible (the
    rest of the schema still compiles); a gen's regex that matches nothing is refused."""
    c = Constraint.from_json_schema({"anyOf": [{"type": "integer"}, {"pattern": pattern}]})
    assert c.matches("1") and not c.matches('"ab"') and not c.matches('"a\\nb"')
    assert not c.matches(json.dumps(pattern))
    with pytest.raises(ConstraintError, match="no text can satisfy"):
        compile_user_regex(pattern)


def test_word_characters_are_json_schemas():
    """``\\b`` sees ``[A-Za-z0-9_]`` as word characters, as ``\\w`` reads in a JSON Schema
    pattern (ECMA-262), so ``é`` is not one."""
    values = pattern_matcher(r"\bb")
    assert values.fullmatch("éb") and not values.fullmatch("ab")
    assert [b.start for b in parse_regex(r"(?i)\bK", "ecma").branches] == [True, True, False, False]
