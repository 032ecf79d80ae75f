"""A string's maxLength counted beside its pattern (json_schema.terms.lengths) where one lexeme holding
both is too big: issue 28's word-count pattern beside maxLength 2000 decodes exactly through
Constraint.matches and through the tokens of the real tokenizer, and masks near the bound stay
exact (random walks end valid, never stuck)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from fsm_toys import byte_level_tokenizer, random_walk

from lmprog.core.models import load_tokenizer, resolve_model
from lmprog.fsm.constraint import Constraint
from lmprog.fsm.index import TokenIndex
from lmprog.fsm.json_schema.terms.lengths import LengthCount, decode
from lmprog.fsm.json_schema.terms.nodes import StrT

WORDS = r"^$|(^(?:\S+\s+){0,499}\S+$)"  # a summary of at most 500 words


def _schema(max_len: int = 2000, min_len: int = 0, pattern: str = WORDS) -> dict:
    d = {"type": "string", "minLength": min_len, "maxLength": max_len, "pattern": pattern}
    return {
        "type": "object",
        "properties": {"d": d},
        "required": ["d"],
        "additionalProperties": False,
    }


def _text(words: int) -> str:
    return '{"d": "' + " ".join(f"w{i % 10}" for i in range(words)) + '"}'


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model())


def test_issue_28_snippet():
    c = Constraint.from_json_schema(_schema())
    assert c.matches('{"d": "a b"}')
    assert c.matches('{"d": "' + " ".join(f"w{i}" for i in range(300)) + '"}')
    assert c.matches('{"d": "a b"}')
    assert Constraint.from_json_schema(_schema()).matches('{"d": "a b"}')


def test_word_counts_and_the_length_bound_are_exact():
    c = Constraint.from_json_schema(_schema())
    assert "{0,2000}" not in c.lark and c.check is not None  # counted apart, not in the lexeme
    for words in (0, 1, 300, 500):
        assert c.matches(_text(words)), words
    assert not c.matches(_text(501))  # the pattern's bound
    for char, spelled in (("x", "x"), ("é", "é"), ("😀", "😀"), ('"', '\\"'), ("\\", "\\\\")):
        assert c.matches('{"d": "' + spelled * 2000 + '"}'), char
        assert not c.matches('{"d": "' + spelled * 2001 + '"}'), char
    assert c.matches('{"d": "' + "x" * 1998 + ' x"}')
    assert not c.matches('{"d": "' + "x" * 1999 + ' x"}')
    assert not c.matches('{"d": " x"}') and not c.matches('{"d": "x "}')


def test_a_minimum_length_stays_in_the_lexeme():
    c = Constraint.from_json_schema(_schema(max_len=60, min_len=5))
    assert c.check is not None
    assert not c.matches('{"d": "a b"}') and c.matches('{"d": "ab cd"}')
    assert c.matches('{"d": "' + "a " * 29 + 'bc"}') and not c.matches(
        '{"d": "' + "a " * 30 + 'b"}'
    )


@pytest.mark.parametrize("words", [1, 300, 500])
def test_the_tokens_of_long_values_are_allowed(tok, words):
    index = TokenIndex.get(Constraint.from_json_schema(_schema()), tok)
    guide = index.new_guide()
    for token in tok.encode(_text(words), add_special_tokens=False):
        assert guide.bitmask_words()[token >> 5] >> (token & 31) & 1
        guide.advance(token)
    assert guide.can_stop()
    assert index.new_guide().bitmask_words().any()


@pytest.mark.parametrize(("min_len", "max_len"), [(0, 40), (8, 30)])
def test_random_walks_reach_the_bound_and_end_valid(tok, min_len, max_len):
    """Uniform token walks run into maxLength: every one ends in a valid value (no dead end:
    a mask with nothing allowed would raise), most of them at exactly maxLength."""
    schema = _schema(max_len, min_len)
    index = TokenIndex.get(Constraint.from_json_schema(schema), tok)
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(0)
    lengths = []
    for _ in range(12):
        guide = index.new_guide()
        text = tok.decode(random_walk(guide, rng, greed=0.05, limit=200))
        assert guide.can_stop(), text
        assert validator.is_valid(json.loads(text)), text
        lengths.append(len(json.loads(text)["d"]))
    assert lengths.count(max_len) >= 6, lengths


def test_random_walks_over_a_byte_level_vocabulary_end_valid():
    schema = _schema(max_len=24)
    index = TokenIndex.get(Constraint.from_json_schema(schema), byte_level_tokenizer())
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(1)
    for _ in range(40):
        guide = index.new_guide()
        text = index.vocab.decode(random_walk(guide, rng, greed=0.1, limit=120)).decode()
        assert guide.can_stop() and validator.is_valid(json.loads(text)), text


def test_distinct_items_and_counted_lengths_together():
    schema = {"type": "array", "uniqueItems": True, "items": _schema()["properties"]["d"]}
    c = Constraint.from_json_schema(schema)
    assert c.matches('["a b", "' + "x" * 2000 + '"]')
    assert not c.matches('["a b", "a b"]')
    assert not c.matches('["a b", "' + "x" * 2001 + '"]')


def test_where_the_length_stays_in_the_lexeme():
    small = _schema(max_len=10, pattern=r"^[a-z]+@[a-z]+$")  # a small product: one lexeme
    assert Constraint.from_json_schema(small).check is None
    two = {"anyOf": [_schema()["properties"]["d"], {"type": "string", "maxLength": 3}]}
    c = Constraint.from_json_schema(two)  # two string terms of one value: the grammar decides
    assert "{0,2000}" in c.lark
    assert c.matches('"' + "x" * 2000 + '"') and not c.matches('"' + "x" * 2001 + '"')
    assert c.matches('"   "') and not c.matches('"    "')


def test_a_composed_grammar_keeps_the_length_in_its_lexeme():
    """The server's tool calls embed a schema's grammar, which then runs without its check."""
    from lmprog.fsm import compose as c

    args = Constraint.from_json_schema(_schema(max_len=300))
    assert args.check is not None
    call = c.seq(c.json_text('{"name": "f", "arguments": '), c.embed(args), c.json_text("}"))
    tool = c.constraint(call, "a tool call")
    assert tool.check is None
    assert tool.matches('{"name": "f", "arguments": {"d": "' + "x" * 300 + '"}}')
    assert not tool.matches('{"name": "f", "arguments": {"d": "' + "x" * 301 + '"}}')


def test_decode_counts_code_points_as_json_schema_does():
    assert decode(b"a\\u00e9\\ud83d\\ude00\\ud83d x") == ([97, 0xE9, 0x1F600, 0xD83D, 32, 120], b"")
    assert decode("é😀".encode()[:-1]) == ([0xE9], "😀".encode()[:-1])
    assert decode(b"a\\ud83d") == ([97], b"\\ud83d")  # a low surrogate may follow
    assert decode(b"a\\ud83d", final=True) == ([97, 0xD83D], b"")
    assert decode(b"\\ud83d\\n") == ([0xD83D, 10], b"")
    assert decode(b"\\u00") == ([], b"\\u00")


def test_a_character_begun_fits_only_if_one_it_may_become_does():
    count = LengthCount(StrT(max_len=3, patterns=(r"^a*[é😀]$",)))
    q = count.read(0, 0, b"", b"aa")[0]
    assert count.fits(q, 2, b"") and not count.fits(q, 3, b"")
    assert count.fits(q, 2, "é".encode()[:1]) and count.fits(q, 2, "😀".encode()[:2])
    assert not count.fits(q, 2, "ß".encode()[:1][:0] + b"\xd0")  # a Cyrillic letter: not [é😀]
