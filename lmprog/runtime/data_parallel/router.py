"""Router: which data-parallel replica serves a request (SGLang router's cache-aware policy).

Per replica an approximate radix tree of the tokens sent there; each request goes to the
least-loaded replica when loads are imbalanced, else to a pinned prefix's replica, else to
the longest match above cache_threshold, else the least loaded. Torch-free; thread-safe.
The rules and thresholds: docs/design/data-parallel.md.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from lmprog.core.errors import BackendError

DEFAULT_TREE_TOKENS = 1 << 20


@dataclass(frozen=True)
class RouterConfig:
    """cache_threshold: a matched share of the prompt above it routes by prefix.
    balance_abs_threshold, balance_rel_threshold: outstanding requests; the replicas are
    imbalanced when max - min exceeds the first and max exceeds min times the second.
    capacity_aware: unlike replicas (GPUs of different kinds): where the rules would take the
    least-loaded replica (balance, least_loaded), ReplicaGroup takes the one whose
    outstanding requests plus this one, over its measured capacity (its engine's
    generated tokens per busy second), end first ("capacity"). Off by default: a replica's
    tokens/s also grows with its batch, so it is for replicas whose speeds differ by more
    than their batching does."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 16
    balance_rel_threshold: float = 1.5
    capacity_aware: bool = False  # ReplicaGroup: load rules by expected completion time

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold!r}")
        abs_t = self.balance_abs_threshold
        if isinstance(abs_t, bool) or not isinstance(abs_t, int) or abs_t < 0:
            raise ValueError(f"balance_abs_threshold must be an int >= 0, got {abs_t!r}")
        if not self.balance_rel_threshold >= 1.0:
            raise ValueError(
                f"balance_rel_threshold must be >= 1, got {self.balance_rel_threshold!r}"
            )


@dataclass(frozen=True)
class Decision:
    """Where a request went, why, and how many of its tokens the replica's tree held."""

    replica: int
    reason: str
    matched: int


class _Node:
    __slots__ = ("key", "children", "parent", "last_access", "pinned")

    def __init__(self, key: tuple[int, ...], parent: _Node | None) -> None:
        self.key = key
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.last_access = 0
        self.pinned = False


class ApproxTree:
    """Token ids sent to one replica: a radix tree of at most `max_tokens` tokens (the
    least recently used leaves go first once it grows past them)."""

    def __init__(self, max_tokens: int = DEFAULT_TREE_TOKENS) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.clear()

    def clear(self) -> None:
        self.root = _Node((), None)
        self.size = 0  # tokens on all edges
        self._clock = itertools.count(1)

    def match(self, tokens: Sequence[int]) -> tuple[int, int]:
        """(tokens of `tokens` found on one path, length of the longest pinned prefix)."""
        node, i, pinned = self.root, 0, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            m = _common(child.key, tokens, i)
            i += m
            if m < len(child.key):
                break
            node = child
            if node.pinned:
                pinned = i
        return i, pinned

    def insert(self, tokens: Sequence[int], pin: bool = False) -> None:
        """Record `tokens` (their path becomes the most recently used); pin marks the end."""
        now = next(self._clock)
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                child = _Node(tuple(tokens[i:]), node)
                node.children[tokens[i]] = child
                self.size += len(child.key)
                i = len(tokens)
            else:
                m = _common(child.key, tokens, i)
                if m < len(child.key):
                    child = self._split(child, m)
                i += m
            child.last_access = now
            node = child
        if pin and node is not self.root:
            node.pinned = True
        if self.size > self.max_tokens:
            self._prune(self.max_tokens - self.max_tokens // 8)

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut node's edge after `at` tokens; returns the new upper half (node keeps its
        children, its pin, and the rest of its key)."""
        upper = _Node(node.key[:at], node.parent)
        upper.last_access = node.last_access
        assert node.parent is not None
        node.parent.children[node.key[0]] = upper
        node.key = node.key[at:]
        node.parent = upper
        upper.children[node.key[0]] = node
        return upper

    def _prune(self, target: int) -> None:
        """Drop least recently used leaves until at most `target` tokens remain."""
        heap = [(n.last_access, id(n), n) for n in self._nodes() if not n.children]
        heapq.heapify(heap)
        while heap and self.size > target:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            self.size -= len(leaf.key)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))

    def _nodes(self) -> list[_Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out


def _common(key: tuple[int, ...], tokens: Sequence[int], start: int) -> int:
    """Length of the common prefix of key and tokens[start:]."""
    n = min(len(key), len(tokens) - start)
    if tuple(tokens[start : start + n]) == key[:n]:
        return n
    i = 0
    while key[i] == tokens[start + i]:
        i += 1
    return i


class Router:
    """Chooses a replica per request (docs/design/data-parallel.md). `loads` are the replicas'
    outstanding requests, counted by the caller; a replica marked dead is never chosen."""

    def __init__(
        self,
        num_replicas: int,
        config: RouterConfig | None = None,
        tree_tokens: int | Sequence[int] = DEFAULT_TREE_TOKENS,
    ) -> None:
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
        self.config = config or RouterConfig()
        sizes = [tree_tokens] * num_replicas if isinstance(tree_tokens, int) else tree_tokens
        if len(sizes) != num_replicas:
            raise ValueError(f"got {len(sizes)} tree sizes for {num_replicas} replicas")
        self.trees = [ApproxTree(s) for s in sizes]
        self.alive = [True] * num_replicas
        self.suspended = [False] * num_replicas  # out of rotation for now (hung), tree kept
        self.routed = [dict.fromkeys(_REASONS, 0) for _ in range(num_replicas)]
        self._lock = threading.RLock()  # route holds it across choose and record

    @property
    def num_replicas(self) -> int:
        return len(self.trees)

    def route(self, tokens: Sequence[int], loads: Sequence[int], pin: bool = False) -> Decision:
        """choose, then record: the replica for a request of `tokens`, now counted there."""
        with self._lock:
            decision = self.choose(tokens, loads)
            self.record(decision, tokens, pin)
        return decision

    def choose(
        self, tokens: Sequence[int], loads: Sequence[int], exclude: Collection[int] = ()
    ) -> Decision:
        """The replica for a request of `tokens` (nothing recorded), never one in `exclude`
        (where a retried request already failed) or suspended. BackendError when every
        replica is dead, and when none is left to choose."""
        if len(loads) != self.num_replicas:
            raise ValueError(f"got {len(loads)} loads for {self.num_replicas} replicas")
        with self._lock:
            return self._choose(tokens, loads, exclude)

    def record(self, decision: Decision, tokens: Sequence[int], pin: bool = False) -> None:
        """The request went where `decision` says: its tokens join that replica's tree (and
        pin their prefix there with pin=True)."""
        with self._lock:
            self.trees[decision.replica].insert(tokens, pin=pin)
            self.routed[decision.replica][decision.reason] += 1

    def _choose(
        self, tokens: Sequence[int], loads: Sequence[int], exclude: Collection[int] = ()
    ) -> Decision:
        if not any(self.alive):
            raise BackendError(
                f"every one of the {self.num_replicas} data-parallel replicas has failed; "
                "create a new Runtime"
            )
        live = [
            i
            for i, ok in enumerate(self.alive)
            if ok and not self.suspended[i] and i not in exclude
        ]
        if not live:
            hung = sum(s for s, ok in zip(self.suspended, self.alive) if ok)
            raise BackendError(
                f"no data-parallel replica can take the request: of {self.num_replicas}, "
                f"{self.num_replicas - sum(self.alive)} failed, {hung} hung"
                + (f", {len(exclude)} already failed it" if exclude else "")
            )
        matches = {i: self.trees[i].match(tokens) for i in live}
        least = min(live, key=lambda i: (loads[i], self.trees[i].size, i))
        if self._imbalanced([loads[i] for i in live]):
            return Decision(least, "balance", matches[least][0])
        pinned = max(live, key=lambda i: (matches[i][1], -loads[i], -i))
        if matches[pinned][1] > 0:
            return Decision(pinned, "pinned", matches[pinned][0])
        best = max(live, key=lambda i: (matches[i][0], -loads[i], -i))
        if tokens and matches[best][0] / len(tokens) > self.config.cache_threshold:
            return Decision(best, "prefix", matches[best][0])
        return Decision(least, "least_loaded", matches[least][0])

    def _imbalanced(self, loads: list[int]) -> bool:
        hi, lo = max(loads), min(loads)
        c = self.config
        return hi - lo > c.balance_abs_threshold and hi > lo * c.balance_rel_threshold

    def mark_dead(self, replica: int) -> None:
        """Never route to `replica` again; its tree is dropped."""
        with self._lock:
            self.alive[replica] = False
            self.trees[replica].clear()

    def suspend(self, replica: int, suspended: bool = True) -> None:
        """Take `replica` out of rotation (a hang) or put it back; its tree is kept."""
        with self._lock:
            self.suspended[replica] = suspended

    def forget(self, replica: int) -> None:
        """The replica's prefix cache was emptied (flush, engine reset): empty its tree."""
        with self._lock:
            self.trees[replica].clear()

    def stats(self) -> list[dict[str, Any]]:
        """Per replica: alive, tokens in its tree, requests routed there by reason."""
        with self._lock:
            return [
                {"alive": ok, "suspended": h, "tree_tokens": t.size, "routed": dict(r)}
                for ok, h, t, r in zip(self.alive, self.suspended, self.trees, self.routed)
            ]


_REASONS = ("balance", "pinned", "prefix", "least_loaded", "capacity")
