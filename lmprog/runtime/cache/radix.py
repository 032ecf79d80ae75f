"""RadixCache: a radix tree over token ids whose edges hold the KV slots of their tokens.

Children are keyed by their first page; `lock_ref` counts locks on a node or below it, and
only unlocked leaves are evicted, from a lazy heap kept incrementally (O(k log n) for k
leaves). Design: docs/design/kv-cache.md.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from .allocator import SLOT_DTYPE
from .base import MatchResult, PrefixCache, require
from .eviction import EvictionPolicy, make_eviction_policy

_EMPTY = np.empty(0, dtype=SLOT_DTYPE)
_CHUNK = 64  # tokens compared per slice when looking for the first mismatch


class TreeNode:
    __slots__ = (
        "key",
        "slots",
        "children",
        "parent",
        "lock_ref",
        "last_access",
        "hit_count",
        "uid",
        "host",
        "host_children",
    )
    _uids = itertools.count()

    def __init__(self, key: list[int], slots: np.ndarray, parent: TreeNode | None) -> None:
        self.key = key
        self.slots = slots
        self.children: dict[Any, TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0
        self.hit_count = 0
        self.uid = next(TreeNode._uids)
        self.host: Any = None  # hiradix.py: the KV of a node kept in host memory
        self.host_children: dict[Any, TreeNode] | None = None  # hiradix.py: host nodes

    def __repr__(self) -> str:
        return f"TreeNode(uid={self.uid}, len={len(self.key)}, lock_ref={self.lock_ref})"


def parent_of(node: TreeNode) -> TreeNode:
    """The parent of a node below the root (only the root has none)."""
    assert node.parent is not None, "the root has no parent"
    return node.parent


class RadixCache(PrefixCache):
    """The RadixAttention prefix cache. See PrefixCache for the contract."""

    def __init__(self, page_size: int = 1, eviction: str | EvictionPolicy = "lru") -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.policy = make_eviction_policy(eviction) if isinstance(eviction, str) else eviction
        self._init_tree()

    def _init_tree(self) -> None:
        self.root = TreeNode([], _EMPTY, None)
        self._clock = 0
        self._evictable = 0
        self._protected = 0
        self._leaves: set[TreeNode] = set()  # unlocked, childless, not the root
        self._heap: list[
            tuple[tuple[int, ...], int, TreeNode]
        ] = []  # lazy; docs/design/kv-cache.md

    # -- queries ---------------------------------------------------------------------------
    @property
    def evictable_size(self) -> int:
        return self._evictable

    @property
    def protected_size(self) -> int:
        return self._protected

    def match_prefix(self, token_ids: Sequence[int]) -> MatchResult:
        ids = _as_list(token_ids)
        self._clock += 1
        node, pos, parts = self.root, 0, []
        limit = len(ids) - len(ids) % self.page_size
        while pos < limit:
            child = node.children.get(self._child_key(ids, pos))
            if child is None:
                break
            k = self._match_len(child.key, ids, pos, limit)
            if k < len(child.key):
                child = self._split(child, k)
            self._touch(child)
            parts.append(child.slots)
            node, pos = child, pos + k
        slots = parts[0] if len(parts) == 1 else (np.concatenate(parts) if parts else _EMPTY)
        return MatchResult(slots, node)

    def cached_prefix_len(self, token_ids: Sequence[int]) -> int:
        return self._cached_walk(_as_list(token_ids))[1]

    def _cached_walk(self, ids: list[int]) -> tuple[Any, int, bool]:
        """How far ids match the tree without touching it: (the last node matched whole,
        the tokens matched, whether the match ended inside a node's key)."""
        node, pos = self.root, 0
        limit = len(ids) - len(ids) % self.page_size
        while pos < limit:
            child = node.children.get(self._child_key(ids, pos))
            if child is None:
                break
            k = self._match_len(child.key, ids, pos, limit)
            pos += k
            if k < len(child.key):
                return node, pos, True
            node = child
        return node, pos, False

    def path_slots(self, node: Any) -> np.ndarray:
        parts = []
        while node is not None and node is not self.root:
            parts.append(node.slots)
            node = node.parent
        return np.concatenate(parts[::-1]) if parts else _EMPTY

    # -- mutation --------------------------------------------------------------------------
    def insert(self, token_ids: Sequence[int], slots: np.ndarray) -> int:
        ids = _as_list(token_ids)
        n = len(ids)
        assert n == len(slots), f"{n} tokens but {len(slots)} slots"
        assert n % self.page_size == 0, f"insert needs whole pages, got {n} tokens"
        self._clock += 1
        node, pos = self.root, 0
        while pos < n:
            child = node.children.get(self._child_key(ids, pos))
            if child is None:
                self._add_leaf(node, ids[pos:n], np.array(slots[pos:n], dtype=SLOT_DTYPE))
                return pos
            k = self._match_len(child.key, ids, pos, n)
            if k < len(child.key):
                child = self._split(child, k)
            self._touch(child)
            node, pos = child, pos + k
        return n

    def lock(self, node: Any) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
                self._leaves.discard(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Any) -> None:
        while node is not None and node is not self.root:
            assert node.lock_ref > 0, f"unlock of unlocked {node}"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
                if not node.children:
                    self._add_evictable_leaf(node)
            node = node.parent

    def evict(self, num_tokens: int) -> np.ndarray:
        if num_tokens <= 0 or not self._leaves:
            return _EMPTY
        prio, heap = self.policy.priority, self._heap
        freed: list[np.ndarray] = []
        count = 0
        while count < num_tokens and heap:
            stored, _, leaf = heapq.heappop(heap)
            if leaf not in self._leaves:
                continue  # locked, got children or evicted since it was pushed
            current = prio(leaf)
            if current != stored:
                heapq.heappush(heap, (current, leaf.uid, leaf))
                continue
            self._remove_leaf(leaf)
            freed.append(leaf.slots)
            count += len(leaf.slots)
        return np.concatenate(freed) if freed else _EMPTY

    def all_slots(self) -> np.ndarray:
        parts = [node.slots for node in self._nodes()]
        return np.concatenate(parts) if parts else _EMPTY

    def reset(self) -> np.ndarray:
        if self._protected:
            raise RuntimeError(
                f"reset() with {self._protected} locked tokens in the tree; "
                "release every running request first"
            )
        slots = self.all_slots()
        self._init_tree()
        return slots

    # -- integrity -------------------------------------------------------------------------
    def check_integrity(self, lock_holders: Sequence[Any] | None = None) -> None:
        require(not self.root.key and not len(self.root.slots), "radix: root holds tokens")
        require(self.root.parent is None, "radix: root has a parent")
        nodes = self._nodes()
        evictable = protected = 0
        for node in nodes:
            self._check_node(node)
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        require(
            evictable == self._evictable,
            f"radix: evictable_size {self._evictable} but unlocked nodes hold {evictable}",
        )
        require(
            protected == self._protected,
            f"radix: protected_size {self._protected} but locked nodes hold {protected}",
        )
        leaves = {n for n in nodes if n.lock_ref == 0 and not n.children}
        require(leaves == self._leaves, "radix: the evictable-leaf set is stale")
        require(
            leaves <= {entry[2] for entry in self._heap},
            "radix: an evictable leaf is missing from the eviction heap",
        )
        slots = self.all_slots()
        require(len(np.unique(slots)) == len(slots), "radix: a slot is held by two nodes")
        require(not len(slots) or int(slots.min()) >= 1, "radix: slot 0 (the dummy) is cached")
        if lock_holders is not None:
            self._check_lock_holders(nodes, lock_holders)

    def _check_node(self, node: TreeNode) -> None:
        p = self.page_size
        require(
            len(node.key) > 0 and len(node.key) % p == 0,
            f"radix: {node} key length {len(node.key)} is not a positive multiple of {p}",
        )
        require(
            min(node.key) >= 0,
            f"radix: {node} caches a placeholder token (overlap "
            "scheduling: a token not resolved yet)",
        )
        require(
            len(node.key) == len(node.slots),
            f"radix: {node} has {len(node.key)} tokens but {len(node.slots)} slots",
        )
        parent = node.parent
        require(
            parent is not None and parent.children.get(self._child_key(node.key, 0)) is node,
            f"radix: {node} is not its parent's child under its first page",
        )
        require(
            node.lock_ref >= sum(c.lock_ref for c in node.children.values()),
            f"radix: {node} lock_ref {node.lock_ref} is below its children's sum",
        )
        require(node.lock_ref >= 0, f"radix: {node} has a negative lock count")

    def _check_lock_holders(self, nodes: list[TreeNode], holders: Sequence[Any]) -> None:
        members = set(nodes)
        expected: dict[TreeNode, int] = {}
        for node in holders:
            if node is None or node is self.root:
                continue
            require(node in members, f"radix: a lock holder points at detached {node}")
            while node is not self.root:
                expected[node] = expected.get(node, 0) + 1
                node = node.parent
        for node in nodes:
            require(
                node.lock_ref == expected.get(node, 0),
                f"radix: {node} lock_ref {node.lock_ref} but {expected.get(node, 0)} "
                "running requests hold it",
            )

    # -- internals -------------------------------------------------------------------------
    def _child_key(self, ids: list[int], pos: int) -> Any:
        return ids[pos] if self.page_size == 1 else tuple(ids[pos : pos + self.page_size])

    def _match_len(self, key: list[int], ids: list[int], pos: int, limit: int) -> int:
        """Common prefix of key and ids[pos:limit], rounded down to whole pages."""
        m = min(len(key), limit - pos)
        if (key if m == len(key) else key[:m]) == ids[pos : pos + m]:
            return m
        i = 0
        while key[i : i + _CHUNK] == ids[pos + i : pos + i + _CHUNK]:
            i += _CHUNK
        while key[i] == ids[pos + i]:
            i += 1
        return i - i % self.page_size

    def _touch(self, node: TreeNode) -> None:
        node.last_access = self._clock
        node.hit_count += 1

    def _split(self, child: TreeNode, k: int) -> TreeNode:
        """Cut child's edge after k tokens; return the new upper node (same lock count)."""
        assert 0 < k < len(child.key) and k % self.page_size == 0
        mid = TreeNode(child.key[:k], child.slots[:k], child.parent)
        mid.lock_ref, mid.last_access, mid.hit_count = (
            child.lock_ref,
            child.last_access,
            child.hit_count,
        )
        parent_of(child).children[self._child_key(mid.key, 0)] = mid
        child.key, child.slots, child.parent = child.key[k:], child.slots[k:], mid
        mid.children[self._child_key(child.key, 0)] = child
        return mid

    def _add_leaf(self, parent: TreeNode, key: list[int], slots: np.ndarray) -> None:
        leaf = TreeNode(key, slots, parent)
        parent.children[self._child_key(key, 0)] = leaf
        self._leaves.discard(parent)
        self._evictable += len(key)
        self._touch(leaf)
        self._add_evictable_leaf(leaf)

    def _remove_leaf(self, leaf: TreeNode) -> TreeNode:
        assert leaf.lock_ref == 0 and not leaf.children
        parent = parent_of(leaf)
        del parent.children[self._child_key(leaf.key, 0)]
        self._leaves.discard(leaf)
        self._evictable -= len(leaf.key)
        if parent is not self.root and parent.lock_ref == 0 and not parent.children:
            self._add_evictable_leaf(parent)
        return parent

    def _add_evictable_leaf(self, node: TreeNode) -> None:
        self._leaves.add(node)
        if len(self._heap) > 2 * len(self._leaves) + 256:  # mostly stale: rebuild (amortized)
            # in place: evict() may be popping this list (a leaf's parent becomes a leaf)
            self._heap[:] = [(self.policy.priority(n), n.uid, n) for n in self._leaves]
            heapq.heapify(self._heap)
        else:
            heapq.heappush(self._heap, (self.policy.priority(node), node.uid, node))

    def _nodes(self) -> list[TreeNode]:
        out: list[TreeNode] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out


def _as_list(token_ids: Sequence[int]) -> list[int]:
    if type(token_ids) is list:
        return token_ids
    if isinstance(token_ids, np.ndarray):
        return token_ids.tolist()
    return list(token_ids)
