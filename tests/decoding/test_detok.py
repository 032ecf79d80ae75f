"""Incremental detokenizing and stop strings, on a toy byte-level tokenizer."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmprog.decoding.detok import IncrementalDetokenizer, StopMatcher, TextStream, text_decoder

SPECIAL = 0


class ByteTokenizer:
    """Token i is a fixed byte string, like a byte-level BPE vocabulary; 0 is special."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = [b"<|eos|>"] + pieces

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        data = b"".join(self.pieces[i] for i in ids if not (skip_special_tokens and i == SPECIAL))
        return data.decode("utf-8", errors="replace")

    def ids(self, *pieces: bytes) -> list[int]:
        return [self.pieces.index(p) for p in pieces]


TOK = ByteTokenizer(
    [
        b"Hel",
        b"lo",
        b" w",
        b"\xe6\x97",
        b"\xa5",
        b"\xf0\x9f",
        b"\x8e",
        b"\x89",
        b"!",
        b"\x80",
        b"\n",
        b"ab",
        b"lo w",
    ]
)


def _stream(ids):
    detok = IncrementalDetokenizer(TOK)
    pieces = [detok.push(i) for i in ids]
    return pieces, detok.flush()


def test_split_multibyte_characters_are_held_until_complete():
    ids = TOK.ids(b"Hel", b"lo", b" w", b"\xe6\x97", b"\xa5", b"\xf0\x9f", b"\x8e", b"\x89", b"!")
    pieces, tail = _stream(ids)
    assert all("\ufffd" not in p for p in pieces)
    assert pieces == ["Hel", "lo", " w", "", "日", "", "", "🎉", "!"]
    assert "".join(pieces) + tail == "Hello w日🎉!"


def test_flush_emits_an_incomplete_character_as_replacement():
    pieces, tail = _stream(TOK.ids(b"Hel", b"\xe6\x97"))
    assert pieces == ["Hel", ""] and tail == "\ufffd"


def test_invalid_bytes_do_not_block_the_stream_forever():
    pieces, tail = _stream(TOK.ids(b"\x80", b"!", b"lo"))
    assert "".join(pieces) + tail == "\ufffd!lo"
    assert pieces[-1] == "lo"


def test_special_tokens_are_skipped_and_prompt_context_is_not_emitted():
    detok = IncrementalDetokenizer(TOK, prompt_ids=TOK.ids(b"Hel", b"lo"))
    out = [detok.push(i) for i in [*TOK.ids(b" w"), SPECIAL, *TOK.ids(b"!")]]
    assert "".join(out) + detok.flush() == " w!"
    assert detok.token_ids == [*TOK.ids(b" w"), SPECIAL, *TOK.ids(b"!")]


def test_splice_replaces_tokens_without_repeating_emitted_text():
    detok = IncrementalDetokenizer(TOK)
    out = [detok.push(i) for i in TOK.ids(b"Hel", b"lo")]
    out.append(detok.splice(1, TOK.ids(b"lo w")))  # retokenized: "lo" -> "lo w"
    out.append(detok.push(TOK.ids(b"!")[0]))
    assert out == ["Hel", "lo", " w", "!"]
    assert detok.token_ids == TOK.ids(b"Hel", b"lo w", b"!")


def test_splice_of_a_held_partial_character():
    detok = IncrementalDetokenizer(TOK)
    out = [detok.push(i) for i in TOK.ids(b"Hel", b"\xe6\x97")]
    out.append(detok.splice(1, TOK.ids(b"\xe6\x97", b"\xa5", b"!")))
    assert "".join(out) + detok.flush() == "Hel日!" and out[-1] == "日!"


def test_stop_string_across_pieces_is_cut_and_not_emitted():
    m = StopMatcher(["\nQ:"])
    assert m.push("answer") == "answer"
    assert m.push(" 4\n") == " 4"  # "\n" could start the stop: held
    assert m.matched is None
    assert m.push("Q: next") == ""
    assert m.matched == "\nQ:"
    assert m.push("more") == "" and m.flush() == ""


def test_held_tail_is_released_when_it_does_not_become_a_stop():
    m = StopMatcher(["END"])
    assert m.push("abcE") == "abc"
    assert m.push("N") == ""
    assert m.push("x") == "ENx"
    assert m.push("EN") == ""
    assert m.flush() == "EN"


def test_the_stop_that_completes_first_wins():
    m = StopMatcher(["world", "o"])
    assert m.push("hello world") == "hell"
    assert m.matched == "o"
    m = StopMatcher(["a", "\naa"])  # "\naa" starts earlier but "a" completes first
    assert m.push("\naa") == "\n" and m.matched == "a"


def _reference_cut(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Cut at the stop occurrence that ends first (ties: the one that starts first)."""
    hits = [(text.find(s) + len(s), text.find(s), i) for i, s in enumerate(stops) if s in text]
    if not hits:
        return text, None
    _, at, i = min(hits)
    return text[:at], stops[i]


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc\n", max_size=40),
    stops=st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=10),
)
def test_stop_matcher_equals_reference_for_any_split(text, stops, cuts):
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    m = StopMatcher(stops)
    out = "".join(m.push(text[a:b]) for a, b in zip(bounds, bounds[1:]))
    if m.matched is None:
        out += m.flush()
    expected, stop = _reference_cut(text, stops)
    assert out == expected
    assert m.matched == stop


def test_text_stream_combines_detok_and_stops():
    ids = TOK.ids(b"Hel", b"lo", b"\n", b"ab", b"!")
    ts = TextStream(TOK, stops=["\nab"])
    pieces = [ts.push(i) for i in ids]
    pieces.append(ts.finish())
    assert "".join(pieces) == ts.text == "Hello"
    assert ts.matched_stop == "\nab"


def test_text_stream_ignores_stops_until_armed():
    ts = TextStream(TOK, stops=["lo"], armed=False)
    ts.push(TOK.ids(b"Hel")[0])
    ts.push(TOK.ids(b"lo")[0])
    ts.arm()
    ts.push(TOK.ids(b"!")[0])
    ts.push(TOK.ids(b"lo")[0])
    ts.finish()
    assert ts.text == "Hello!" and ts.matched_stop == "lo"


def test_text_stream_stops_where_a_stop_regex_first_matches_keeping_the_match():
    """SGLang's stop_regex: generation ends once re.search finds the pattern in the output so
    far; the output is kept whole (SGLang trims only a literal stop string)."""
    ids = TOK.ids(b"Hel", b"lo", b" w", b"!", b"lo")
    ts = TextStream(TOK, stops=[], stop_regex=[r"l+o\s\w"])
    pieces = []
    for i in ids:
        pieces.append(ts.push(i))
        if ts.matched_stop is not None:
            break
    assert ts.matched_stop == r"l+o\s\w" and "".join(pieces) == ts.text == "Hello w"
    # beside stop strings: the text held back as a possible stop string is kept too
    ts = TextStream(TOK, stops=["Hello!"], stop_regex=["w"])
    out = "".join(ts.push(i) for i in TOK.ids(b"Hel", b"lo", b" w"))
    assert ts.matched_stop == "w" and out == ts.text == "Hello w"
    ts = TextStream(TOK, stops=["lo"], stop_regex=["Hello"])  # the stop string first
    ts.push(TOK.ids(b"Hel")[0]), ts.push(TOK.ids(b"lo")[0])
    assert ts.matched_stop == "lo" and ts.text == "Hel"
    ts = TextStream(TOK, stops=[], stop_regex=["H"], armed=False)  # not before min_tokens
    ts.push(TOK.ids(b"Hel")[0])
    assert ts.matched_stop is None
    ts.arm()
    ts.push(TOK.ids(b"lo")[0])
    assert ts.matched_stop == "H"


def test_text_decoder_calls_a_plain_tokenizers_decode():
    assert text_decoder(TOK)(TOK.ids(b"Hel", b"lo")) == "Hello"
    assert text_decoder(TOK, skip_special_tokens=False)([SPECIAL]) == "<|eos|>"


@pytest.fixture(scope="module")
def real_tok():
    from lmprog.core.models import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model())  # a FastTokenizer once the cache is warm
    return tok.hf_tokenizer() if hasattr(tok, "hf_tokenizer") else tok


def test_text_decoder_of_a_fast_tokenizer_equals_its_decode(real_tok):
    """The Rust decode called directly gives tokenizer.decode's text (special tokens,
    partial UTF-8 and leading spaces included), and the Python decode is not called."""
    rng = random.Random(0)
    windows = [
        [
            rng.randrange(len(real_tok)) if rng.random() < 0.9 else rng.randrange(20)
            for _ in range(rng.randint(1, 6))
        ]
        for _ in range(2000)
    ]
    expected = {
        skip: [
            real_tok.decode(w, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
            for w in windows
        ]
        for skip in (True, False)
    }
    real_tok.decode = None  # an instance attribute: the stock class method stays in place
    try:
        for skip in (True, False):
            assert [text_decoder(real_tok, skip)(w) for w in windows] == expected[skip]
    finally:
        del real_tok.decode


def test_text_decoder_respects_an_overridden_decode(real_tok):
    cls = type(real_tok)

    class Shouting(cls):
        def _decode(self, *args, **kwargs):
            return super()._decode(*args, **kwargs).upper()

    ids = real_tok.encode("hello world", add_special_tokens=False)
    real_tok.__class__ = Shouting
    try:
        assert text_decoder(real_tok)(ids) == "HELLO WORLD"
    finally:
        real_tok.__class__ = cls
