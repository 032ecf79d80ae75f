"""Token index, guide and jump-forward on the default model's real tokenizer (SmolLM2, byte-level
BPE with 49k tokens) with lmprog's JSON-schema compiler: random walks match, jumps use the
tokenizer's own tokens, and following a target text gives the same text in fewer decode steps."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from fsm_toys import decode_with_jumps, is_prefix_of_a_match

from lmprog.core.models import load_tokenizer, resolve_model
from lmprog.fsm.constraint import Constraint
from lmprog.fsm.index import TokenIndex
from lmprog.fsm.jump import jump_forward
from lmprog.fsm.vocab import TokenVocab

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "admin": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "admin"],
    "additionalProperties": False,
}
JSON_COMPACT = Constraint.from_json_schema(PERSON, whitespace="")
JSON_SPACED = Constraint.from_json_schema(PERSON)  # `[ ]?` between JSON tokens
PATTERNS = [
    JSON_COMPACT,
    JSON_SPACED,
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
    r"(yes|no|maybe)",
    r"-?[0-9]{1,4}(\.[0-9]{1,3})?",
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model())


def test_vocab_bytes_agree_with_the_tokenizer(tok):
    vocab = TokenVocab.from_tokenizer(tok)
    text = 'Héllo {"a": [1, 2]}\n\t  — ok ✓ 日本'
    ids = tok.encode(text, add_special_tokens=False)
    assert vocab.decode(ids).decode() == tok.decode(ids) == text
    assert vocab.size == len(tok) and vocab.eos_token_id == tok.eos_token_id
    assert all(vocab.token_bytes[i] is None for i in tok.all_special_ids)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("jump", [False, True])
def test_random_walks_match(tok, pattern, jump):
    index = TokenIndex.get(pattern, tok)
    eos = index.eos_token_id
    for seed in range(3):
        rng, guide, out = random.Random(seed), index.new_guide(), []
        while len(out) < 80 and not guide.is_finished():
            if guide.can_stop() and rng.random() < 0.5:
                break
            result = jump_forward(guide, out, tok, enabled=jump)
            if not result.is_noop:
                new = list(result.new_token_ids)
                assert tok.encode(tok.decode(new), add_special_tokens=False) == new
                out = result.apply(out)
                continue
            token = rng.choice([t for t in guide.allowed_token_ids().tolist() if t != eos])
            guide.advance(token)
            out.append(token)
        text = index.vocab.decode(out).decode("utf-8", "ignore")
        if isinstance(pattern, Constraint):  # a JSON schema's grammar
            if guide.can_stop():
                jsonschema.validate(json.loads(text), PERSON)
                assert list(json.loads(text)) == ["name", "age", "email", "admin"]
        elif guide.can_stop():
            assert re.fullmatch(pattern, text), text
        else:
            assert is_prefix_of_a_match(pattern, text), text


DOCS = [
    {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "admin": True},
    {"name": "Bob", "age": 7, "email": "b@x.io", "admin": False},
]


def test_jump_forward_same_text_fewer_steps(tok):
    index = TokenIndex.get(JSON_COMPACT, tok)
    totals = [0, 0]
    for doc in DOCS:
        target = json.dumps(doc, separators=(",", ":")).encode()
        plain, plain_steps, _ = decode_with_jumps(index.new_guide(), tok, target, jump=False)
        jumped, jump_steps, jumps = decode_with_jumps(index.new_guide(), tok, target, jump=True)
        assert tok.decode(plain) == tok.decode(jumped) == target.decode()
        for _, result in jumps:  # every jump is the tokenizer's own tokenization of its text
            new = list(result.new_token_ids)
            assert tok.encode(tok.decode(new), add_special_tokens=False) == new
        totals[0] += plain_steps
        totals[1] += jump_steps
    assert totals[1] <= 0.7 * totals[0], totals  # a floor; bench/bench_fsm.py reports the numbers
