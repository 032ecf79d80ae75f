"""TokenVocab and TokenIndex: byte mapping, exact allowed sets, caching, errors."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
from fsm_toys import byte_level_tokenizer

from lmprog.core.errors import ConstraintError
from lmprog.fsm import index as index_mod
from lmprog.fsm.index import TokenIndex, clear_memory_cache
from lmprog.fsm.vocab import TokenVocab

# ids:       0     1     2      3
ABC = TokenVocab((b"a", b"b", b"ab", None), eos_token_id=3)


@pytest.fixture(scope="module")
def toy():
    return byte_level_tokenizer()


@pytest.fixture(autouse=True)
def _isolated_cache():
    clear_memory_cache()
    yield
    clear_memory_cache()


def test_byte_level_vocab_maps_encoded_tokens_to_bytes(toy):
    vocab = TokenVocab.from_tokenizer(toy)
    ids = toy.encode('{"x", "a', add_special_tokens=False)
    assert vocab.decode(ids) == b'{"x", "a'
    space_quote = toy.convert_tokens_to_ids('Ġ"')
    assert vocab.token_bytes[space_quote] == b' "'
    assert vocab.token_bytes[toy.eos_token_id] is None
    assert vocab.eos_token_id == toy.eos_token_id
    assert TokenVocab.from_tokenizer(toy) is vocab  # cached per tokenizer object


def test_sentencepiece_vocab_maps_metaspace_and_byte_fallback():
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {
        "<unk>": 0,
        "<s>": 1,
        "</s>": 2,
        "<0x0A>": 3,
        "\u2581a": 4,
        "b": 5,
        "\u2581": 6,
        "a": 7,
    }
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=[("\u2581", "a")], byte_fallback=True, unk_token="<unk>")
    )
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="</s>", bos_token="<s>", unk_token="<unk>"
    )
    vocab_bytes = TokenVocab.from_tokenizer(hf)
    assert vocab_bytes.token_bytes == (None, None, None, b"\n", b" a", b"b", b" ", b"a")
    assert (
        vocab_bytes.decode(hf.encode("a b\n", add_special_tokens=False)) == b" a b\n"
    )  # SentencePiece's space


def test_fingerprint_identifies_the_byte_mapping():
    same = TokenVocab((b"a", b"b", b"ab", None), eos_token_id=3)
    other = TokenVocab((b"a", b"b", b"ba", None), eos_token_id=3)
    assert ABC.fingerprint == same.fingerprint != other.fingerprint


def test_vocab_rejects_eos_outside_or_as_text():
    with pytest.raises(ValueError, match="outside"):
        TokenVocab((b"a",), eos_token_id=4)
    with pytest.raises(ValueError, match="EOS"):
        TokenVocab((b"a", b"b"), eos_token_id=1)


def allowed(guide) -> list[int]:
    return guide.allowed_token_ids().tolist()


def test_allowed_ids_are_exact():
    vocab = TokenVocab((b"a", b"b", b"ab", b"c", None), eos_token_id=4)
    guide = TokenIndex.get("(ab|ac)+", vocab).new_guide()
    assert allowed(guide) == [0, 2] and not guide.can_stop()
    guide.advance(0)
    assert allowed(guide) == [1, 3]
    guide.advance(3)
    assert allowed(guide) == [0, 2, 4] and guide.can_stop()  # EOS only where accepting
    assert not guide.is_allowed(1) and not guide.is_finished()


def test_tokens_crossing_a_complete_match_are_allowed():
    vocab = TokenVocab((b"1", b".", b"5", b".5", None), eos_token_id=4)
    guide = TokenIndex.get(r"[0-9]+(\.[0-9]+)?", vocab).new_guide()
    guide.advance(0)
    assert allowed(guide) == [0, 1, 2, 3, 4]
    guide.advance(1)
    assert allowed(guide) == [0, 2] and not guide.can_stop()


def test_finished_position_allows_only_eos():
    guide = TokenIndex.get("ab", ABC).new_guide()
    guide.advance(2)
    assert guide.is_finished() and allowed(guide) == [3]


def accepted_by_walk(index, text: bytes) -> bool:
    """Whether the guide takes `text` one byte-token at a time (ABC's a/b) and then EOS."""
    guide = index.new_guide()
    for byte in text:
        token = {ord("a"): 0, ord("b"): 1}[byte]
        if not guide.is_allowed(token):
            return False
        guide.advance(token)
    return guide.can_stop() and guide.is_allowed(ABC.eos_token_id)


@pytest.mark.parametrize("pattern", ["a*", "(ab)?", "(ab)*b?", "a*b|", "(a?){2,3}b?"])
def test_patterns_matching_the_empty_string_start_accepting(pattern):
    import itertools
    import re

    guide = TokenIndex.get(pattern, ABC).new_guide()
    assert guide.can_stop() and ABC.eos_token_id in allowed(guide)
    for n in range(6):
        for letters in itertools.product("ab", repeat=n):
            text = "".join(letters)
            expected = re.fullmatch(pattern, text) is not None
            assert accepted_by_walk(guide.index, text.encode()) == expected, (pattern, text)


def test_positions_are_shared_by_path():
    index = TokenIndex.get("(ab|ac)+", TokenVocab((b"a", b"b", b"ab", b"c", None), eos_token_id=4))
    one, two = index.new_guide(), index.new_guide()
    one.advance_all([0, 1])
    two.advance_all([0, 1])
    assert one.state == two.state > 0
    assert one.bitmask_words().base is two.bitmask_words().base  # one cached copy
    two.rollback(1)
    two.advance(3)
    assert two.state != one.state


def test_get_accepts_constraint_like_objects_and_validates(toy):
    @dataclass(frozen=True)
    class FakeConstraint:  # the compiler's Constraint exposes .pattern and .cache_key
        pattern: str
        cache_key: str = "k"

    assert TokenIndex.get(FakeConstraint("(ab)+"), ABC) is TokenIndex.get("(ab)+", ABC)
    with pytest.raises(TypeError, match="Constraint or a regex"):
        TokenIndex.get(42, ABC)
    with pytest.raises(TypeError, match="Hugging Face tokenizer"):
        TokenIndex.get("a", object())


@pytest.mark.parametrize("bad", ["(ab", "a(?=b)", r"(a)\1"])
def test_invalid_regex_raises_constraint_error(bad):
    with pytest.raises(ConstraintError, match="cannot compile"):
        TokenIndex.get(bad, ABC)


def test_pattern_the_vocabulary_cannot_spell_raises_constraint_error():
    with pytest.raises(ConstraintError, match="no sequence of this tokenizer"):
        TokenIndex.get("c", ABC)


def test_memory_cache(toy):
    first = TokenIndex.get(r"[a-c]{2,4}x", toy)
    assert TokenIndex.get(r"[a-c]{2,4}x", toy) is first
    clear_memory_cache()
    assert TokenIndex.cached(r"[a-c]{2,4}x", toy) is None
    assert TokenIndex.get(r"[a-c]{2,4}x", toy) is not first


def test_memory_cache_is_bounded_by_bytes(toy, monkeypatch):
    monkeypatch.setenv("LMPROG_FSM_MEMORY_MB", "0.000001")  # ~1 byte: keeps only the newest
    first = TokenIndex.get("a+", toy)
    TokenIndex.get("b+", toy)
    assert TokenIndex.cached("a+", toy) is None and TokenIndex.cached("b+", toy) is not None
    assert TokenIndex.get("a+", toy) is not first  # rebuilt


def test_a_constraint_past_the_lexer_limit_is_refused(monkeypatch):
    monkeypatch.setattr(index_mod, "MAX_LEXER_STATES", 3)
    with pytest.raises(ConstraintError, match="cannot"):
        guide = TokenIndex.get("(a|b){5}(ab|ba){3}", ABC).new_guide()
        for _ in range(12):
            guide.advance(int(guide.allowed_token_ids()[0]))


def test_prefetch_builds_off_thread_and_shares_the_build(toy):
    future = TokenIndex.prefetch(r"\{(a|b){1,8}\}", toy)
    index = future.result(timeout=30)
    assert future.done() and TokenIndex.get(r"\{(a|b){1,8}\}", toy) is index
    failed = TokenIndex.prefetch("(unclosed", toy)
    with pytest.raises(ConstraintError):
        failed.result(timeout=30)


def test_concurrent_gets_return_one_index(toy):
    results: list[TokenIndex] = []

    def worker() -> None:
        results.append(TokenIndex.get(r"[a-z]{1,5}(,[a-z]{1,5}){0,6}", toy))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6 and all(r is results[0] for r in results)


@pytest.mark.parametrize("capacity", [10, 100, 1000])
def test_state_caches_keep_their_cap(capacity):
    """Stores go in without the lock while the cache is well under its cap; at the cap the
    oldest entries go, first in first out."""
    index = TokenIndex.get("(ab|ac)+", TokenVocab((b"a", b"b", b"ab", b"c", None), eos_token_id=4))
    cache = index.state_cache(("test", capacity), capacity)
    for key in range(3 * capacity):
        cache.put(key, str(key))
        assert len(cache) == min(key + 1, capacity)
    assert cache.get(3 * capacity - 1) == str(3 * capacity - 1) and cache.get(0) is None
    assert [cache.get(k) for k in range(2 * capacity, 3 * capacity)] == [
        str(k) for k in range(2 * capacity, 3 * capacity)
    ]
