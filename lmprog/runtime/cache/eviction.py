"""Eviction policies: which unlocked leaf of the radix tree goes first.

A policy is a small strategy object: `priority(node)` returns a sort key, smallest evicted
first. Nodes carry `last_access` (a logical clock bumped on every match/insert that walks
through them) and `hit_count` (how many such walks). Choose one with `make_eviction_policy`.
"""

from __future__ import annotations

import abc
from typing import Any


class EvictionPolicy(abc.ABC):
    name: str

    @abc.abstractmethod
    def priority(self, node: Any) -> tuple[int, ...]:
        """Sort key of an evictable leaf; the smallest is evicted first. Reads only."""


class LRUPolicy(EvictionPolicy):
    """Least recently used first."""

    name = "lru"

    def priority(self, node: Any) -> tuple[int, ...]:
        return (node.last_access,)


class LFUPolicy(EvictionPolicy):
    """Least frequently used first; ties broken by least recently used."""

    name = "lfu"

    def priority(self, node: Any) -> tuple[int, ...]:
        return (node.hit_count, node.last_access)


_POLICIES: dict[str, type[EvictionPolicy]] = {"lru": LRUPolicy, "lfu": LFUPolicy}


def make_eviction_policy(name: str) -> EvictionPolicy:
    try:
        return _POLICIES[name]()
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {name!r}; choose one of {sorted(_POLICIES)}"
        ) from None
