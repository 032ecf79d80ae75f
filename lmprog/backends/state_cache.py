"""Saved KV states keyed by the token sequence they hold: longest-prefix lookup, LRU, bytes-bounded.

A state saved after evaluating tokens T can serve any later sequence S that shares a prefix
with T: restore it, drop the KV beyond the common prefix, evaluate the rest of S.

    entries: [sys user1 ans1 user2]   [sys fewshot×5]   ...
    lookup(sys fewshot×5 q7) -> the second entry, common = len(sys fewshot×5)

Plain data (bytes and token arrays); no llama.cpp here. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class SavedState:
    tokens: tuple[int, ...]
    blob: bytes

    @property
    def nbytes(self) -> int:
        return len(self.blob)


@dataclass(frozen=True)
class Match:
    state: SavedState
    common: int  # tokens shared with the looked-up sequence (a prefix of both)


def common_prefix_len(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n])
    y = np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


class StateCache:
    """LRU of `SavedState`s whose blobs total at most `max_bytes`.

    Contract: `lookup` returns the entry sharing the longest prefix with a sequence and marks
    it recently used; `put` evicts least-recently-used entries until the new one fits (an
    entry larger than `max_bytes` is not stored). `max_bytes=0` disables the cache.
    """

    def __init__(self, max_bytes: int):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], tuple[SavedState, np.ndarray]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.saves = self.evictions = 0

    def lookup(self, tokens: Sequence[int], min_common: int = 1) -> Match | None:
        """The entry with the longest common prefix with `tokens` (>= min_common), or None."""
        query = np.asarray(tokens, dtype=np.int64)
        with self._lock:
            best: Match | None = None
            for state, arr in self._entries.values():
                n = common_prefix_len(arr, query)
                if n >= min_common and (best is None or n > best.common):
                    best = Match(state, n)
            if best is not None:
                self._entries.move_to_end(best.state.tokens)
            return best

    def longest_common(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` some entry holds (does not touch the LRU order)."""
        query = np.asarray(tokens, dtype=np.int64)
        with self._lock:
            return max(
                (common_prefix_len(arr, query) for _, arr in self._entries.values()), default=0
            )

    def put(self, tokens: Sequence[int], blob: bytes) -> bool:
        """Store a state; False if it is larger than the whole cache. Replaces an equal key."""
        state = SavedState(tuple(int(t) for t in tokens), blob)
        if state.nbytes > self.max_bytes or not state.tokens:
            return False
        with self._lock:
            old = self._entries.pop(state.tokens, None)
            if old is not None:
                self._bytes -= old[0].nbytes
            while self._entries and self._bytes + state.nbytes > self.max_bytes:
                _, (evicted, _) = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.evictions += 1
            self._entries[state.tokens] = (state, np.asarray(state.tokens, dtype=np.int64))
            self._bytes += state.nbytes
            self.saves += 1
            return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "entries": len(self._entries),
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "saves": self.saves,
                "evictions": self.evictions,
            }

    def check_integrity(self) -> None:
        """Assert the byte count matches the entries (cheap; for tests and idle checks)."""
        with self._lock:
            assert self._bytes == sum(s.nbytes for s, _ in self._entries.values())
            assert self._bytes <= self.max_bytes
            assert all(key == s.tokens for key, (s, _) in self._entries.items())
