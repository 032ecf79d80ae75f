"""The prefix-cache interface, its match result and the integrity error. Torch-free.

A prefix cache maps token sequences to the KV slots that hold them. Slots it holds are
*owned* by it: they are neither free in the allocator nor owned by a request. Requests that
read cached slots lock the matched node so eviction cannot take them away.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class IntegrityError(RuntimeError):
    """The cache bookkeeping is inconsistent (a bug, or planted corruption in a test)."""


def require(condition: bool, message: str) -> None:
    """Raise IntegrityError(message) unless condition holds (survives `python -O`)."""
    if not condition:
        raise IntegrityError(message)


@dataclass(frozen=True)
class MatchResult:
    """The cached prefix of a token sequence.

    slots: KV slots of the first `len(slots)` tokens (a multiple of the page size).
    last_node: the node to lock while using those slots (an opaque handle).
    """

    slots: np.ndarray
    last_node: Any

    @property
    def length(self) -> int:
        return len(self.slots)


class PrefixCache(abc.ABC):
    """A store of KV slots keyed by token prefixes.

    match_prefix only touches bookkeeping; insert takes ownership of slots[present:]; lock and
    unlock are reference counts up to the root (a locked node is never evicted); evict(n)
    returns the freed slots. The full contract: docs/design/kv-cache.md.
    """

    page_size: int

    @abc.abstractmethod
    def match_prefix(self, token_ids: Sequence[int]) -> MatchResult:
        """Longest cached prefix of token_ids, rounded down to whole pages."""

    @abc.abstractmethod
    def cached_prefix_len(self, token_ids: Sequence[int]) -> int:
        """Length match_prefix would return; reads only (no split, no statistics)."""

    @abc.abstractmethod
    def insert(self, token_ids: Sequence[int], slots: np.ndarray) -> int:
        """Cache token_ids (a whole number of pages) with their slots; see class doc."""

    @abc.abstractmethod
    def lock(self, node: Any) -> None:
        """Protect node and its ancestors from eviction (counted)."""

    @abc.abstractmethod
    def unlock(self, node: Any) -> None:
        """Undo one lock(node)."""

    @abc.abstractmethod
    def evict(self, num_tokens: int) -> np.ndarray:
        """Remove unlocked leaves until num_tokens are freed; return their slots."""

    @abc.abstractmethod
    def path_slots(self, node: Any) -> np.ndarray:
        """Slots of the whole prefix ending at node (root to node)."""

    @property
    @abc.abstractmethod
    def evictable_size(self) -> int:
        """Tokens in unlocked nodes."""

    @property
    @abc.abstractmethod
    def protected_size(self) -> int:
        """Tokens in locked nodes."""

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    @abc.abstractmethod
    def all_slots(self) -> np.ndarray:
        """Every slot the cache owns (for integrity checks)."""

    @abc.abstractmethod
    def reset(self) -> np.ndarray:
        """Drop everything (no node may be locked); return the slots it owned."""

    @abc.abstractmethod
    def check_integrity(self, lock_holders: Sequence[Any] | None = None) -> None:
        """Raise IntegrityError if sizes, keys, slots or lock counts are inconsistent.

        lock_holders: when given, the node each current lock was taken on (one entry per
        lock); every node's count must then equal the holders in its subtree exactly.
        """
