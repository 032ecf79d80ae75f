"""Tiny tokenizers and helpers shared by the token-level fsm tests (index/guide/mask/jump)."""

from __future__ import annotations

import json
import random

from lmprog.fsm.guide import Guide

# Byte-level BPE merges (GPT-2 style: "Ġ" is the space byte). Each merged token is one id.
TOY_MERGES = [
    ('"', ","),
    ("Ġ", '"'),
    ('"', ":"),
    ("{", '"'),
    ("a", "b"),
    ("ab", "c"),
    ('Ġ"', "a"),
    ("t", "r"),
    ("tr", "u"),
    ("tru", "e"),
    ('",', '"'),
    ("n", "a"),
    ("na", "m"),
    ("nam", "e"),
]


def byte_level_tokenizer(merges=TOY_MERGES):
    """A real Hugging Face fast tokenizer: 256 byte tokens, the merges above, then <eos>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


TOY_SPECIAL = ("<|channel|>", "<|message|>", "<|call|>", "<|end|>")  # ids 271, 272, 273, 274


def special_tokenizer(special=TOY_SPECIAL, added=("<think>",)):
    """`byte_level_tokenizer` with special tokens after <eos> (gpt-oss's markers: single ids
    the encoder makes of their text) and then added, non-special tokens (a Qwen3 `<think>`,
    a text token: its bytes are its text)."""
    tok = byte_level_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(special)})
    tok.add_tokens(list(added))
    return tok


def is_prefix_of_a_match(pattern: str, text: str) -> bool:
    """The reference the token engine is checked against: the `regex` module's partial match
    (is `text` a prefix of some full match of `pattern`?), an engine independent of llguidance."""
    import regex

    return regex.fullmatch(pattern, text, partial=True) is not None


def random_walk(guide: Guide, rng: random.Random, greed: float = 0.4, limit: int = 400):
    """Sample allowed tokens uniformly, taking EOS with probability `greed` where it is
    allowed, until EOS, a finished guide or `limit` tokens. Returns the tokens (EOS excluded;
    `guide.eos_consumed` says whether the walk ended with it)."""
    out: list[int] = []
    eos = guide.index.eos_token_id
    while len(out) < limit and not guide.is_finished():
        ids = guide.allowed_token_ids().tolist()
        if eos in ids and rng.random() < greed:
            guide.advance(eos)
            break
        token = rng.choice([t for t in ids if t != eos])
        guide.advance(token)
        out.append(token)
    return out


_STRUCTURE = frozenset(b'"{}[],: 0123456789-.eEtrufalsn')


def random_text(constraint, rng: random.Random, like: str = "", limit: int = 400) -> str | None:
    """A random whole match of a constraint, written byte by byte through the token engine
    over a one-byte-per-token vocabulary: EOS taken with probability 1/2 where allowed, JSON's
    structural bytes preferred half the time (so strings end and containers close). With
    `like` (a text), the walk mostly copies its next byte where that is allowed and strays at
    random otherwise: texts near a given instance, which a uniform walk would rarely reach
    (a pattern or a format in a string). None if no match was finished within `limit`."""
    from lmprog.fsm.index import BYTES, TokenIndex

    guide = TokenIndex.get(constraint, BYTES).new_guide()
    target, k, out = like.encode(), 0, bytearray()
    while len(out) < limit:
        ids = guide.allowed_token_ids().tolist()
        if 256 in ids and (rng.random() < 0.5 or ids == [256]) and k >= len(target):
            return out.decode()
        ids = [t for t in ids if t != 256]
        if not ids:
            return out.decode()
        if k < len(target) and target[k] in ids and rng.random() < 0.9:
            byte = target[k]
        else:
            preferred = [t for t in ids if t in _STRUCTURE]
            byte = rng.choice(preferred if preferred and rng.random() < 0.5 else ids)
            if k < len(target) and rng.random() < 0.5:
                k += 1  # a substitution rather than an insertion
        k += byte == (target[k] if k < len(target) else None)
        guide.advance(byte)
        out.append(byte)
    return None


def assert_random_texts_valid(schema, like: str, walks: int = 150, least: int = 50) -> None:
    """`walks` random texts of a JSON schema's constraint near `like` (random_text): at least
    `least` finish, and jsonschema finds every one valid. The spec's reading (strict=False):
    strict generation only writes fewer of them."""
    import json

    import jsonschema

    from lmprog.fsm import Constraint

    c = Constraint.from_json_schema(schema, strict=False)
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(0)
    texts = [t for t in (random_text(c, rng, like) for _ in range(walks)) if t is not None]
    assert len(texts) > least
    for text in texts:
        assert validator.is_valid(json.loads(text)), text


def follow_text(guide: Guide, target: bytes, out: list[int]) -> int | None:
    """A 'model' that writes `target`: the longest allowed token that continues it (EOS at the
    end). Returns None when no allowed token continues the target."""
    vocab = guide.index.vocab
    pos = len(vocab.decode(out))
    assert target.startswith(vocab.decode(out))
    if pos == len(target):
        return vocab.eos_token_id if guide.can_stop() else None
    by_bytes = _bytes_to_ids(vocab)
    for end in range(min(len(target), pos + 48), pos, -1):
        for t in by_bytes.get(target[pos:end], ()):
            if guide.is_allowed(t):
                return t
    return None


_BY_BYTES: dict[int, dict[bytes, list[int]]] = {}


def _bytes_to_ids(vocab) -> dict[bytes, list[int]]:
    table = _BY_BYTES.get(id(vocab))
    if table is None:
        table = _BY_BYTES[id(vocab)] = {}
        for i, b in enumerate(vocab.token_bytes):
            if b:
                table.setdefault(b, []).append(i)
    return table


def decode_with_jumps(guide: Guide, tokenizer, target: bytes, jump: bool, limit: int = 400):
    """Write `target` under the guide; returns (output ids, decode steps, jump results)."""
    from lmprog.fsm.jump import jump_forward

    out: list[int] = []
    steps, jumps = 0, []
    while len(out) < limit:
        result = jump_forward(guide, out, tokenizer, enabled=jump)
        if not result.is_noop:
            jumps.append((list(out), result))
            out = result.apply(out)
        if guide.is_finished():
            break
        token = follow_text(guide, target, out)
        assert token is not None, (target, guide.index.vocab.decode(out))
        steps += 1
        guide.advance(token)
        if token == guide.index.eos_token_id:
            break
        out.append(token)
    return out, steps, jumps


_SHORT_ESCAPES = {'"': '"', "\\": "\\", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
_WHITESPACE = ["", " ", "\n  ", "\t", " \r\n "]


def json_spelled(value, rng: random.Random, escape: float = 0.3, shuffle: bool = True) -> str:
    """A JSON text of `value` in one of its many spellings: every non-ASCII character escaped
    (as ``json.dumps`` with ensure_ascii writes it) and a random share `escape` of the others
    (``\\uXXXX`` in random hex case, surrogate pairs past the BMP, ``\\/``), object keys in a
    random order (`shuffle`; else in their order), random JSON whitespace between tokens."""

    def ws() -> str:
        return rng.choice(_WHITESPACE)

    def text(s: str) -> str:
        return '"' + "".join(char(c) for c in s) + '"'

    def char(c: str) -> str:
        o = ord(c)
        if c in _SHORT_ESCAPES and rng.random() >= escape:
            return "\\" + _SHORT_ESCAPES[c]
        if 0x20 <= o < 0x7F and c not in _SHORT_ESCAPES and rng.random() >= escape:
            return c
        if c == "/" and rng.random() < 0.5:
            return "\\/"
        if o > 0xFFFF:
            hi, lo = divmod(o - 0x10000, 0x400)
            return unit(0xD800 + hi) + unit(0xDC00 + lo)
        return unit(o)

    def unit(u: int) -> str:
        return "\\u" + "".join(d.upper() if rng.random() < 0.5 else d for d in f"{u:04x}")

    def spelled(v) -> str:
        if isinstance(v, str):
            return text(v)
        if isinstance(v, list):
            inner = ("," + ws()).join(spelled(x) for x in v)
            return "[" + ws() + inner + ws() + "]"
        if isinstance(v, dict):
            keys = list(v)
            if shuffle:
                rng.shuffle(keys)
            members = [text(k) + ws() + ":" + ws() + spelled(v[k]) for k in keys]
            return "{" + ws() + ("," + ws()).join(members) + ws() + "}"
        return json.dumps(v)

    return spelled(value)
