"""Compressed FSM and jump-forward on toy tokenizers: exact edges, boundary retokenization,
hold-back, invariants under random walks."""

from __future__ import annotations

import random
import re

import pytest
from fsm_toys import byte_level_tokenizer, decode_with_jumps, is_prefix_of_a_match
from hypothesis import given, settings
from hypothesis import strategies as st

from lmprog.fsm.index import TokenIndex
from lmprog.fsm.jump import NOOP, JumpResult, forced_text, jump_forward
from lmprog.fsm.vocab import TokenVocab

OBJ = r'\{"name":"[a-z]+","ok":(true|false)\}'
PATTERNS = [OBJ, r'x: "[a-z]{1,4}"', r"(ab)+c", r"[0-9]{2}-(jan|feb)-[0-9]{2}", r"α(βγ|βδ)é!"]


@pytest.fixture(scope="module")
def toy():
    return byte_level_tokenizer()


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_forced_bytes_merge_single_successor_chains(toy):
    index = TokenIndex.get(OBJ, toy)
    guide = index.new_guide()
    assert guide.forced_bytes() == b'{"name":"'
    assert forced_text(guide) == '{"name":"'
    guide.advance_all(ids(toy, '{"name":"ab'))
    assert forced_text(guide) == ""  # more letters or the closing quote
    guide.advance_all(ids(toy, '"'))
    assert guide.forced_bytes() == b',"ok":'
    walked = guide.copy()
    walked.advance_all(ids(toy, ',"ok":'))
    assert walked.forced_bytes() == b"" and walked.allowed_token_ids().size > 1


def test_forced_text_stops_at_accepting_states(toy):
    index = TokenIndex.get(r"ab(cd)?", toy)
    guide = index.new_guide()
    assert forced_text(guide) == "ab"
    guide.advance_all(ids(toy, "ab"))
    assert guide.can_stop() and forced_text(guide) == ""


def test_forced_bytes_without_one_byte_tokens():
    vocab = TokenVocab((b"ab", b"abc", b"c", b"x", None), eos_token_id=4)
    guide = TokenIndex.get("abc?x", vocab).new_guide()
    assert guide.forced_bytes() == b"ab" and guide.copy().forced_bytes() == b"ab"  # cached


@settings(max_examples=8, deadline=None)  # each walk asks every token at 40 positions: ~1.4 s
@given(pattern=st.sampled_from(PATTERNS), seed=st.integers(0, 2**32 - 1))
def test_forced_text_is_a_prefix_of_every_continuation(toy, pattern, seed):
    # Exactness: at every position of a random walk, each token that keeps the text a prefix
    # of a match agrees with the forced bytes; where the text may end, nothing is forced.
    index = TokenIndex.get(pattern, toy)
    guide, rng, vocab = index.new_guide(), random.Random(seed), index.vocab
    for _ in range(40):
        forced = guide.forced_bytes()
        if guide.can_stop():
            assert forced == b""
        allowed = [t for t in range(vocab.size) if t != index.eos_token_id and guide.is_allowed(t)]
        for t in allowed:
            b = vocab.token_bytes[t]
            assert b.startswith(forced) or forced.startswith(b), (pattern, forced, b)
        if not allowed:
            break
        guide.advance(rng.choice(allowed))


def test_jump_from_the_start(toy):
    guide = TokenIndex.get(OBJ, toy).new_guide()
    result = jump_forward(guide, [], toy)
    assert result == JumpResult(0, tuple(ids(toy, '{"name":"')))
    assert guide.num_tokens == len(result.new_token_ids)


def test_boundary_is_retokenized(toy):
    # The model wrote `ab` then `"`; the forced `,"ok":` merges with it into `","`.
    guide = TokenIndex.get(OBJ, toy).new_guide()
    out = ids(toy, '{"name":"') + ids(toy, "ab") + ids(toy, '"')
    guide.advance_all(out)
    result = jump_forward(guide, out, toy)
    assert result.drop_last_n_tokens == 1
    assert list(result.new_token_ids) == ids(toy, '","ok":')
    assert toy.convert_ids_to_tokens(result.new_token_ids[:1]) == ['","']
    new_out = result.apply(out)
    fresh = guide.index.new_guide()
    fresh.advance_all(new_out)
    assert fresh.state == guide.state
    assert guide.index.vocab.decode(new_out) == b'{"name":"ab","ok":'


def test_last_token_is_held_back_when_the_model_could_extend_it(toy):
    guide = TokenIndex.get(r'x: "[a-z]{1,4}"', toy).new_guide()
    result = jump_forward(guide, [], toy)
    assert toy.convert_ids_to_tokens(result.new_token_ids) == ["x", ":"]  # not `Ġ"`: `Ġ"a` exists
    assert forced_text(guide) == ' "'
    assert jump_forward(guide, list(result.new_token_ids), toy) == NOOP


def test_switch_budget_and_validation(toy):
    guide = TokenIndex.get(OBJ, toy).new_guide()
    assert jump_forward(guide, [], toy, enabled=False) == NOOP and guide.num_tokens == 0
    limited = jump_forward(guide, [], toy, max_new_tokens=2)
    assert len(limited.new_token_ids) == 2 and guide.num_tokens == 2
    with pytest.raises(ValueError, match="advanced through"):
        jump_forward(guide, [], toy)


def test_jump_never_drops_below_the_constraint_start(toy):
    guide = TokenIndex.get(r"ab(xy)?", toy).new_guide()  # (with (cd)? `ab` is held back: `abc`)
    result = jump_forward(guide, [], toy, lookback=5)
    assert result.drop_last_n_tokens == 0 and toy.decode(list(result.new_token_ids)) == "ab"


@settings(max_examples=50, deadline=None)
@given(pattern=st.sampled_from(PATTERNS), seed=st.integers(0, 2**32 - 1))
def test_random_walks_with_jumps_keep_the_invariant(toy, pattern, seed):
    index = TokenIndex.get(pattern, toy)
    rng, vocab = random.Random(seed), index.vocab
    guide, out = index.new_guide(), []
    for _ in range(200):
        before = list(out)
        result = jump_forward(guide, out, toy)
        out = result.apply(out)
        if not result.is_noop:
            kept = len(before) - result.drop_last_n_tokens
            assert vocab.decode(out).startswith(vocab.decode(before))  # only appends text
            boundary = vocab.decode(result.new_token_ids)
            assert boundary.startswith(vocab.decode(before[kept:])), "dropped text is re-spelled"
            assert ids(toy, boundary.decode()) == list(result.new_token_ids), (
                "the tokenizer's own tokens"
            )
        fresh = index.new_guide()
        fresh.advance_all(out)
        assert fresh.state == guide.state, "guide consistent with the output ids"
        assert fresh.allowed_token_ids().tolist() == guide.allowed_token_ids().tolist()
        if guide.is_finished() or (guide.can_stop() and rng.random() < 0.3):
            break
        allowed = [t for t in guide.allowed_token_ids().tolist() if t != index.eos_token_id]
        token = rng.choice(allowed)
        guide.advance(token)
        out.append(token)
    text = vocab.decode(out).decode("utf-8", "ignore")
    if guide.can_stop():
        assert re.fullmatch(pattern, text), (pattern, text)
    else:  # a walk cut short (unbounded letters) is a prefix of a match
        assert is_prefix_of_a_match(pattern, text), (pattern, text)


@pytest.mark.parametrize("target", ['{"name":"abc","ok":true}', '{"name":"nab","ok":false}'])
def test_same_text_with_and_without_jumps_in_fewer_steps(toy, target):
    index = TokenIndex.get(OBJ, toy)
    plain, plain_steps, _ = decode_with_jumps(index.new_guide(), toy, target.encode(), jump=False)
    jumped, jump_steps, jumps = decode_with_jumps(
        index.new_guide(), toy, target.encode(), jump=True
    )
    assert index.vocab.decode(plain) == index.vocab.decode(jumped) == target.encode()
    assert jumps and jump_steps < plain_steps
