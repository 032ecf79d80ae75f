"""Guide: the per-sequence cursor (advance, EOS, rollback, copy) and random-walk properties."""

from __future__ import annotations

import random
import re

import pytest
from fsm_toys import byte_level_tokenizer, is_prefix_of_a_match, random_walk
from hypothesis import given, settings
from hypothesis import strategies as st

from lmprog.fsm.index import TokenIndex
from lmprog.fsm.vocab import TokenVocab

ABC = TokenVocab((b"a", b"b", b"ab", None), eos_token_id=3)

PATTERNS = [
    r"(ab)+",
    r"-?(0|[1-9][0-9]*)(\.[0-9]{1,3})?",
    r'\{"name":"[a-z ]{0,6}","ok":(true|false)\}',
    r"(cat|dog|bird)s?( and (cat|dog))?",
    r"[αβγ]{1,4}é?",
    r"(true|false|null)",
    r"[A-Z][a-z]{0,5}( [A-Z][a-z]{0,5}){0,2}\.",
]


@pytest.fixture(scope="module")
def toy():
    return byte_level_tokenizer()


def test_advance_allowed_and_stop():
    guide = TokenIndex.get("(ab)+", ABC).new_guide()
    # "ab" is forced here: the mask allows its own tokenization ("ab"), any spelling advances
    assert guide.allowed_token_ids().tolist() == [2] and not guide.can_stop()
    assert guide.is_allowed(0) and guide.is_allowed(2) and not guide.is_allowed(1)
    guide.advance(0)
    assert guide.allowed_token_ids().tolist() == [1]
    guide.advance(1)
    assert guide.can_stop() and not guide.is_finished()
    assert guide.allowed_token_ids().tolist() == [0, 2, 3]
    guide.advance(3)  # EOS
    assert guide.is_finished() and guide.eos_consumed and guide.num_tokens == 3
    assert guide.allowed_token_ids().tolist() == []
    with pytest.raises(ValueError, match="after EOS"):
        guide.advance(0)


def test_disallowed_token_raises_and_keeps_state():
    guide = TokenIndex.get("(ab)+", ABC).new_guide()
    state = guide.state
    with pytest.raises(ValueError, match="not allowed"):
        guide.advance(1)
    with pytest.raises(ValueError, match="EOS is not allowed"):
        guide.advance(3)
    with pytest.raises(ValueError, match="special token"):
        TokenIndex.get("a", TokenVocab((b"a", None, None), eos_token_id=2)).new_guide().advance(1)
    assert guide.state == state and guide.num_tokens == 0


def test_advance_all_is_atomic():
    guide = TokenIndex.get("(ab)+", ABC).new_guide()
    with pytest.raises(ValueError):
        guide.advance_all([2, 0, 0])
    assert guide.num_tokens == 0
    guide.advance_all([2, 0, 1, 3])
    assert guide.eos_consumed


def test_rollback_and_copy_are_independent():
    guide = TokenIndex.get("(ab)+", ABC).new_guide()
    guide.advance_all([2, 0])
    fork = guide.copy()
    fork.advance(1)
    assert fork.can_stop() and not guide.can_stop()
    fork.advance(3)
    fork.rollback(2)  # EOS and "b"
    assert fork.state == guide.state and not fork.eos_consumed and not fork.can_stop()
    assert fork.allowed_token_ids().tolist() == guide.allowed_token_ids().tolist() == [1]
    with pytest.raises(ValueError, match="cannot roll back"):
        guide.rollback(3)
    guide.rollback(2)
    assert guide.num_tokens == 0 and guide.allowed_token_ids().tolist() == [2]
    assert fork.allowed_token_ids().tolist() == [1]  # the fork kept its own position


def test_finished_when_only_eos_remains():
    guide = TokenIndex.get("ab", ABC).new_guide()
    guide.advance(2)
    assert guide.is_finished() and guide.can_stop() and not guide.eos_consumed


def test_length_message_says_whether_the_match_is_complete():
    guide = TokenIndex.get("(ab)+", ABC).new_guide()
    guide.advance(0)
    assert "incomplete" in guide.length_message()
    guide.advance(1)
    assert "complete match" in guide.length_message() and "incomplete" not in guide.length_message()


def test_walk_spells_unicode_from_byte_tokens(toy):
    index = TokenIndex.get(r"[αβγ]{1,4}é?", toy)
    guide = index.new_guide()
    ids = toy.encode("βγé", add_special_tokens=False)
    guide.advance_all(ids)
    assert guide.can_stop() and index.vocab.decode(ids).decode() == "βγé"


@settings(max_examples=60, deadline=None)
@given(pattern=st.sampled_from(PATTERNS), seed=st.integers(0, 2**32 - 1))
def test_random_walks_yield_matching_text(toy, pattern, seed):
    index = TokenIndex.get(pattern, toy)
    guide = index.new_guide()
    out = random_walk(guide, random.Random(seed), limit=60)
    text = index.vocab.decode(out).decode("utf-8", "replace")
    if guide.eos_consumed:  # EOS only where the text is a whole match
        assert re.fullmatch(pattern, text), (pattern, text)
        assert guide.is_finished()
    else:  # cut by the limit or finished: always a prefix of a match
        assert is_prefix_of_a_match(pattern, index.vocab.decode(out).decode("utf-8", "ignore"))


def test_every_prefix_of_a_match_is_walkable(toy):
    # Completeness: the byte-level tokenization of any valid text is accepted token by token.
    index = TokenIndex.get(PATTERNS[2], toy)
    for text in ['{"name":"ab c","ok":true}', '{"name":"","ok":false}']:
        guide = index.new_guide()
        guide.advance_all(toy.encode(text, add_special_tokens=False))
        assert guide.can_stop()
