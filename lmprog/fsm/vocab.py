"""A tokenizer's vocabulary as raw bytes: what each token id appends to the output text.

    vocab = TokenVocab.from_tokenizer(tok)   # once per tokenizer object, cached on disk

Byte-level BPE and SentencePiece token strings become the bytes they stand for; special
tokens are excluded and EOS is kept apart. `fingerprint` identifies the byte mapping, so an
index is reused only by a tokenizer with the same bytes, ids and EOS.
Design: docs/design/constraints.md.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import threading
import weakref
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lmprog.core.cache_files import derived_path, read_description, write_description

_log = logging.getLogger(__name__)

_SPIECE_SPACE = "\u2581"  # "▁"


@dataclass(frozen=True, eq=False)
class TokenVocab:
    """Token id -> bytes (None for special or unused ids), plus the EOS id, and the names of
    the special tokens (`special_names`: (id, name) pairs, e.g. (200012, "<|call|>")), which a
    grammar names them by.

    Immutable; `size` is the number of ids (the smallest logits width that covers them).
    """

    token_bytes: tuple[bytes | None, ...]
    eos_token_id: int
    special_names: tuple[tuple[int, str], ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.eos_token_id < len(self.token_bytes):
            raise ValueError(
                f"eos_token_id {self.eos_token_id} is outside the vocabulary (size {self.size})"
            )
        if self.token_bytes[self.eos_token_id] is not None:
            raise ValueError("the EOS id must not also be a text token (set its bytes to None)")

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenVocab:
        """The vocabulary of a Hugging Face tokenizer (cached per tokenizer object)."""
        if isinstance(tokenizer, TokenVocab):
            return tokenizer
        return _vocab_cache.get(tokenizer)

    @cached_property
    def fingerprint(self) -> str:
        """Identifies the ids' bytes, the EOS and the special tokens' names."""
        if not self.special_names:
            return self.bytes_fingerprint
        named = f"{self.bytes_fingerprint};{self.special_names!r}"
        return hashlib.sha256(named.encode()).hexdigest()[:24]

    @cached_property
    def bytes_fingerprint(self) -> str:
        """Identifies the ids' bytes and the EOS (what the disk cache holds)."""
        h = hashlib.sha256(f"eos={self.eos_token_id};n={self.size};".encode())
        for b in self.token_bytes:
            h.update(b"\xff" if b is None else len(b).to_bytes(2, "little") + b)
        return h.hexdigest()[:24]

    @cached_property
    def special_ids(self) -> dict[str, int]:
        """The special tokens' ids by name (the first id of a name)."""
        ids: dict[str, int] = {}
        for i, name in self.special_names:
            ids.setdefault(name, i)
        return ids

    @cached_property
    def sorted_tokens(self) -> tuple[list[bytes], np.ndarray]:
        """(token bytes sorted, their ids): the tokens with a given prefix are one slice.
        Equal bytes in id order; from the disk cache where the vocabulary came from it."""
        pairs = sorted((b, i) for i, b in enumerate(self.token_bytes) if b)
        return [b for b, _ in pairs], np.array([i for _, i in pairs], dtype=np.int32)

    def extensions(self, token_id: int) -> np.ndarray:
        """Ids of the tokens whose bytes strictly extend token_id's bytes."""
        prefix = self.token_bytes[token_id]
        assert prefix, "only text tokens have extensions"
        keys, ids = self.sorted_tokens
        lo = hi = bisect.bisect_right(keys, prefix)
        while hi < len(keys) and keys[hi].startswith(prefix):
            hi += 1
        return ids[lo:hi]

    @cached_property
    def _by_bytes(self) -> tuple[dict[bytes, int], int]:
        table: dict[bytes, int] = {}
        for i, b in enumerate(self.token_bytes):
            if b:
                table.setdefault(b, i)
        return table, max(map(len, table), default=0)

    def token_id(self, data: bytes) -> int | None:
        """The id of a token whose bytes are exactly `data` (the first such), or None."""
        return self._by_bytes[0].get(data)

    def greedy_encode(self, data: bytes, partial: bool = False) -> list[int]:
        """Ids spelling `data`, longest token first at each position (a tokenizer for a bare
        vocabulary, e.g. in tests); where no token fits, ValueError, or with `partial` the
        ids of the prefix spelled so far."""
        table, longest = self._by_bytes
        out, pos = [], 0
        while pos < len(data):
            for end in range(min(len(data), pos + longest), pos, -1):
                token = table.get(data[pos:end])
                if token is not None:
                    out.append(token)
                    pos = end
                    break
            else:
                if partial:
                    return out
                raise ValueError(f"no token spells byte {data[pos]:#04x} at offset {pos}")
        return out

    def decode(self, token_ids: Any) -> bytes:
        """The bytes the ids spell; ValueError on a special or unknown id."""
        try:
            return b"".join(self.token_bytes[t] for t in token_ids)
        except (TypeError, IndexError):
            bad = [t for t in token_ids if not 0 <= t < self.size or self.token_bytes[t] is None]
            raise ValueError(f"token ids {bad[:5]} are special or outside the vocabulary") from None


class _PerTokenizer:
    """TokenVocab per tokenizer object: weakly keyed where possible, else by id (kept alive)."""

    def __init__(self) -> None:
        self._weak: weakref.WeakKeyDictionary[Any, TokenVocab] = weakref.WeakKeyDictionary()
        self._strong: dict[int, tuple[Any, TokenVocab]] = {}
        self._lock = threading.Lock()

    def get(self, tokenizer: Any) -> TokenVocab:
        with self._lock:
            found = self._find(tokenizer)
        if found is not None:
            return found
        vocab = _vocab_from_tokenizer(tokenizer)
        with self._lock:
            try:
                return self._weak.setdefault(tokenizer, vocab)
            except TypeError:
                return self._strong.setdefault(id(tokenizer), (tokenizer, vocab))[1]

    def _find(self, tokenizer: Any) -> TokenVocab | None:
        try:
            return self._weak.get(tokenizer)
        except TypeError:
            entry = self._strong.get(id(tokenizer))
            return entry[1] if entry is not None else None


_vocab_cache = _PerTokenizer()


def _vocab_from_tokenizer(tokenizer: Any) -> TokenVocab:
    _check_tokenizer(tokenizer)
    source = _tokenizer_file(tokenizer)
    if source is None:
        return _read_vocab(tokenizer)
    entry = derived_path("vocab", source, version=_CACHE_VERSION)
    check = _identity(tokenizer)
    vocab = _load_cached(entry, source, check, _special_names(tokenizer))
    if vocab is None:
        vocab = _read_vocab(tokenizer)
        try:
            _save_cached(entry, source, check, vocab)
        except OSError as exc:  # a read-only cache folder: read it out again next time
            _log.debug("cannot cache the vocabulary of %s: %s", source, exc)
    return vocab


def _check_tokenizer(tokenizer: Any) -> None:
    for attr in ("get_vocab", "eos_token_id"):
        if not hasattr(tokenizer, attr):
            raise TypeError(
                f"expected a Hugging Face tokenizer (with get_vocab() and eos_token_id), got "
                f"{type(tokenizer).__name__}"
            )
    if tokenizer.eos_token_id is None:
        raise ValueError(
            "the tokenizer has no eos_token_id; constrained decoding needs one to stop"
        )


def _read_vocab(tokenizer: Any) -> TokenVocab:
    eos = tokenizer.eos_token_id
    vocab: dict[str, int] = tokenizer.get_vocab()
    size = max(max(vocab.values()) + 1, _len(tokenizer), eos + 1)
    special = _special_ids(tokenizer) | {eos}
    added = {i: t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    to_bytes = _token_decoder(tokenizer)
    token_bytes: list[bytes | None] = [None] * size
    for text, i in vocab.items():
        if i in special:
            continue
        token_bytes[i] = added[i].encode() if i in added else to_bytes(text)
    return TokenVocab(tuple(b if b else None for b in token_bytes), eos, _special_names(tokenizer))


def _len(tokenizer: Any) -> int:
    try:
        return len(tokenizer)
    except TypeError:
        return 0


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            ids.add(i)
    return ids


def _special_names(tokenizer: Any) -> tuple[tuple[int, str], ...]:
    """(id, name) of the tokenizer's special tokens, EOS included, by id."""
    names: dict[int, str] = {}
    for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            names[i] = str(getattr(tok, "content", tok))
    eos = tokenizer.eos_token_id
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    for i in _special_ids(tokenizer) | {eos}:
        if i not in names and callable(convert):
            name = convert(i)
            if isinstance(name, str):
                names[i] = name
    return tuple(sorted(names.items()))


def _token_decoder(tokenizer: Any) -> Callable[[str], bytes]:
    kind = _decoder_kind(tokenizer)
    if kind == "bytelevel":
        table = _unicode_to_byte()
        return lambda s: bytes(table[c] for c in s) if all(c in table for c in s) else s.encode()
    if kind == "sentencepiece":
        return _sentencepiece_bytes
    return lambda s: tokenizer.convert_tokens_to_string([s]).encode()


def _decoder_kind(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "other"
    spec = json.dumps(json.loads(backend.to_str()).get("decoder"))
    if '"ByteLevel"' in spec:
        return "bytelevel"
    if '"ByteFallback"' in spec or '"Metaspace"' in spec or _SPIECE_SPACE in spec:
        return "sentencepiece"
    return "other"


def _sentencepiece_bytes(s: str) -> bytes:
    if len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
        return bytes([int(s[3:5], 16)])
    return s.replace(_SPIECE_SPACE, " ").encode()


def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256+n."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


# ---- the on-disk cache ------------------------------------------------------------------------
#   <entry>/bytes.bin    every token's bytes, concatenated in id order
#   <entry>/lengths.bin  int32 little-endian per id: its byte count (0: special / unused)
#   <entry>/order.bin    int32 little-endian: the text tokens' ids in byte order (sorted_tokens)
#   <entry>/vocab.json   the description, written last: the source's identity, the tokenizer's
#                        identity (EOS, length, special tokens), CRC-32s, the fingerprint

_CACHE_VERSION = 2
_FILES = ("bytes.bin", "lengths.bin", "order.bin")


def _tokenizer_file(tokenizer: Any) -> Path | None:
    """The `tokenizer.json` a tokenizer was loaded from (an absolute folder), or None."""
    folder = getattr(tokenizer, "name_or_path", None)
    if not isinstance(folder, str) or not os.path.isabs(folder):
        return None
    path = Path(folder) / "tokenizer.json"
    return path if path.is_file() else None


def _identity(tokenizer: Any) -> str:
    """What the vocabulary depends on beside `tokenizer.json` (a tokenizer config can add
    tokens or name another EOS): EOS, length and special and added tokens, as a digest."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    parts = (
        tokenizer.eos_token_id,
        _len(tokenizer),
        sorted(_special_ids(tokenizer)),
        sorted((i, str(getattr(t, "content", t))) for i, t in added.items()),
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def _load_cached(
    entry: Path, source: Path, check: str, names: tuple[tuple[int, str], ...]
) -> TokenVocab | None:
    meta = read_description(entry / "vocab.json", source, version=_CACHE_VERSION)
    if meta is None or meta.get("tokenizer") != check:
        return None
    try:
        blob, lengths_raw, order_raw = ((entry / name).read_bytes() for name in _FILES)
    except OSError:
        return None
    if [zlib.crc32(data) for data in (blob, lengths_raw, order_raw)] != meta.get("crc32"):
        return None
    lengths = np.frombuffer(lengths_raw, dtype="<i4")
    if len(lengths) != meta.get("size") or int(lengths.sum()) != len(blob):
        return None
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends[:-1]]
    token_bytes = tuple(blob[a:b] if a != b else None for a, b in zip(starts, ends))
    try:
        vocab = TokenVocab(token_bytes, int(meta["eos_token_id"]), names)
    except (KeyError, TypeError, ValueError):
        return None
    vocab.__dict__["bytes_fingerprint"] = meta.get("fingerprint") or vocab.bytes_fingerprint
    order = np.frombuffer(order_raw, dtype="<i4").astype(np.int32)
    if len(order) == sum(b is not None for b in token_bytes) and 0 <= order.min(initial=0):
        if int(order.max(initial=0)) < len(token_bytes):
            vocab.__dict__["sorted_tokens"] = ([token_bytes[i] for i in order.tolist()], order)
    return vocab


def _save_cached(entry: Path, source: Path, check: str, vocab: TokenVocab) -> None:
    entry.mkdir(parents=True, exist_ok=True)
    blob = b"".join(b for b in vocab.token_bytes if b)
    lengths = np.array([len(b) if b else 0 for b in vocab.token_bytes], dtype="<i4").tobytes()
    order = vocab.sorted_tokens[1].astype("<i4").tobytes()
    files = dict(zip(_FILES, (blob, lengths, order)))
    for name, data in files.items():
        tmp = entry / f"{name}.tmp{os.getpid()}-{threading.get_ident()}"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, entry / name)
        finally:
            tmp.unlink(missing_ok=True)
    write_description(
        entry / "vocab.json",
        source,
        {
            "tokenizer": check,
            "size": vocab.size,
            "eos_token_id": vocab.eos_token_id,
            "crc32": [zlib.crc32(data) for data in files.values()],
            "fingerprint": vocab.bytes_fingerprint,
        },
        version=_CACHE_VERSION,
    )
