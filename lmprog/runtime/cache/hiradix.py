"""HiRadixCache: the radix tree with host (and optional disk) tiers under it (SGLang's HiCache,
write-back).

A device leaf the pool evicts keeps its node: its KV is copied to host memory by a
`KVMover` (this module stays torch-free) and the node becomes a host node. A match is the
device prefix plus the host nodes continuing it; `load` brings them back within a budget.
Design: docs/design/kv-cache.md.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .allocator import SLOT_DTYPE
from .base import MatchResult, require
from .eviction import EvictionPolicy
from .radix import RadixCache, TreeNode, _as_list, parent_of

_EMPTY = np.empty(0, dtype=SLOT_DTYPE)
log = logging.getLogger(__name__)


# (priority when pushed, uid, node): an entry of a lazy eviction heap
_HeapEntry = tuple[tuple[int, ...], int, TreeNode]


def _host_children(node: TreeNode) -> dict[Any, TreeNode]:
    """The host children of a node that has some (a host node's parent)."""
    assert node.host_children is not None, f"{node} has no host children"
    return node.host_children


class KVMover(Protocol):
    """Copies the KV of pool slots to host memory and back (lmprog.runtime.executor.host_kv)."""

    bytes_per_token: int

    def save(self, slots: np.ndarray) -> Any:
        """A host copy of the KV in `slots` (an opaque handle of len(slots) tokens)."""

    def load(self, handle: Any, slots: np.ndarray, ahead: bool = False) -> None:
        """Write a handle's KV into `slots` (as many as it holds tokens); ahead: a staged
        load, which the next forward pass does not read (it need not wait for it)."""

    def split(self, handle: Any, k: int) -> tuple[Any, Any]:
        """The handles of a handle's first k tokens and of the rest."""

    # the disk tier (only called with one: disk_capacity_tokens > 0)
    def spill(self, handle: Any) -> Any:
        """Write a host handle's KV to disk; the disk handle (OSError: not written)."""

    def load_disk(self, block: Any, slots: np.ndarray, ahead: bool = False) -> None:
        """Check a disk handle's file (size, checksum) and write its KV into `slots`;
        raises if the file is missing, truncated or corrupt."""

    def split_disk(self, block: Any, k: int) -> tuple[Any, Any]:
        """As split, for a disk handle (its file read, checked and written as two)."""

    def discard(self, block: Any) -> None:
        """Delete a disk handle's file."""


class OnDisk:
    """node.host of a node whose KV is in the disk tier (`block`: the mover's handle)."""

    __slots__ = ("block",)

    def __init__(self, block: Any) -> None:
        self.block = block


@dataclass(frozen=True)
class HostMatch(MatchResult):
    """A device match and the host nodes continuing it: (node, tokens matched in it)."""

    host_nodes: tuple[tuple[TreeNode, int], ...] = ()
    host_len: int = 0


@dataclass
class HostTierStats:
    capacity_tokens: int
    disk_capacity_tokens: int = 0
    used_tokens: int = 0
    disk_used_tokens: int = 0
    disk_written_tokens: int = 0  # host tokens spilled to disk
    disk_loaded_tokens: int = 0  # of the host hits (admission's loads), those read from disk
    disk_staged_tokens: int = 0  # of the staged tokens, those read from disk
    disk_evicted_tokens: int = 0  # disk tokens dropped for room (LRU)
    disk_write_failures: int = 0  # spills that raised (a full disk): those tokens dropped
    written_tokens: int = 0  # device nodes evicted into the host tier
    loaded_tokens: int = 0  # host tokens loaded into device slots at admission (host hits)
    staged_tokens: int = 0  # host tokens loaded ahead of admission (predictive staging)
    load_seconds: float = 0.0  # the engine thread's time in admission's loads
    staged_seconds: float = 0.0  # and in staging's
    evicted_tokens: int = 0  # host tokens dropped for room (LRU)
    dropped_tokens: int = 0  # evicted device tokens the host could not take, and host
    # subtrees a device insert replaced
    load_misses: int = 0  # loads that found a host node gone (recomputed instead)
    partial_loads: int = 0  # loads the pool could take only part of (the longest prefix)
    short_tokens: int = 0  # host tokens those loads left behind (recomputed if admitted)
    load_failures: int = 0  # copies that raised: the block dropped, recomputed instead


class HiRadixCache(RadixCache):
    """A RadixCache whose evicted nodes go to a host tier; see docs/design/kv-cache.md."""

    def __init__(
        self,
        page_size: int,
        eviction: str | EvictionPolicy,
        mover: KVMover,
        host_capacity_tokens: int,
        disk_capacity_tokens: int = 0,
    ) -> None:
        self.mover = mover
        self.tier = HostTierStats(
            host_capacity_tokens - host_capacity_tokens % page_size,
            disk_capacity_tokens - disk_capacity_tokens % page_size,
        )
        super().__init__(page_size, eviction)

    def _init_tree(self) -> None:
        super()._init_tree()
        self._host_heap: list[_HeapEntry] = []  # lazy, see below
        self._disk_heap: list[_HeapEntry] = []
        self._pinned: set[TreeNode] = set()
        if hasattr(self, "tier"):
            self.tier.used_tokens = self.tier.disk_used_tokens = 0

    # -- queries ---------------------------------------------------------------------------
    @property
    def host_size(self) -> int:
        """Tokens held in the host tier."""
        return self.tier.used_tokens

    def match_prefix(self, token_ids: Sequence[int]) -> HostMatch:
        ids = _as_list(token_ids)
        match = super().match_prefix(ids)
        limit = len(ids) - len(ids) % self.page_size
        nodes, pos = [], match.length
        for node, k in self._host_walk(match.last_node, ids, pos, limit):
            self._touch(node)
            nodes.append((node, k))
            pos += k
        return HostMatch(match.slots, match.last_node, tuple(nodes), pos - match.length)

    def cached_prefix_len(self, token_ids: Sequence[int]) -> int:
        """Device and host tokens a match would reuse (host ones once loaded)."""
        ids = _as_list(token_ids)
        node, pos, inside = self._cached_walk(ids)
        if inside:
            return pos
        limit = len(ids) - len(ids) % self.page_size
        return pos + sum(k for _, k in self._host_walk(node, ids, pos, limit))

    def _host_walk(
        self, node: TreeNode, ids: list[int], pos: int, limit: int
    ) -> list[tuple[TreeNode, int]]:
        """The host nodes continuing ids[pos:limit] below `node` (which must end at pos)."""
        out = []
        while pos < limit and node.host_children:
            child = node.host_children.get(self._child_key(ids, pos))
            if child is None:
                break
            k = self._match_len(child.key, ids, pos, limit)
            out.append((child, k))
            if k < len(child.key):
                break
            node, pos = child, pos + k
        return out

    # -- loading ---------------------------------------------------------------------------
    def load(
        self,
        match: HostMatch,
        max_tokens: int,
        alloc: Callable[[int], np.ndarray | None],
        staged: bool = False,
    ) -> tuple[MatchResult, np.ndarray]:
        """Bring up to max_tokens (whole pages) of match's host nodes into device slots
        from `alloc(n)`, which returns at most n slots in whole pages (it may evict: the
        nodes to load are kept from host eviction meanwhile), or None for none. When it
        gives fewer, the longest prefix of the nodes that fits is loaded (the rest stays on
        the host; a partial load, counted). Returns the longer match and the slots left
        unused (for the caller to free: a node found gone stops the load). The caller locks
        the new last node. staged: a load ahead of admission (counted apart from
        admission's host hits)."""
        n = min(match.host_len, max_tokens)
        n -= n % self.page_size
        if n <= 0:
            return match, _EMPTY
        self._pinned = {node for node, _ in match.host_nodes}
        try:
            slots = alloc(n)
        finally:
            self._pinned = set()
        got = 0 if slots is None else len(slots)
        assert got <= n and got % self.page_size == 0, f"alloc({n}) gave {got} slots"
        if got < n:
            self.tier.partial_loads += 1
            self.tier.short_tokens += n - got
            n = got
        if slots is None or n == 0:
            return match, _EMPTY
        parent: TreeNode = match.last_node
        used, parts = 0, [match.slots]
        start = time.perf_counter()
        for node, k in match.host_nodes:
            k = min(k, n - used)
            if k <= 0:
                break
            if node.host is None or node.parent is not parent:  # gone meanwhile
                self.tier.load_misses += 1
                break
            part = slots[used : used + k]
            try:  # a split reads and writes the block too (a disk block: its file)
                if k < len(node.key):
                    node = self._split_host(node, k)
                on_disk = isinstance(node.host, OnDisk)
                if on_disk:
                    self.mover.load_disk(node.host.block, part, staged)
                else:
                    self.mover.load(node.host, part, staged)
            except Exception:
                log.exception("loading %d tokens from the host KV tier failed", k)
                self.tier.load_failures += 1
                self.tier.dropped_tokens += self._drop_host_subtree(node)
                del _host_children(parent)[self._child_key(node.key, 0)]
                break
            if on_disk and staged:
                self.tier.disk_staged_tokens += k
            elif on_disk:
                self.tier.disk_loaded_tokens += k
            self._host_to_device(node, part)
            parts.append(part)
            parent, used = node, used + k
        if staged:
            self.tier.staged_tokens += used
            self.tier.staged_seconds += time.perf_counter() - start
        else:
            self.tier.loaded_tokens += used
            self.tier.load_seconds += time.perf_counter() - start
        loaded = MatchResult(np.concatenate(parts) if used else match.slots, parent)
        return loaded, slots[used:]

    def _split_host(self, node: TreeNode, k: int) -> TreeNode:
        """Cut a host node after k tokens; return the upper part (a host node)."""
        assert 0 < k < len(node.key) and k % self.page_size == 0
        parent = parent_of(node)
        mid = TreeNode(node.key[:k], _EMPTY, parent)
        mid.last_access, mid.hit_count = node.last_access, node.hit_count
        if isinstance(node.host, OnDisk):
            upper, lower = self.mover.split_disk(node.host.block, k)
            mid.host, node.host = OnDisk(upper), OnDisk(lower)
        else:
            mid.host, node.host = self.mover.split(node.host, k)
        _host_children(parent)[self._child_key(mid.key, 0)] = mid
        node.key, node.parent = node.key[k:], mid
        mid.host_children = {self._child_key(node.key, 0): node}
        return mid

    def _host_to_device(self, node: TreeNode, slots: np.ndarray) -> None:
        parent = parent_of(node)
        key = self._child_key(node.key, 0)
        del _host_children(parent)[key]
        self._forget_kv(node)
        node.slots = np.array(slots, dtype=SLOT_DTYPE)
        parent.children[key] = node
        self._leaves.discard(parent)
        self._evictable += len(node.key)
        self._touch(node)
        self._add_evictable_leaf(node)

    def reset(self) -> np.ndarray:
        self.drop_tiers()
        return super().reset()

    def drop_tiers(self) -> None:
        """Forget every host node (and delete its file): before the tree is dropped whole
        (reset, or CacheManager.clear after an internal error)."""
        stack = [self.root, *self._nodes()]
        for node in stack:
            if node.host_children:
                for child in node.host_children.values():
                    self._drop_host_subtree(child)
                node.host_children = None

    # -- eviction into the host tier ---------------------------------------------------------
    def evict(self, num_tokens: int) -> np.ndarray:
        self._moved: list[TreeNode] = []
        freed = super().evict(num_tokens)
        for node in self._moved:  # their device slots are the caller's now
            node.slots = _EMPTY
        self._moved = []
        return freed

    def _remove_leaf(self, leaf: TreeNode) -> TreeNode:
        parent = super()._remove_leaf(leaf)
        n = len(leaf.key)
        self._evict_host(self.tier.used_tokens + n - self.tier.capacity_tokens)
        if self.tier.used_tokens + n > self.tier.capacity_tokens:
            self.tier.dropped_tokens += n + self._drop_host_subtree(leaf)
            return parent
        leaf.host = self.mover.save(leaf.slots)
        self._moved.append(leaf)
        self.tier.used_tokens += n
        self.tier.written_tokens += n
        if parent.host_children is None:
            parent.host_children = {}
        parent.host_children[self._child_key(leaf.key, 0)] = leaf
        self._push_host(leaf)
        return parent

    def _add_leaf(self, parent: TreeNode, key: list[int], slots: np.ndarray) -> None:
        if parent.host_children:  # a host child under the same first page: replaced
            old = parent.host_children.pop(self._child_key(key, 0), None)
            if old is not None:
                self.tier.dropped_tokens += self._drop_host_subtree(old)
        super()._add_leaf(parent, key, slots)

    # A host node's KV is in RAM (node.host: the mover's handle) or on disk (an OnDisk). RAM
    # evicts, least recently used first, nodes with no child in RAM (to disk when there is a
    # disk tier, else dropped with what is below them); the disk drops nodes with no host
    # child. Both heaps are lazy: an entry is checked when it surfaces.
    def _ram_victim(self, node: TreeNode) -> bool:
        return (
            node.host is not None
            and not isinstance(node.host, OnDisk)
            and not any(
                c.host is not None and not isinstance(c.host, OnDisk)
                for c in (node.host_children or {}).values()
            )
        )

    def _disk_victim(self, node: TreeNode) -> bool:
        return isinstance(node.host, OnDisk) and not node.host_children

    def _evict_host(self, num_tokens: int) -> None:
        """Move least recently used RAM nodes to disk (or drop them) until num_tokens are
        freed (or none is left but pinned ones)."""
        count = 0
        skipped: list[_HeapEntry] = []
        while count < num_tokens:
            node = self._pop(self._host_heap, self._ram_victim, skipped)
            if node is None:
                break
            n = len(node.key)
            count += n
            if self.tier.disk_capacity_tokens and self._spill(node):
                continue
            self.tier.evicted_tokens += n
            self._remove_host_node(node)
        for entry in skipped:
            heapq.heappush(self._host_heap, entry)

    def _spill(self, node: TreeNode) -> bool:
        """Write a RAM node's KV to the disk tier; False (nothing changed) when it cannot."""
        n = len(node.key)
        self._evict_disk(self.tier.disk_used_tokens + n - self.tier.disk_capacity_tokens)
        if self.tier.disk_used_tokens + n > self.tier.disk_capacity_tokens:
            return False
        try:
            block = self.mover.spill(node.host)
        except OSError:
            log.exception("writing %d tokens to the disk KV tier failed; they are dropped", n)
            self.tier.disk_write_failures += 1
            return False
        node.host = OnDisk(block)
        self.tier.used_tokens -= n
        self.tier.disk_used_tokens += n
        self.tier.disk_written_tokens += n
        self._push_host(parent_of(node))  # it may have been waiting for its last RAM child
        self._push_disk(node)
        return True

    def _evict_disk(self, num_tokens: int) -> None:
        count = 0
        skipped: list[_HeapEntry] = []
        while count < num_tokens:
            node = self._pop(self._disk_heap, self._disk_victim, skipped)
            if node is None:
                break
            count += len(node.key)
            self.tier.disk_evicted_tokens += len(node.key)
            self._remove_host_node(node)
        for entry in skipped:
            heapq.heappush(self._disk_heap, entry)

    def _pop(
        self, heap: list[_HeapEntry], valid: Callable[[TreeNode], bool], skipped: list[_HeapEntry]
    ) -> TreeNode | None:
        """The first valid, unpinned node of a lazy heap by current priority (None: none)."""
        prio = self.policy.priority
        while heap:
            stored, _, node = heapq.heappop(heap)
            if not valid(node):
                continue
            if node in self._pinned:
                skipped.append((stored, node.uid, node))
                continue
            current = prio(node)
            if current != stored:
                heapq.heappush(heap, (current, node.uid, node))
                continue
            return node
        return None

    def _remove_host_node(self, node: TreeNode) -> None:
        """Take a host node and everything below it out of the tree."""
        parent = parent_of(node)
        del _host_children(parent)[self._child_key(node.key, 0)]
        self.tier.dropped_tokens += self._drop_host_subtree(node) - len(node.key)
        self._push_host(parent)
        self._push_disk(parent)

    def _forget_kv(self, node: TreeNode) -> None:
        """Drop node's host copy from the counts (and its file); node.host becomes None."""
        if isinstance(node.host, OnDisk):
            self.tier.disk_used_tokens -= len(node.key)
            self.mover.discard(node.host.block)
        elif node.host is not None:
            self.tier.used_tokens -= len(node.key)
        node.host = None

    def _drop_host_subtree(self, node: TreeNode) -> int:
        """Forget node's host KV and every host node under it; return the tokens freed."""
        freed, stack = 0, [node]
        while stack:
            n = stack.pop()
            if n.host is not None:
                freed += len(n.key)
                self._forget_kv(n)
            if n.host_children:
                stack.extend(n.host_children.values())
                n.host_children = None
        return freed

    def _push_host(self, node: TreeNode) -> None:
        if self._ram_victim(node):
            self._push(self._host_heap, node)

    def _push_disk(self, node: TreeNode) -> None:
        if self._disk_victim(node):
            self._push(self._disk_heap, node)

    def _push(self, heap: list[_HeapEntry], node: TreeNode) -> None:
        heapq.heappush(heap, (self.policy.priority(node), node.uid, node))
        if len(heap) > 4 * (self.tier.used_tokens + self.tier.disk_used_tokens) + 256:
            valid = self._ram_victim if heap is self._host_heap else self._disk_victim
            live = {e[2] for e in heap if valid(e[2])}
            heap[:] = [(self.policy.priority(n), n.uid, n) for n in live]
            heapq.heapify(heap)

    # -- integrity ---------------------------------------------------------------------------
    def check_integrity(self, lock_holders: Sequence[Any] | None = None) -> None:
        super().check_integrity(lock_holders)
        host_nodes: list[TreeNode] = []
        stack = [self.root, *self._nodes()]
        for node in stack:
            require(node.host is None, f"hiradix: device {node} has a host copy")
            self._check_host_children(node, host_nodes)
        t = self.tier
        disk = [n for n in host_nodes if isinstance(n.host, OnDisk)]
        used = sum(len(n.key) for n in host_nodes) - sum(len(n.key) for n in disk)
        on_disk = sum(len(n.key) for n in disk)
        require(used == t.used_tokens, f"hiradix: RAM tier counts {t.used_tokens}, holds {used}")
        require(
            on_disk == t.disk_used_tokens,
            f"hiradix: disk tier counts {t.disk_used_tokens} tokens but holds {on_disk}",
        )
        require(used <= t.capacity_tokens, f"hiradix: {used} host tokens past the budget")
        require(on_disk <= t.disk_capacity_tokens, f"hiradix: {on_disk} disk tokens past it")
        for heap, valid, what in (
            (self._host_heap, self._ram_victim, "RAM"),
            (self._disk_heap, self._disk_victim, "disk"),
        ):
            queued = {entry[2] for entry in heap}
            require(
                all(n in queued for n in host_nodes if valid(n)),
                f"hiradix: an evictable {what} node is missing from its heap",
            )
        require(not self._pinned, "hiradix: host nodes pinned between loads")

    def _check_host_children(self, node: TreeNode, out: list[TreeNode]) -> None:
        for key, child in (node.host_children or {}).items():
            require(key not in node.children, f"hiradix: {child} shadows a device child")
            require(child.parent is node, f"hiradix: host {child} has a wrong parent")
            require(key == self._child_key(child.key, 0), f"hiradix: {child} under a wrong key")
            require(child.host is not None, f"hiradix: host {child} holds no KV")
            require(not child.children, f"hiradix: host {child} has device children")
            require(child.lock_ref == 0, f"hiradix: host {child} is locked")
            p = self.page_size
            require(
                len(child.key) > 0 and len(child.key) % p == 0,
                f"hiradix: host {child} key is not a positive multiple of {p}",
            )
            out.append(child)
            self._check_host_children(child, out)

    def stats(self) -> dict[str, float]:
        h = self.tier
        disk = {}
        if h.disk_capacity_tokens:
            disk = {
                "disk_kv_capacity_tokens": h.disk_capacity_tokens,
                "disk_kv_capacity_bytes": h.disk_capacity_tokens * self.mover.bytes_per_token,
                "disk_kv_used_tokens": h.disk_used_tokens,
                "disk_kv_used_bytes": h.disk_used_tokens * self.mover.bytes_per_token,
                "disk_kv_written_tokens": h.disk_written_tokens,
                "disk_kv_hit_tokens": h.disk_loaded_tokens,
                "disk_kv_staged_tokens": h.disk_staged_tokens,
                "disk_kv_evicted_tokens": h.disk_evicted_tokens,
                "disk_kv_write_failures": h.disk_write_failures,
            }
        return {
            **disk,
            "host_kv_capacity_tokens": h.capacity_tokens,
            "host_kv_capacity_bytes": h.capacity_tokens * self.mover.bytes_per_token,
            "host_kv_used_tokens": h.used_tokens,
            "host_kv_used_bytes": h.used_tokens * self.mover.bytes_per_token,
            "host_kv_written_tokens": h.written_tokens,
            "host_kv_hit_tokens": h.loaded_tokens,
            "host_kv_staged_tokens": h.staged_tokens,
            "host_kv_load_seconds": h.load_seconds,
            "host_kv_staged_load_seconds": h.staged_seconds,
            "host_kv_evicted_tokens": h.evicted_tokens,
            "host_kv_dropped_tokens": h.dropped_tokens,
            "host_kv_load_misses": h.load_misses,
            "host_kv_partial_loads": h.partial_loads,
            "host_kv_short_tokens": h.short_tokens,
            "host_kv_load_failures": h.load_failures,
        }
