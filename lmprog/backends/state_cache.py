"""Saved KV states keyed by the token sequence they hold: longest-prefix lookup, LRU,
bytes-bounded, with an optional disk tier (`disk_bytes` > 0: checked block files).

    cache.put(tokens, blob); match = cache.lookup(tokens2)   # longest common prefix, or None

Plain data; no llama.cpp here. Thread-safe. Design: docs/design/llamacpp-backend.md.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmprog.core.blockfile import BlockDir, BlockFileError, BlockRef


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
    from_disk: bool = False  # read back from the disk tier (now in memory again)


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

    def __init__(self, max_bytes: int, disk_bytes: int = 0, disk_dir: str | None = None):
        """disk_bytes: the disk tier's bound (0: none); disk_dir: its parent folder (None:
        the system's temporary one)."""
        for name, value in (("max_bytes", max_bytes), ("disk_bytes", disk_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self.max_bytes = max_bytes
        self.disk_bytes = disk_bytes
        self._entries: OrderedDict[tuple[int, ...], tuple[SavedState, np.ndarray]] = OrderedDict()
        self._disk: OrderedDict[tuple[int, ...], tuple[BlockRef, np.ndarray]] = OrderedDict()
        self._dir = BlockDir(disk_dir) if disk_bytes else None
        self._bytes = self._disk_used = 0
        self._lock = threading.Lock()
        self.saves = self.evictions = 0
        self.disk_writes = self.disk_hits = self.disk_evictions = 0
        self.disk_failures = self.disk_write_failures = 0

    def lookup(self, tokens: Sequence[int], min_common: int = 1) -> Match | None:
        """The entry with the longest common prefix with `tokens` (>= min_common), or None."""
        query = np.asarray(tokens, dtype=np.int64)
        with self._lock:
            best: Match | None = None
            for state, arr in self._entries.values():
                n = common_prefix_len(arr, query)
                if n >= min_common and (best is None or n > best.common):
                    best = Match(state, n)
            on_disk = self._best_on_disk(query, max(min_common, best.common + 1 if best else 0))
            if on_disk is not None:
                state = self._read_back(*on_disk)
                if state is not None:
                    return Match(state, on_disk[1], from_disk=True)
            if best is not None:
                self._entries.move_to_end(best.state.tokens)
            return best

    def _best_on_disk(self, query: np.ndarray, min_common: int) -> tuple[tuple, int] | None:
        best = None
        for key, (_, arr) in self._disk.items():
            n = common_prefix_len(arr, query)
            if n >= min_common and (best is None or n > best[1]):
                best = (key, n)
        return best

    def _read_back(self, key: tuple[int, ...], common: int) -> SavedState | None:
        """The disk entry `key`, checked, moved into memory (None: its file failed the
        check and the entry is gone)."""
        assert self._dir is not None
        ref, _ = self._disk.pop(key)
        self._disk_used -= ref.nbytes
        try:
            blob = self._dir.read(ref)
        except BlockFileError:
            self.disk_failures += 1
            return None
        finally:
            self._dir.discard(ref)
        self.disk_hits += 1
        state = SavedState(key, blob)
        self._store(state)
        return state

    def longest_common(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` some entry holds (does not touch the LRU order)."""
        query = np.asarray(tokens, dtype=np.int64)
        with self._lock:
            entries = [arr for _, arr in self._entries.values()]
            entries += [arr for _, arr in self._disk.values()]
            return max((common_prefix_len(arr, query) for arr in entries), default=0)

    def put(self, tokens: Sequence[int], blob: bytes) -> bool:
        """Store a state; False if it is larger than the whole cache. Replaces an equal key."""
        state = SavedState(tuple(int(t) for t in tokens), blob)
        if state.nbytes > self.max_bytes or not state.tokens:
            return False
        with self._lock:
            self._store(state)
            self.saves += 1
            return True

    def _store(self, state: SavedState) -> None:
        old = self._entries.pop(state.tokens, None)
        if old is not None:
            self._bytes -= old[0].nbytes
        on_disk = self._disk.pop(state.tokens, None)
        if on_disk is not None:
            self._forget_disk(on_disk[0])
        while self._entries and self._bytes + state.nbytes > self.max_bytes:
            _, (evicted, arr) = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes
            self.evictions += 1
            self._spill(evicted, arr)
        self._entries[state.tokens] = (state, np.asarray(state.tokens, dtype=np.int64))
        self._bytes += state.nbytes

    def _spill(self, state: SavedState, arr: np.ndarray) -> None:
        """An entry evicted from memory, to the disk tier (dropped without one, or when it
        does not fit or cannot be written)."""
        if self._dir is None or state.nbytes > self.disk_bytes:
            return
        while self._disk and self._disk_used + state.nbytes > self.disk_bytes:
            _, (ref, _) = self._disk.popitem(last=False)
            self._forget_disk(ref)
            self.disk_evictions += 1
        try:
            ref = self._dir.write(state.blob)
        except OSError:
            self.disk_write_failures += 1
            return
        self._disk[state.tokens] = (ref, arr)
        self._disk_used += ref.nbytes
        self.disk_writes += 1

    def _forget_disk(self, ref: BlockRef) -> None:
        assert self._dir is not None
        self._disk_used -= ref.nbytes
        self._dir.discard(ref)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            while self._disk:
                _, (ref, _) = self._disk.popitem()
                self._forget_disk(ref)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    @property
    def disk_nbytes(self) -> int:
        return self._disk_used

    def stats(self) -> dict[str, int]:
        with self._lock:
            out = {
                "entries": len(self._entries),
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "saves": self.saves,
                "evictions": self.evictions,
            }
            if self._dir is not None:
                out.update(
                    disk_entries=len(self._disk),
                    disk_bytes=self._disk_used,
                    disk_max_bytes=self.disk_bytes,
                    disk_writes=self.disk_writes,
                    disk_hits=self.disk_hits,
                    disk_evictions=self.disk_evictions,
                    disk_failures=self.disk_failures,
                    disk_write_failures=self.disk_write_failures,
                )
            return out

    def check_integrity(self) -> None:
        """Assert the byte count matches the entries (cheap; for tests and idle checks)."""
        with self._lock:
            assert self._bytes == sum(s.nbytes for s, _ in self._entries.values())
            assert self._bytes <= self.max_bytes
            assert all(key == s.tokens for key, (s, _) in self._entries.items())
            assert self._disk_used == sum(ref.nbytes for ref, _ in self._disk.values())
            assert self._disk_used <= self.disk_bytes
            assert not set(self._disk) & set(self._entries)
