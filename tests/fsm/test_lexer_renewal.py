"""One request never breaks a constraint for the others: the guides of an index share one
llguidance lexer, which stays spent once a limit is hit; the index then renews it, the guide
that met the error goes on from a matcher of its own, and only a text past the limits fails."""

from __future__ import annotations

import pytest

from lmprog.core.errors import ConstraintError
from lmprog.fsm import index as index_mod
from lmprog.fsm.constraint import Constraint
from lmprog.fsm.index import TokenIndex, clear_memory_cache, lexer_renewals
from lmprog.fsm.vocab import TokenVocab

# ids:       0     1     2      3
ABC = TokenVocab((b"a", b"b", b"ab", None), eos_token_id=3)
# the lexer meets a new state at almost every byte (it remembers the last nine)
PATTERN = "(a|b)*a(a|b){8}"
HEAVY = [0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1] * 4
# 9-letter windows, nearly all distinct: more lexer states than MAX_LEXER_STATES
LONG = "".join(format(i, "09b") for i in range(100, 200)).translate(str.maketrans("01", "ab"))
MATCH = [1, 0, 1, 1, 0, 0, 1, 0, 1, 0]  # "babbaababa": an a, then eight more letters


@pytest.fixture(autouse=True)
def _small_lexer(monkeypatch):
    monkeypatch.setattr(index_mod, "MAX_LEXER_STATES", 60)
    clear_memory_cache()
    yield
    clear_memory_cache()


def _walk(guide, tokens) -> None:
    for token in tokens:
        assert guide.bitmask_words()[0] >> token & 1
        guide.advance(token)


def _exhaust(index: TokenIndex) -> None:
    heavy = index.new_guide()
    with pytest.raises(ConstraintError, match="cannot continue"):
        _walk(heavy, HEAVY)


def test_a_guide_past_the_limits_fails_alone():
    index = TokenIndex.get(PATTERN, ABC)
    before = lexer_renewals()
    in_flight = index.new_guide()
    _walk(in_flight, MATCH[:3])
    _exhaust(index)
    assert lexer_renewals() == before + 1
    _walk(in_flight, MATCH[3:])  # on the spent lexer it would allow nothing
    assert in_flight.can_stop()
    fresh = index.new_guide()
    _walk(fresh, MATCH)
    assert fresh.can_stop() and TokenIndex.get(PATTERN, ABC) is index


def test_a_guide_recovers_when_its_mask_is_written_into_out():
    """The in-flight guide's next mask, computed into the caller's row on the spent lexer,
    is computed again on a matcher of its own and written over that row."""
    import numpy as np

    from lmprog.fsm.mask import allowed_bitmask

    index = TokenIndex.get(PATTERN, ABC)
    in_flight = index.new_guide()
    _walk(in_flight, MATCH[:3])
    _exhaust(index)
    out = np.zeros((1, index.num_words), dtype=np.int32)
    for token in MATCH[3:]:
        allowed_bitmask([in_flight], index.vocab_size, out=out)
        assert out[0, 0] >> token & 1 and out[0, 0] & 0b11 == 0b11  # a and b both allowed
        in_flight.advance(token)
    allowed_bitmask([in_flight], index.vocab_size, out=out)
    assert out[0, 0] >> 3 & 1  # EOS
    assert in_flight.can_stop()


def test_a_guide_recovers_when_its_first_step_after_the_error_is_an_advance():
    index = TokenIndex.get(PATTERN, ABC)
    in_flight = index.new_guide()
    _walk(in_flight, MATCH[:3])
    _exhaust(index)
    # masks along MATCH are cached on the index, so the engine would advance without asking
    # the matcher for one: advance must not take the spent lexer's refusal for the answer
    for token in MATCH[3:]:
        in_flight.advance(token)
    assert in_flight.can_stop()
    with pytest.raises(ValueError, match="not allowed"):
        index.new_guide().advance(3)  # EOS at the start is still refused


def test_a_recovered_guide_rolls_back_and_forks():
    index = TokenIndex.get(PATTERN, ABC)
    in_flight = index.new_guide()
    _walk(in_flight, MATCH[:5])
    _exhaust(index)
    in_flight.rollback(2)
    fork = in_flight.copy()
    _walk(in_flight, MATCH[3:])
    _walk(fork, MATCH[3:])
    assert in_flight.can_stop() and fork.can_stop()


def test_a_text_that_spends_the_lexer_is_read_again_and_others_match_as_before():
    constraint = Constraint.from_regex(PATTERN)
    assert constraint.matches("babbaababa")
    before = lexer_renewals()
    assert constraint.matches(LONG) == (LONG[-9] == "a")  # past the shared lexer's states
    assert lexer_renewals() == before + 1
    assert constraint.matches("babbaababa") and not constraint.matches("bbbbbbbbbb")
    assert Constraint.from_regex(PATTERN).matches("ababbaababa")


def test_a_text_past_the_limits_raises_and_leaves_the_others(monkeypatch):
    constraint = Constraint.from_regex(PATTERN)
    assert constraint.matches("babbaababa")
    monkeypatch.setattr(index_mod, "STEP_LEXER_FUEL", 0)  # a lexer of its own gets no more
    monkeypatch.setattr(index_mod, "BUILD_LEXER_FUEL", 2_000)
    with pytest.raises(ConstraintError, match="cannot tell whether the text matches"):
        constraint.matches(LONG)
    assert constraint.matches("babbaababa") and not constraint.matches("bbbbbbbbbb")


def test_matches_renews_a_lexer_worn_out_by_earlier_texts():
    """Issue 28's string as its grammar had it, a word-count pattern beside a length bound:
    matchers that compute no mask build their states on the fuel the last mask left, so the
    first ten-word text spent the shared lexer and every later text was rejected."""
    space = "\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
    word = r'(?:[^\x00- "\\' + space + r']|\\(?:["\\b]|u00(?:0[0-7]|0[e-fE-F]|1[0-9a-fA-F])))'
    gap = r"(?:[ " + space + r"]|\\(?:[fnrt]|u000[bB]))"
    unit = r'(?:[^"\\\x00-\x1f]|\\(?:["\\\/bfnrt]|u[0-9a-fA-F]{4}))'
    grammar = f'start: T\nT: /"(?:(?:{word}+{gap}+){{0,499}}{word}+)?"/ & /"{unit}{{0,2000}}"/\n'
    constraint = Constraint.from_ebnf(grammar)
    assert constraint.matches('"a b"')
    assert constraint.matches('"' + " ".join(f"w{i}" for i in range(10)) + '"')
    assert constraint.matches('"a b"') and not constraint.matches('"a  "')
    assert Constraint.from_ebnf(grammar).matches('"a b"')
