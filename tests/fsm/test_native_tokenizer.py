"""llguidance's own tokenizer (built from the Hugging Face tokenizer's JSON) against the Python
one (`_Tokens`, whose encoder llguidance calls back for forced text): on the default model's
real tokenizer every mask of random walks over JSON schemas with forced keys is the same."""

from __future__ import annotations

import random

import llguidance
import numpy as np
import pytest
from fsm_toys import byte_level_tokenizer

from lmprog.core.models import load_tokenizer, resolve_model
from lmprog.fsm.constraint import Constraint
from lmprog.fsm.index import TokenIndex, _native_tokenizer, _Tokens, ll_tokenizer_for
from lmprog.fsm.vocab import TokenVocab

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "in_stock": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "dark blue"]}},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
                "required": ["city", "zip"],
            },
        },
        "required": ["name", "in_stock", "tags", "address"],
        "additionalProperties": False,
    },
    {"enum": ["arguments", "in_progress", "order_id: 7"]},
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model())


def test_the_real_tokenizer_is_read_natively(tok):
    vocab = TokenVocab.from_tokenizer(tok)
    native = _native_tokenizer(vocab, tok)
    assert native is not None and native.vocab_size == vocab.size
    assert ll_tokenizer_for(vocab, tok).is_special_token(vocab.eos_token_id)


@pytest.mark.parametrize("schema", range(len(SCHEMAS)))
def test_masks_equal_the_python_tokenizers(tok, schema):
    """The masks (narrowed to the canonical tokens of forced text) and forced bytes of both
    tokenizers agree at every position of random walks."""
    vocab = TokenVocab.from_tokenizer(tok)
    constraint = Constraint.from_json_schema(SCHEMAS[schema], strict=False)
    python = llguidance.LLTokenizer(_Tokens(vocab, tok), n_vocab=vocab.size)  # type: ignore[arg-type]
    native = _native_tokenizer(vocab, tok)
    assert native is not None
    pattern = constraint.pattern
    indexes = [TokenIndex(pattern, vocab, t, constraint.check) for t in (python, native)]
    for seed in range(4):
        rng = random.Random(seed)
        guides = [index.new_guide() for index in indexes]
        for _ in range(60):
            words = [g.bitmask_words() for g in guides]
            assert np.array_equal(words[0], words[1])
            assert guides[0].forced_bytes() == guides[1].forced_bytes()
            allowed = guides[0].allowed_token_ids().tolist()
            if guides[0].is_finished() or not allowed:
                break
            token = rng.choice(allowed)
            for g in guides:
                g.advance(token)


def test_a_tokenizer_spelled_otherwise_keeps_the_python_path():
    """The toy has a token for the byte 0xff, which llguidance's own tokenizer cannot spell
    (0xff marks its special tokens): the spellings differ, so it is not used."""
    toy = byte_level_tokenizer()
    vocab = TokenVocab.from_tokenizer(toy)
    assert b"\xff" in vocab.token_bytes
    assert _native_tokenizer(vocab, toy) is None
    assert _native_tokenizer(vocab, vocab) is None  # a bare vocabulary has no JSON


def test_special_tokens_by_name_on_the_native_tokenizer(tok):
    """llguidance's own tokenizer names the special tokens from the tokenizer's JSON: a
    grammar's `<|im_start|>` is that id, and jump-forward forces it by id."""
    from lmprog.fsm.jump import jump_forward

    vocab = TokenVocab.from_tokenizer(tok)
    assert _native_tokenizer(vocab, tok) is not None
    start = tok.convert_tokens_to_ids("<|im_start|>")
    guide = TokenIndex.get(Constraint.from_ebnf('start: "ab" <|im_start|> "cd"'), tok).new_guide()
    ids = tok.encode("ab", add_special_tokens=False)
    guide.advance_all(ids)
    assert guide.allowed_token_ids().tolist() == [start]
    result = jump_forward(guide, ids, tok)
    assert result.new_token_ids[0] == start and guide.can_stop()
    assert tok.decode(list(result.apply(ids))) == "ab<|im_start|>cd"
