"""DraftKVCache: which slots of the draft model's KV pool hold which request's tokens.
Torch-free bookkeeping (the draft proposer owns the pool and the model).

Rollback after rejected drafts truncates to the common prefix; when slots or rows run out,
unprotected requests are evicted LRU, else the caller gets None.
Design: docs/design/speculative.md.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field

import numpy as np

from ..cache.allocator import TokenSlotAllocator
from ..cache.base import require


@dataclass(eq=False)
class DraftSeq:
    """One request's draft state (mutated by DraftKVCache and the proposer)."""

    rid: Hashable
    row: int
    tokens: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    generator: object = None  # the request's draft RNG (a decoding.rng.SeededGenerator), or None


class DraftKVCache:
    """Slots 1..num_slots of the draft pool and rows 0..num_rows-1 of its table.

    Contract: slots and rows are either free or owned by exactly one DraftSeq; `release` of
    an unknown rid is a no-op; `truncate(seq, len(seq.tokens))` frees only reserved slots.
    """

    def __init__(self, num_slots: int, num_rows: int) -> None:
        if num_rows < 1:
            raise ValueError(f"the draft needs at least one table row, got {num_rows}")
        self.allocator = TokenSlotAllocator(num_slots)
        self.num_rows = num_rows
        self._free_rows = list(range(num_rows - 1, -1, -1))
        self._seqs: OrderedDict[Hashable, DraftSeq] = OrderedDict()  # least recent first
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._seqs)

    @property
    def num_free_slots(self) -> int:
        return self.allocator.num_free

    def seqs(self) -> list[DraftSeq]:
        """Every request's state, least recently used first."""
        return list(self._seqs.values())

    def get(self, rid: Hashable) -> DraftSeq | None:
        """The request's state, marked most recently used; None when it has none."""
        seq = self._seqs.get(rid)
        if seq is not None:
            self._seqs.move_to_end(rid)
        return seq

    def open(self, rid: Hashable, protect: Collection[Hashable]) -> DraftSeq | None:
        """A new, empty state with its own row (evicting an idle request if needed), or None."""
        assert rid not in self._seqs, f"{rid!r} is already open"
        if not self._free_rows:
            self._evict(protect, lambda: bool(self._free_rows))
        if not self._free_rows:
            return None
        seq = DraftSeq(rid, self._free_rows.pop())
        self._seqs[rid] = seq
        return seq

    def truncate(self, seq: DraftSeq, keep: int) -> None:
        """Keep the first `keep` tokens; free every slot beyond them (reserved ones too)."""
        assert 0 <= keep <= len(seq.tokens)
        if len(seq.slots) > keep:
            self.allocator.free(np.asarray(seq.slots[keep:], dtype=np.int32))
            del seq.slots[keep:]
        del seq.tokens[keep:]

    def reserve(self, seq: DraftSeq, n: int, protect: Collection[Hashable]) -> list[int] | None:
        """n more slots appended to seq.slots (evicting idle requests if needed), or None,
        changing nothing of `seq`, when the pool cannot hold them."""
        slots = self.allocator.alloc(n)
        if slots is None:
            self._evict(protect, lambda: self.allocator.num_free >= n)
            slots = self.allocator.alloc(n)
        if slots is None:
            return None
        new = slots.tolist()
        seq.slots.extend(new)
        return new

    def release(self, rid: Hashable) -> None:
        """Free the request's slots and row (no-op for an unknown rid)."""
        seq = self._seqs.pop(rid, None)
        if seq is None:
            return
        self.truncate(seq, 0)
        self._free_rows.append(seq.row)

    def _evict(self, protect: Collection[Hashable], enough: Callable[[], bool]) -> None:
        for rid in [r for r in self._seqs if r not in protect]:
            if enough():
                return
            self.release(rid)
            self.num_evicted += 1

    def check_integrity(self) -> None:
        """Raise IntegrityError unless every slot and row is free or owned exactly once."""
        self.allocator.check_integrity()
        owned = [s for seq in self._seqs.values() for s in seq.slots]
        every = np.concatenate(
            [np.asarray(owned, dtype=np.int64), self.allocator.free_slots().astype(np.int64)]
        )
        require(
            len(every) == self.allocator.num_slots
            and np.array_equal(np.sort(every), np.arange(1, len(every) + 1)),
            "draft cache: slots lost or owned twice",
        )
        rows = [seq.row for seq in self._seqs.values()] + self._free_rows
        require(sorted(rows) == list(range(self.num_rows)), "draft cache: rows lost or shared")
        for seq in self._seqs.values():
            require(len(seq.tokens) <= len(seq.slots), f"draft {seq.rid!r}: tokens without slots")
