"""Attention sinks, the cache's side: forgetting the KV of a running request's middle tokens
(how many and when: scheduler/sinks.py).

A request whose middle tokens were evicted holds KV that no longer belongs to its token
prefix (kept keys were re-rotated, and were computed while the evicted tokens were
visible), so nothing of it past its cached prefix ever enters the prefix cache
(`req.num_evicted` stops CacheManager.cache_progress and release); the cached prefix itself
(at most the sinks) stays valid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..request import Req

if TYPE_CHECKING:
    from .manager import CacheManager


def copies_needed(req: Req, end: int) -> int:
    """Fresh slots evict_middle(cache, req, start, end - start) takes: one per kept computed
    token in a slot of the prefix cache (that copy is shared: it is not rotated)."""
    return max(0, req.cache_len - end)


def evict_middle(
    cache: CacheManager, req: Req, start: int, delta: int
) -> tuple[np.ndarray, np.ndarray]:
    """Forget the KV of positions [start, start + delta) of running req and move its later
    positions down by delta (whole pages); return (src, dst), the kept computed tokens' slots
    before and after, for the caller to move (keys re-rotated) before anything else writes the
    pool. The caller deletes the tokens. Diagram: docs/design/attention-sinks.md.
    """
    p, end = cache.page_size, start + delta
    assert start % p == 0 and delta % p == 0 and 0 < delta and end <= req.num_computed
    row = cache.req_table.table[req.row]
    old_cache_len = req.cache_len
    if old_cache_len > start:  # the kept part of the cached prefix becomes our own copy
        match = cache.prefix_cache.match_prefix(req.prefix_key(start))
        assert match.length == start, "a locked prefix must match in full"
        cache.prefix_cache.lock(match.last_node)
        cache.prefix_cache.unlock(req.last_node)
        req.last_node, req.cache_len = match.last_node, start
    own_from = max(start, old_cache_len)
    if own_from < end:
        cache.allocator.free(row[own_from:end])
    src = row[end : req.num_computed].copy()
    dst = src.copy()
    shared = max(0, old_cache_len - end)
    if shared:
        cache.make_room(shared)
        fresh = cache.allocator.alloc(shared)
        assert fresh is not None, f"evict_middle needs {shared} slots; check copies_needed"
        dst[:shared] = fresh
    kept = req.num_allocated - end
    row[start : start + kept] = np.concatenate([dst, row[req.num_computed : req.num_allocated]])
    row[start + kept : req.num_allocated] = 0
    req.num_computed -= delta
    req.num_allocated -= delta
    req.row_dirty = True
    return src, dst
