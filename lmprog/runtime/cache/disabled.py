"""NoPrefixCache: the prefix cache turned off (radix_cache=False).

Nothing is ever cached: match returns an empty prefix, insert reports every token as
"already present" so the caller frees all its slots, and there is nothing to lock or evict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .allocator import SLOT_DTYPE
from .base import MatchResult, PrefixCache, require

_EMPTY = np.empty(0, dtype=SLOT_DTYPE)


class NoPrefixCache(PrefixCache):
    def __init__(self, page_size: int = 1) -> None:
        self.page_size = page_size

    def match_prefix(self, token_ids: Sequence[int]) -> MatchResult:
        return MatchResult(_EMPTY, None)

    def cached_prefix_len(self, token_ids: Sequence[int]) -> int:
        return 0

    def insert(self, token_ids: Sequence[int], slots: np.ndarray) -> int:
        return len(token_ids)

    def lock(self, node: Any) -> None:
        assert node is None

    def unlock(self, node: Any) -> None:
        assert node is None

    def evict(self, num_tokens: int) -> np.ndarray:
        return _EMPTY

    def path_slots(self, node: Any) -> np.ndarray:
        return _EMPTY

    @property
    def evictable_size(self) -> int:
        return 0

    @property
    def protected_size(self) -> int:
        return 0

    def all_slots(self) -> np.ndarray:
        return _EMPTY

    def reset(self) -> np.ndarray:
        return _EMPTY

    def check_integrity(self, lock_holders: Sequence[Any] | None = None) -> None:
        require(
            all(h is None for h in lock_holders or ()),
            "disabled prefix cache: a request holds a cache node",
        )
