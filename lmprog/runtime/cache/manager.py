"""CacheManager: the one owner of KV slots — allocator, prefix cache and req_to_token table.

Every slot in 1..num_slots is, at all times, exactly one of
    free in the allocator | held by a prefix-cache node | owned by one running request
(request rows: [0, cache_len) are the cache's, locked; [cache_len, num_allocated) are the
request's own; see lmprog.runtime.request). `check_integrity(running)` verifies exactly that
(integrity.py). The manager mutates `Req` fields row, last_node, cache_len, num_computed,
num_allocated and row_dirty; nothing else touches them but attention sinks' eviction of a
request's middle tokens (sinks.py `evict_middle`, over the manager's parts).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..config import CacheConfig
from ..request import Req
from .allocator import TokenSlotAllocator
from .base import MatchResult, PrefixCache, require
from .disabled import NoPrefixCache
from .hiradix import HiRadixCache, HostMatch, KVMover
from .integrity import check_integrity
from .radix import RadixCache
from .req_table import ReqToTokenTable


def make_prefix_cache(config: CacheConfig, mover: KVMover | None = None) -> PrefixCache:
    """The prefix cache `config` asks for; with a host tier (host_kv_cache_bytes and the
    pool's `mover`), a HiRadixCache."""
    if not config.radix_cache:
        return NoPrefixCache(config.page_size)
    if mover is not None and config.host_kv_cache_bytes:
        tokens = config.host_kv_cache_bytes // mover.bytes_per_token
        disk = config.disk_kv_cache_bytes // mover.bytes_per_token
        return HiRadixCache(config.page_size, config.eviction, mover, tokens, disk)
    return RadixCache(config.page_size, config.eviction)


class CacheManager:
    """Owns the KV slots of the pool. Single-threaded: call from the engine loop only."""

    def __init__(
        self,
        num_slots: int,
        max_running_requests: int,
        max_context_len: int,
        config: CacheConfig,
        kv_limit: int | None = None,
    ) -> None:
        """kv_limit: the most positions a request's KV may hold (attention sinks: the sinks
        plus the window); None: its length cap bounds it."""
        self.config = config
        self.kv_limit = kv_limit
        self.page_size = config.page_size
        self._num_slots = num_slots
        self.allocator = TokenSlotAllocator(num_slots, config.page_size)
        self.prefix_cache = make_prefix_cache(config)
        self.req_table = ReqToTokenTable(max_running_requests, max_context_len, config.page_size)
        self._caching = config.radix_cache
        self._mover: KVMover | None = None

    def attach_host_tier(self, mover: KVMover) -> None:
        """Give the prefix cache its host tier (config.host_kv_cache_bytes), `mover` copying
        the pool's KV; at start-up, before anything is cached."""
        require(self.prefix_cache.total_size == 0, "attach_host_tier() after caching began")
        self._mover = mover
        self.prefix_cache = make_prefix_cache(self.config, mover)

    # -- sizes -----------------------------------------------------------------------------
    @property
    def req_to_token(self) -> np.ndarray:
        """The int32 [max_running_requests, width] table (a live view; see ReqToTokenTable)."""
        return self.req_table.table

    @property
    def capacity(self) -> int:
        """Usable slots of the pool (whole pages)."""
        return self.allocator.num_slots

    @property
    def available_tokens(self) -> int:
        """Slots obtainable now: free ones plus evictable cached ones."""
        return self.allocator.num_free + self.prefix_cache.evictable_size

    def round_up(self, num_tokens: int) -> int:
        p = self.page_size
        return -(-num_tokens // p) * p

    def tokens_to_extend(self, req: Req, end: int) -> int:
        """Slots req must be given so that positions [0, end) have one (whole pages)."""
        return max(0, self.round_up(end) - req.num_allocated)

    def tier_stats(self) -> dict[str, int] | None:
        """The host tier's usage and hits (HiRadixCache.stats); None without one."""
        stats = getattr(self.prefix_cache, "stats", None)
        return None if stats is None else stats()

    def cached_prefix_len(self, req: Req) -> int:
        """How many tokens admitting req now would reuse. Reads only."""
        return self.prefix_cache.cached_prefix_len(req.prefix_key(self._match_limit(req)))

    def make_room(self, num_tokens: int) -> None:
        """Evict cached entries until num_tokens slots are free (or nothing is evictable)."""
        short = num_tokens - self.allocator.num_free
        if short > 0:
            self.allocator.free(self.prefix_cache.evict(short))

    # -- request lifecycle -----------------------------------------------------------------
    def admit(self, req: Req) -> bool:
        """Give req a row and lock its cached device prefix: at most seq_len - 1 tokens (at
        least one is left to compute) and none from prompt_logprob_start on (their logits are
        wanted). With a host tier, `load_host_prefix` then brings back what continues it
        there. False, changing nothing, when no row is free."""
        assert req.row is None and req.last_node is None
        row = self.req_table.alloc()
        if row is None:
            return False
        match = self.prefix_cache.match_prefix(req.prefix_key(self._match_limit(req)))
        self.prefix_cache.lock(match.last_node)
        self.req_table.table[row, : match.length] = match.slots
        req.row, req.last_node = row, match.last_node
        req.cache_len = req.num_computed = req.num_allocated = match.length
        req.row_dirty = True
        return True

    def load_host_prefix(self, req: Req, limit: int) -> tuple[int, int]:
        """Load up to `limit` tokens of the host-tier (or disk-tier) prefix continuing an
        admitted req's locked one into new slots (evicting what must go), before anything of
        it is computed; they join its cached prefix. Returns (tokens loaded, of those read
        from disk). Call it only once req is sure to run: a load whose request is then
        released is a wasted copy (the blocks stay cached, evictable, and go back to host)."""
        assert req.row is not None and req.num_computed == req.cache_len
        cache = self.prefix_cache
        if limit <= 0 or not isinstance(cache, HiRadixCache):
            return 0, 0
        match = cache.match_prefix(req.prefix_key(self._match_limit(req)))
        if not match.host_len:
            return 0, 0
        assert match.last_node is req.last_node, "the locked prefix must match first"
        disk = cache.tier.disk_loaded_tokens
        loaded = self._load_host(match, limit)
        n = loaded.length - match.length
        if n:
            self.req_table.table[req.row, match.length : loaded.length] = loaded.slots[
                match.length :
            ]
            req.last_node = loaded.last_node
            req.cache_len = req.num_computed = req.num_allocated = loaded.length
        return n, cache.tier.disk_loaded_tokens - disk

    @property
    def stages(self) -> bool:
        """Whether waiting requests' host-tier prefixes are loaded ahead (`stage`)."""
        return self._mover is not None and self.config.host_kv_staging

    def stage(self, req: Req, limit: int, room: int, need: int) -> tuple[int, int]:
        """Predictive staging: load up to `limit` tokens of waiting req's host-tier prefix
        into device slots now (evicting least recently used entries), where they stay as
        the freshest cached nodes until its admission finds them; only when req would then
        fit, its `need` slots (from nothing cached) less its device prefix within `room`:
        blocks staged for a request that cannot be admitted are evicted again before it is,
        a wasted copy both ways. Returns (tokens loaded, the slots req will take: need less
        its device prefix, plus that prefix where it was evictable: admission locks it)."""
        match = self.prefix_cache.match_prefix(req.prefix_key(self._match_limit(req)))
        evictable = self.prefix_cache.evictable_size
        self.prefix_cache.lock(match.last_node)
        locked = evictable - self.prefix_cache.evictable_size
        takes = need - match.length + locked
        limit = min(limit, room - locked)
        if limit <= 0 or takes > room or not (isinstance(match, HostMatch) and match.host_len):
            self.prefix_cache.unlock(match.last_node)
            return 0, takes
        loaded = self._load_host(match, limit, staged=True)
        self.prefix_cache.unlock(loaded.last_node)
        return loaded.length - match.length, takes

    def extend(self, reqs: Sequence[Req], counts: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Give each reqs[i] slots for positions [num_computed, num_computed + counts[i])
        (evicting cached entries if needed) and write them into its row.

        Returns (out_slots, positions), concatenated in order: the slot and position of every
        token to be fed. The caller must have checked `tokens_to_extend` against
        `available_tokens`; running out here is a bug (AssertionError).
        """
        if self.page_size == 1:  # between steps num_allocated == num_computed
            need: list[int] = []
            total = sum(counts)
        else:
            need = [self.tokens_to_extend(r, r.num_computed + n) for r, n in zip(reqs, counts)]
            total = sum(need)
        self.make_room(total)
        fresh = self.allocator.alloc(total)
        assert fresh is not None, f"extend needs {total} slots; check available_tokens first"
        if self.page_size == 1:
            return self._extend_tokens(reqs, counts, fresh)
        return self._extend_pages(reqs, counts, need, fresh)

    def cache_progress(self, req: Req) -> None:
        """Insert req's computed tokens into the prefix cache now (after a prefill chunk), so
        other requests can reuse them; its row then points at the cached slots. No-op when
        caching is off or nothing new is computed."""
        aligned = req.num_computed - req.num_computed % self.page_size
        if not self._caching or aligned <= req.cache_len or req.num_evicted:
            return
        present = self._insert(req, aligned)
        match = self.prefix_cache.match_prefix(req.prefix_key(aligned))
        assert match.length == aligned, "an inserted prefix must match in full"
        self.prefix_cache.lock(match.last_node)
        self.prefix_cache.unlock(req.last_node)
        if present > req.cache_len:  # our duplicates were freed: point at the cached copies
            self.req_table.table[req.row, req.cache_len : present] = match.slots[
                req.cache_len : present
            ]
            req.row_dirty = True
        req.last_node, req.cache_len = match.last_node, aligned

    def trim(self, req: Req, keep: int) -> None:
        """Forget the KV of positions >= keep (rejected drafts, rewritten tokens): set
        num_computed = keep and free the own pages past it. Cutting into the cached prefix
        re-matches the kept tokens (the row is rewritten, row_dirty set)."""
        assert 0 <= keep <= req.num_allocated, f"trim to {keep} past the allocated {req}"
        if keep < req.cache_len:
            self._free_own(req, req.cache_len)
            match = self.prefix_cache.match_prefix(req.prefix_key(keep))
            self.prefix_cache.lock(match.last_node)
            self.prefix_cache.unlock(req.last_node)
            self.req_table.table[req.row, : req.cache_len] = 0
            self.req_table.table[req.row, : match.length] = match.slots
            req.last_node, req.cache_len, req.num_allocated = (
                match.last_node,
                match.length,
                match.length,
            )
            req.num_computed, req.row_dirty = match.length, True
            return
        self._free_own(req, max(req.cache_len, self.round_up(keep)))
        req.num_computed = keep

    def release(self, req: Req, cache: bool = True) -> None:
        """Take back everything req holds: its computed tokens go into the prefix cache (when
        `cache` and caching is on), the rest of its slots are freed, its lock and row are
        released. Afterwards req holds nothing (row None, lengths 0)."""
        if req.row is None:
            return
        aligned = req.num_computed - req.num_computed % self.page_size
        if cache and self._caching and aligned > req.cache_len and not req.num_evicted:
            self._insert(req, aligned)
            req.cache_len = aligned  # [.., aligned) now belongs to the cache
        self._free_own(req, req.cache_len)
        self.prefix_cache.unlock(req.last_node)
        self.req_table.free(req.row, req.cache_len)
        _detach(req)

    def reset(self) -> None:
        """Empty the prefix cache (no request may be running)."""
        require(
            self.req_table.num_free == self.req_table.num_rows,
            "reset() while requests hold rows; release them first",
        )
        self.allocator.free(self.prefix_cache.reset())

    def clear(self, holders: Iterable[Req]) -> None:
        """Start over: every slot free, the prefix cache empty, every row free, and `holders`
        (the requests that held KV) holding nothing. For when the bookkeeping cannot be
        trusted (an internal error). The req_to_token array is kept (the runner shares it)."""
        self.allocator = TokenSlotAllocator(self._num_slots, self.page_size)
        drop_tiers = getattr(self.prefix_cache, "drop_tiers", None)
        if drop_tiers is not None:  # a host tier's memory and disk files go too
            drop_tiers()
        self.prefix_cache = make_prefix_cache(self.config, self._mover)
        self.req_table.clear()
        for req in holders:
            _detach(req)

    # -- integrity -------------------------------------------------------------------------
    def check_integrity(self, running: Iterable[Req]) -> None:
        """Raise IntegrityError unless allocator, prefix cache, table and the running requests
        agree: every slot free, cached or owned exactly once, rows and locks consistent."""
        check_integrity(self, running)

    # -- internals -------------------------------------------------------------------------
    def _load_host(self, match: HostMatch, limit: int, staged: bool = False) -> MatchResult:
        """Load up to `limit` tokens of a locked match's host part into new slots (evicting
        what must go; as many whole pages as the pool can take, the rest left on the host);
        the lock moves to the loaded end."""

        def alloc(n: int) -> np.ndarray | None:  # as much of n as the pool can take
            self.make_room(n)
            fits = min(n, self.allocator.num_free)  # both whole pages
            return self.allocator.alloc(fits) if fits else None

        cache = self.prefix_cache
        assert isinstance(cache, HiRadixCache), "a host match comes from a HiRadixCache"
        loaded, unused = cache.load(match, limit, alloc, staged)
        self.allocator.free(unused)
        if loaded.last_node is not match.last_node:
            self.prefix_cache.lock(loaded.last_node)
            self.prefix_cache.unlock(match.last_node)
        return loaded

    def _match_limit(self, req: Req) -> int:
        """How much of req admission may take from the prefix cache: not its last token nor
        from prompt_logprob_start on, and (attention sinks) leaving room for one token."""
        limit = req.seq_len - 1
        if req.prompt_logprob_start is not None:
            limit = min(limit, req.prompt_logprob_start)
        if self.kv_limit is not None:
            limit = min(limit, self.kv_limit - 1)
        return limit

    def _insert(self, req: Req, aligned: int) -> int:
        """Insert tokens [0, aligned) with req's slots; free req's duplicates of cached
        tokens. Returns how many were cached already (>= cache_len: the locked path)."""
        row = self.req_table.table[req.row]
        present = self.prefix_cache.insert(req.prefix_key(aligned), row[:aligned])
        assert present >= req.cache_len, "the locked prefix must still be cached"
        self.allocator.free(row[req.cache_len : present])
        return present

    def _free_own(self, req: Req, start: int) -> None:
        """Free req's own slots from position start (a page boundary) to num_allocated."""
        if start < req.num_allocated:
            row = self.req_table.table[req.row]
            self.allocator.free(row[start : req.num_allocated])
            row[start : req.num_allocated] = 0
            req.num_allocated = start

    def _extend_tokens(
        self, reqs: Sequence[Req], counts: Sequence[int], fresh: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        # page_size 1: the fresh slots are exactly the out slots, in order
        rows, positions = _rows_positions(reqs, counts, len(fresh))
        self.req_table.table[rows, positions] = fresh
        for req, count in zip(reqs, counts):
            req.num_allocated = req.num_computed + count
        return fresh, positions

    def _extend_pages(
        self, reqs: Sequence[Req], counts: Sequence[int], need: list[int], fresh: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        # whole new pages go after num_allocated; the out slots may start in a partly used one
        table, used = self.req_table.table, 0
        for req, n in zip(reqs, need):
            if n:
                table[req.row, req.num_allocated : req.num_allocated + n] = fresh[used : used + n]
                used += n
                req.num_allocated += n
        rows, positions = _rows_positions(reqs, counts, sum(counts))
        return table[rows, positions], positions


def _detach(req: Req) -> None:
    """req holds no KV: no row, no lock, nothing computed or allocated."""
    req.row, req.last_node, req.row_dirty = None, None, False
    req.cache_len = req.num_computed = req.num_allocated = 0


def _rows_positions(
    reqs: Sequence[Req], counts: Sequence[int], total: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per fed token: its request's row and its position (num_computed + i)."""
    starts = np.fromiter([r.num_computed for r in reqs], dtype=np.int64, count=len(reqs))
    rows = np.fromiter([r.row for r in reqs], dtype=np.int64, count=len(reqs))
    if total == len(reqs):  # all decodes: one token each
        return rows, starts
    n = np.asarray(counts, dtype=np.int64)
    positions = np.repeat(starts - (np.cumsum(n) - n), n) + np.arange(total)
    return np.repeat(rows, n), positions
