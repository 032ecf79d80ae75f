"""TokenSlotAllocator: which KV-pool slots are free, handed out in whole pages.

    slot:   0 | 1 .. P | P+1 .. 2P | ... | num_slots - P + 1 .. num_slots
    page:   - |   0    |     1     | ... |      num_pages - 1
            ^ slot 0 is the pool's dummy slot: never allocated (padding points there)

Page p owns slots 1 + p*P .. (p+1)*P, so `page_of(slot) = (slot - 1) // P`. With P = 1 a page
is a slot. The free pages sit in a preallocated stack, so alloc/free cost O(pages moved) no
matter how large the pool is.
"""

from __future__ import annotations

import numpy as np

from .base import require

SLOT_DTYPE = np.int32


class TokenSlotAllocator:
    """Free-slot bookkeeping for a pool of `num_slots` slots (slot 0 excluded).

    `num_slots` is rounded down to whole pages; the remainder is never used.
    alloc(n) never hands out part of a request: it returns whole pages or None.
    """

    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_slots < page_size:
            raise ValueError(
                f"num_slots ({num_slots}) must hold at least one page of "
                f"{page_size} slots; raise the KV memory budget"
            )
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        self._offsets = np.arange(page_size, dtype=SLOT_DTYPE)
        self._stack = np.empty(self.num_pages, dtype=SLOT_DTYPE)
        self._top = 0
        self.reset()

    @property
    def num_slots(self) -> int:
        """Usable slots (whole pages)."""
        return self.num_pages * self.page_size

    @property
    def num_free(self) -> int:
        """Free slots (a multiple of page_size)."""
        return self._top * self.page_size

    @property
    def num_free_pages(self) -> int:
        return self._top

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def alloc(self, num_tokens: int) -> np.ndarray | None:
        """Slots of ceil(num_tokens / P) whole pages (page order, each page ascending), or
        None, changing nothing, when fewer are free. alloc(0) returns an empty array."""
        pages = self.pages_for(num_tokens)
        if pages > self._top:
            return None
        # Low page ids first keeps a fresh pool's slots ascending (easy to read in tests).
        start = self._top - pages
        taken = self._stack[start : self._top][::-1].copy()
        self._top = start
        return self._pages_to_slots(taken)

    def free(self, slots: np.ndarray) -> None:
        """Give back whole pages, as alloc returned them (any order of pages).

        Freeing a slot twice is not detected here (it costs O(pool)); check_integrity
        finds it."""
        n = len(slots)
        if n == 0:
            return
        assert n % self.page_size == 0, f"free() needs whole pages, got {n} slots"
        pages = (np.asarray(slots[:: self.page_size], dtype=SLOT_DTYPE) - 1) // self.page_size
        assert self._top + len(pages) <= self.num_pages, "more pages freed than exist"
        self._stack[self._top : self._top + len(pages)] = pages
        self._top += len(pages)

    def free_slots(self) -> np.ndarray:
        """All free slots (a copy; for integrity checks)."""
        return self._pages_to_slots(self._stack[: self._top])

    def reset(self) -> None:
        """Mark every page free (page 0 is handed out first)."""
        self._stack[:] = np.arange(self.num_pages - 1, -1, -1, dtype=SLOT_DTYPE)
        self._top = self.num_pages

    def check_integrity(self) -> None:
        """Raise IntegrityError unless the free pages are distinct and in range."""
        pages = self._stack[: self._top]
        require(0 <= self._top <= self.num_pages, f"free-page count {self._top} out of range")
        if len(pages):
            require(
                bool(pages.min() >= 0 and pages.max() < self.num_pages),
                "allocator: a free page id is out of range",
            )
            require(len(np.unique(pages)) == len(pages), "allocator: a page is free twice")

    def _pages_to_slots(self, pages: np.ndarray) -> np.ndarray:
        if self.page_size == 1:
            return pages + 1
        return ((pages[:, None] * self.page_size + 1) + self._offsets).reshape(-1)
