"""The whole-system integrity check of the KV slots (CacheManager.check_integrity).

Every slot in 1..num_slots is, at all times, exactly one of
    free in the allocator | held by a prefix-cache node | owned by one running request
and every running request's row agrees with its locked cache path and its lengths.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np

from ..request import Req
from .allocator import TokenSlotAllocator
from .base import PrefixCache, require
from .req_table import ReqToTokenTable


class CacheParts(Protocol):
    """What the check reads of a CacheManager."""

    allocator: TokenSlotAllocator
    req_table: ReqToTokenTable
    prefix_cache: PrefixCache
    page_size: int
    kv_limit: int | None


def check_integrity(cache: CacheParts, running: Iterable[Req]) -> None:
    """Raise IntegrityError unless allocator, prefix cache, table and the running requests
    agree: every slot free, cached or owned exactly once, rows and locks consistent."""
    reqs = list(running)
    cache.allocator.check_integrity()
    cache.req_table.check_integrity()
    cache.prefix_cache.check_integrity([r.last_node for r in reqs])
    parts = [cache.allocator.free_slots(), cache.prefix_cache.all_slots()]
    for req in reqs:
        parts.append(_check_req(cache, req))
    rows = sorted(r.row for r in reqs if r.row is not None)  # each checked above
    in_use = cache.req_table.rows_in_use().tolist()
    require(rows == in_use, f"rows in use {in_use} but requests hold {rows}")
    _check_partition(cache.allocator.num_slots, np.concatenate(parts))


def _check_req(cache: CacheParts, req: Req) -> np.ndarray:
    """Check req's lengths and row; return the slots it owns."""
    p = cache.page_size
    require(req.row is not None, f"{req}: running without a row")
    require(
        0 <= req.cache_len <= req.num_computed <= req.num_allocated <= cache.req_table.width,
        f"{req}: need cache_len <= num_computed <= num_allocated <= table width",
    )
    require(req.num_computed <= req.seq_len, f"{req}: more tokens computed than known")
    require(
        cache.kv_limit is None or req.num_allocated <= cache.kv_limit,
        f"{req}: KV past the attention-sink window of {cache.kv_limit} positions",
    )
    require(
        req.cache_len % p == 0 and req.num_allocated % p == 0,
        f"{req}: cache_len / num_allocated not whole pages of {p}",
    )
    row = cache.req_table.table[req.row]
    require(
        np.array_equal(row[: req.cache_len], cache.prefix_cache.path_slots(req.last_node)),
        f"{req}: row prefix differs from the slots of its locked cache path",
    )
    require(not row[req.num_allocated :].any(), f"{req}: row has slots past num_allocated")
    return row[req.cache_len : req.num_allocated]


def _check_partition(n: int, slots: np.ndarray) -> None:
    """Every slot of 1..n appears exactly once in slots."""
    require(
        not len(slots) or (int(slots.min()) >= 1 and int(slots.max()) <= n),
        f"a slot outside 1..{n} is in use (0 is the dummy)",
    )
    counts = np.bincount(slots, minlength=n + 1)[1:]
    lost, double = np.flatnonzero(counts == 0) + 1, np.flatnonzero(counts > 1) + 1
    require(
        not len(double),
        f"slots {double[:8].tolist()} are held twice (free, cached or owned by a request)",
    )
    require(
        not len(lost),
        f"slots {lost[:8].tolist()} leaked: neither free, cached nor owned by a running request",
    )
