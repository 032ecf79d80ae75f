"""The token-level index of a constraint over a model's vocabulary (immutable, shared).

    TokenIndex.get(constraint_or_pattern, tokenizer)      -> TokenIndex   (blocks if not cached)
    TokenIndex.prefetch(constraint_or_pattern, tokenizer) -> Future[TokenIndex] (never blocks)
    index.new_guide()                                     -> Guide (cheap per-sequence cursor)

The index is outlines-core's `Index` (the regex's byte-level DFA crossed with the vocabulary:
for each DFA state reachable at a token boundary, the allowed token ids and their successor
states; EOS only in accepting states). States are outlines-core's integer state ids.

Caching (see index_cache.py), keyed by (sha256 of the pattern, vocabulary fingerprint,
outlines-core version): a memory LRU bounded by entries and bytes, disk files under
`cache_dir()/fsm/`, and shared in-flight builds. `get` builds inline; `prefetch` builds on a
small thread pool (outlines-core releases the GIL while building) and returns a Future the
runtime can poll with `done()`.

Per-state derived data (allowed ids as numpy, forced strings for jump-forward, mask rows) is
computed lazily on first use and cached on the index through `state_cache(name)`; these
caches are bounded and safe to fill from several threads.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Hashable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from lmprog.core.errors import ConstraintError
from lmprog.fsm import index_cache
from lmprog.fsm.vocab import TokenVocab

if TYPE_CHECKING:
    from lmprog.fsm.guide import Guide

STATE_CACHE_SIZE = 4096  # per index and per cache name; beyond this the oldest entries go
ALLOWED_CACHE_SIZE = 512  # allowed-id arrays: up to 192 kB each on a 49k vocabulary
EMPTY_START = -2  # the initial state of a pattern that matches "" (TokenIndex.__init__)


class TokenIndex:
    """Allowed tokens and transitions of one pattern over one vocabulary. Immutable.

    Contract: `allowed_ids(s)` is sorted and contains EOS iff `is_accepting(s)`;
    `next_state(s, t)` is None iff t is not in `allowed_ids(s)`. Arrays returned are
    read-only and shared: never write into them.
    """

    def __init__(
        self, pattern: str, vocab: TokenVocab, index: Any, accepts_empty: bool = False
    ) -> None:
        """index: the outlines-core Index of the pattern, or, when `accepts_empty` (the
        pattern matches the empty string, which an end-anchored Index cannot start with), of
        its non-empty matches; the guide then starts in EMPTY_START, that index's initial
        state made accepting."""
        self.pattern = pattern
        self.vocab = vocab
        self._index = index
        self._start: int = index.get_initial_state()
        self.initial_state: int = EMPTY_START if accepts_empty else self._start
        self._finals = frozenset(index.get_final_states())
        self._caches: dict[Hashable, _BoundedCache] = {}
        self._lock = threading.Lock()

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def get(cls, constraint: Any, tokenizer: Any, *, disk_cache: bool = True) -> TokenIndex:
        """The index of a Constraint (or regex string) for a tokenizer; builds it if needed.

        Raises ConstraintError if the pattern cannot be compiled or no token sequence of this
        vocabulary can spell a match.
        """
        return _lookup(constraint, tokenizer, disk_cache, inline=True).result()

    @classmethod
    def prefetch(
        cls, constraint: Any, tokenizer: Any, *, disk_cache: bool = True
    ) -> Future[TokenIndex]:
        """Start building off the calling thread; returns a Future (already done if cached).

        Poll with `future.done()`; `future.result()` returns the index or raises the
        ConstraintError. `get` of the same constraint meanwhile waits for this build.
        """
        return _lookup(constraint, tokenizer, disk_cache, inline=False)

    @classmethod
    def cached(cls, constraint: Any, tokenizer: Any) -> TokenIndex | None:
        """The index if it is already in memory, else None (never builds, never blocks)."""
        return _CACHE.peek(_key(_pattern_of(constraint), TokenVocab.from_tokenizer(tokenizer)))

    def new_guide(self) -> Guide:
        from lmprog.fsm.guide import Guide

        return Guide(self)

    # ---- per-state queries ----------------------------------------------------------------
    @property
    def eos_token_id(self) -> int:
        return self.vocab.eos_token_id

    @property
    def vocab_size(self) -> int:
        return self.vocab.size

    def is_accepting(self, state: int) -> bool:
        return state in self._finals or state == EMPTY_START

    def next_state(self, state: int, token_id: int) -> int | None:
        if state == EMPTY_START:  # (EOS: None, as outlines-core answers in a match state)
            state = self._start
        return self._index.get_next_state(state, token_id)

    def allowed_ids(self, state: int) -> np.ndarray:
        """int32 sorted token ids allowed in `state` (read-only, cached)."""
        cache = self.state_cache("allowed", ALLOWED_CACHE_SIZE)
        ids = cache.get(state)
        if ids is None:
            if state == EMPTY_START:
                ids = np.union1d(self.allowed_ids(self._start), [self.vocab.eos_token_id])
                ids = ids.astype(np.int32)
            else:
                ids = np.array(self._index.get_allowed_tokens(state), dtype=np.int32)
            ids.sort()
            ids.flags.writeable = False
            cache.put(state, ids)
        return ids

    def is_finished(self, state: int) -> bool:
        """Accepting, and EOS is the only token left."""
        if state not in self._finals:
            return False
        ids = self.allowed_ids(state)
        return len(ids) == 1 and ids[0] == self.vocab.eos_token_id

    def state_cache(self, name: Hashable, capacity: int = STATE_CACHE_SIZE) -> _BoundedCache:
        """A per-index cache of derived per-state data, by name (for guide/jump/mask)."""
        cache = self._caches.get(name)
        if cache is None:
            with self._lock:
                cache = self._caches.setdefault(name, _BoundedCache(capacity))
        return cache

    def __repr__(self) -> str:
        shown = self.pattern if len(self.pattern) <= 60 else self.pattern[:57] + "..."
        return f"TokenIndex({shown!r}, vocab={self.vocab.size})"


class _BoundedCache:
    """A dict with a size cap (first-in first-out eviction); lock-free reads."""

    def __init__(self, capacity: int) -> None:
        self._data: dict[Any, Any] = {}
        self._capacity = capacity
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        return self._data.get(key)

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            if len(self._data) >= self._capacity:
                del self._data[next(iter(self._data))]
            self._data[key] = value

    def __len__(self) -> int:
        return len(self._data)


def _pattern_of(constraint: Any) -> str:
    pattern = constraint if isinstance(constraint, str) else getattr(constraint, "pattern", None)
    if not isinstance(pattern, str):
        raise TypeError(f"expected a Constraint or a regex string, got {type(constraint).__name__}")
    return pattern


_CACHE = index_cache.IndexCache()


def clear_memory_cache() -> None:
    """Forget the in-memory indexes (tests and benchmarks; the disk cache stays)."""
    _CACHE.clear()


def _lookup(constraint: Any, tokenizer: Any, disk: bool, inline: bool) -> Future[TokenIndex]:
    pattern, vocab = _pattern_of(constraint), TokenVocab.from_tokenizer(tokenizer)
    key = _key(pattern, vocab)

    def build() -> tuple[TokenIndex, int]:
        index, accepts_empty, nbytes = _load_or_build(
            key, pattern, vocab, index_cache.disk_enabled(disk)
        )
        return TokenIndex(pattern, vocab, index, accepts_empty), nbytes

    return _CACHE.lookup(key, build, inline)


def _key(pattern: str, vocab: TokenVocab) -> str:
    h = hashlib.sha256(pattern.encode("utf-8", "surrogatepass"))
    h.update(f"|{vocab.fingerprint}|{_outlines_version()}|{_FORMAT}".encode())
    return h.hexdigest()[:32]


_FORMAT = "end-anchored-2"  # bump when _compile changes what an index means
_OUTLINES_VERSION: list[str] = []


def _outlines_version() -> str:
    if not _OUTLINES_VERSION:
        from importlib.metadata import version

        _OUTLINES_VERSION.append(version("outlines-core"))
    return _OUTLINES_VERSION[0]


def _load_or_build(key: str, pattern: str, vocab: TokenVocab, disk: bool) -> tuple[Any, bool, int]:
    """(outlines-core Index, whether the pattern matches "", the serialized size, which sizes
    the memory cache). On disk: one flag byte (b"1": matches ""), then the Index."""
    from outlines_core import Index

    data = index_cache.read(key) if disk else None
    if data is not None and data[:1] in (b"0", b"1"):
        try:
            return Index.from_binary(data[1:]), data[:1] == b"1", len(data)
        except Exception:  # noqa: BLE001 - corrupt or foreign file: rebuild and overwrite it below
            pass
    index, accepts_empty = _compile(pattern, vocab)
    _, (data,) = index.__reduce__()
    if disk:
        index_cache.write(key, (b"1" if accepts_empty else b"0") + data)
    return index, accepts_empty, len(data) + 1


def _compile(pattern: str, vocab: TokenVocab) -> tuple[Any, bool]:
    """(outlines-core Index of the pattern anchored at the end of text, False), or, for a
    pattern that matches the empty string (an end-anchored Index cannot start in a match
    state: "anchored universal start state doesn't exist"), (the Index of its non-empty
    matches, True).

    Why `\\z`: outlines-core 0.2.x walks an unanchored regex-automata DFA whose match states
    are delayed by one byte, and drops every token that *crosses* a point where the text is a
    complete match but does not end at one: for `[0-9]+(\\.[0-9]+)?` the token "." after "1"
    was forbidden, for `(ab)+` the token "a" after "ab". With the end anchor, match states
    only appear at end-of-input, so no transition is dropped (tests/fsm/test_index.py).
    """
    from outlines_core import Index

    try:
        return Index(f"(?:{pattern})\\z", vocab.outlines_vocabulary), False
    except ValueError as exc:
        message = str(exc)
        if "universal start state" in message:
            rest = _nonempty_part(pattern)
            if rest is not None:
                return _compile(rest, vocab)[0], True
        if "incompatible with the regex" in message:
            raise ConstraintError(
                f"no sequence of this tokenizer's tokens can spell a match of {_short(pattern)}: {message}"
            ) from None
        raise ConstraintError(f"cannot compile the regex {_short(pattern)}: {message}") from None


def _nonempty_part(pattern: str) -> str | None:
    """The regex of the non-empty matches of `pattern` (None if it matches only "")."""
    from lmprog.fsm.regex import emit, parse_regex
    from lmprog.fsm.regex.syntax import nonempty

    node = nonempty(parse_regex(pattern, "python").whole())
    out = None if node is None else emit(node)
    return None if out is None else out.text


def _short(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 80 else pattern[:77] + "...")
