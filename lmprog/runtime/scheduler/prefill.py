"""Prefill policy: chunks of pending prompts, and which waiting requests to admit.

Running requests with several pending tokens go first (oldest first), then waiting ones in
cache-aware order (LPM while the queue is short, FCFS when long), keeping room for the
running requests' future tokens. Design: docs/design/scheduling.md.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..cache.manager import CacheManager
from ..cache.radix import RadixCache
from ..config import SchedulerConfig
from ..request import Req
from .budget import NewTokenRatio, StepBudget
from .plan import StepPlan
from .requests import RequestTable


class PrefillPolicy:
    def __init__(
        self,
        config: SchedulerConfig,
        cache: CacheManager,
        requests: RequestTable,
        ratio: NewTokenRatio,
        max_loras: int | None = None,
    ) -> None:
        self.config = config
        self.max_loras = max_loras
        self.cache = cache
        self.requests = requests
        self.ratio = ratio
        self.admitted_prompt_tokens = 0  # first admissions only (retractions not recounted)
        self.admitted_cached_tokens = 0  # of those, hits (device, host and disk tiers)
        self.admitted_host_tokens = 0  # of those, loaded from the host tier (disk included)
        self.admitted_disk_tokens = 0  # of those, read from the disk tier

    def continue_running(
        self, extenders: Iterable[Req], plan: StepPlan, budget: StepBudget
    ) -> None:
        """Plan the next chunk of every running request with several pending tokens. One
        whose whole pending tail fits and that carries draft_ids (a jump-forward's forced
        tokens, see Scheduler.decoding) feeds what fits of its drafts after the tail: a
        verify entry (batch.py); drafts of a tail fed in several chunks are not verified."""
        for req in extenders:
            if budget.tokens <= 0:
                return
            n = plan.max_chunk(req, min(req.pending_len, budget.tokens))
            if req.images:
                n = budget.fit_images(req.images, req.num_computed, n)
            if n <= 0:
                continue
            drafts: tuple[int, ...] = ()
            if req.draft_ids:  # a jump-forward tail: they follow it only when it is fed whole
                if n == req.pending_len:
                    drafts = plan.fitting_drafts(req, n, budget.tokens - n)
                else:
                    req.draft_ids, req.draft_parents = [], None
            plan.add(req, n + len(drafts), drafts, parents=plan.draft_parents(req, len(drafts)))
            budget.take(n + len(drafts))

    def admit_waiting(self, plan: StepPlan, budget: StepBudget) -> None:
        """Admit waiting requests (status -> running) while budget, rows and memory last."""
        waiting = self.requests.waiting
        if not waiting or budget.tokens <= 0 or budget.new_reqs <= 0:
            return
        ordered, lpm = self.order(waiting)
        inflight = self._inflight(plan) if lpm and self.config.stagger_min_tokens else None
        reserve = self._running_reserve(plan)
        adapters = self._running_adapters()
        for req, cached in ordered:
            if budget.tokens <= 0 or budget.new_reqs <= 0:
                return
            if inflight is not None and inflight.should_wait(req, cached):
                continue
            if adapters is not None and not self._adapter_fits(req, adapters):
                continue  # every adapter slot is taken by running requests of others
            future = self._try_admit(req, plan, budget, reserve)
            if future is None:
                return  # no row or no memory: later requests wait their turn too
            reserve += future
            if adapters is not None and req.lora_id:
                adapters.add(req.lora_id)
            if inflight is not None:
                inflight.add(req)

    def _running_adapters(self) -> set[int] | None:
        """The LoRA adapters of the running requests (None: adapters are not limited)."""
        if self.max_loras is None:
            return None
        return {r.lora_id for r in self.requests.running_reqs() if r.lora_id}

    def _adapter_fits(self, req: Req, adapters: set[int]) -> bool:
        assert self.max_loras is not None
        return not req.lora_id or req.lora_id in adapters or len(adapters) < self.max_loras

    def order(self, waiting: list[Req]) -> tuple[list[tuple[Req, int]], bool]:
        """Waiting requests in admission order with their cached prefix lengths (-1 when
        not computed), and whether LPM was used."""
        if self.config.schedule_policy == "fcfs" or len(waiting) > self.config.lpm_max_queue:
            return [(r, -1) for r in waiting], False
        scored = [(r, self.cache.cached_prefix_len(r)) for r in waiting]
        scored.sort(key=lambda rc: (-rc[1], rc[0].arrival))
        return scored, True

    def _try_admit(self, req: Req, plan: StepPlan, budget: StepBudget, reserve: int) -> int | None:
        """Admit req with its first chunk; return the slots to keep for its future, or None
        (nothing changed) when it does not fit."""
        alone = not self.requests.running and not plan.items
        if not self.cache.admit(req):
            return None
        n = plan.max_chunk(req, min(req.pending_len, budget.tokens))
        need = self.cache.tokens_to_extend(req, req.num_computed + n)
        future = self._future(req, req.num_computed + n)
        # the fit is checked before any host-tier load: loaded tokens take slots as computed
        # ones would (need + future is the same either way), and a request released after
        # its load would leave the copy wasted and recount it on its next try
        if n <= 0 or (not alone and need + future + reserve > plan.memory_left()):
            self.cache.release(req, cache=False)
            return None
        # host-tier tokens, leaving the rest of the request room (a page when alone)
        limit = plan.memory_left() - (self.cache.page_size if alone else reserve)
        loaded, from_disk = self.cache.load_host_prefix(req, limit)
        if loaded:
            n = plan.max_chunk(req, min(req.pending_len, budget.tokens))
        if req.images and n > 0:  # its images' encoder work, once the request fits
            n = budget.fit_images(req.images, req.num_computed, n)
        if n <= 0:  # (the loaded blocks stay cached: its next try finds them)
            self.cache.release(req, cache=False)
            return None
        need = self.cache.tokens_to_extend(req, req.num_computed + n)
        future = self._future(req, req.num_computed + n)
        self.requests.start(req)
        if req.num_retractions == 0:
            req.cached_tokens = req.cache_len
            req.cached_host_tokens, req.cached_disk_tokens = loaded, from_disk
            self.admitted_prompt_tokens += req.prompt_len
            self.admitted_cached_tokens += req.cache_len
            self.admitted_host_tokens += loaded
            self.admitted_disk_tokens += from_disk
        plan.add(req, n, (), need)
        budget.take(n, new_req=True)
        return future

    def stage_waiting(self) -> int:
        """Predictive staging (TierKV; after the step is allocated): start loading the
        host-tier prefixes of the waiting requests next in line (as many as rows are free,
        at least one) into the KV pool, up to one step's token budget, while each of them
        would fit beside what the running requests may still need (as admission checks: a
        block staged for a request that cannot run yet is evicted again before it does);
        the tokens staged. Their admission then finds them on
        the device (on CUDA the copy runs on a side stream meanwhile)."""
        if not self.cache.stages or not self.requests.waiting:
            return 0
        reserve = sum(self._future(r, r.num_allocated) for r in self.requests.running_reqs())
        room = self.cache.available_tokens - reserve  # for the staged requests, all of them
        left = self.config.max_num_batched_tokens  # the copies' budget
        rows = max(1, self.config.max_running_requests - self.requests.num_running)
        staged = 0
        ordered, _ = self.order(self.requests.waiting)  # in admission order
        for req, _ in ordered[:rows]:
            if min(left - staged, room) < self.cache.page_size:
                break
            n, takes = self.cache.stage(req, min(left - staged, room), room, self._future(req, 0))
            if takes > room:  # admission stops at it too: the requests after it wait
                break
            staged, room = staged + n, room - takes
        return staged

    def _running_reserve(self, plan: StepPlan) -> int:
        """Slots the running requests may still need after this step's planned work."""
        planned = {id(r): n for r, n, _, _ in plan.items}
        return sum(
            self._future(req, req.num_computed + planned.get(id(req), 0))
            for req in self.requests.running_reqs()
        )

    def _future(self, req: Req, computed: int) -> int:
        """Slots req may still need once `computed` of its tokens are: the rest of its known
        tokens and a share of those it may generate; with attention sinks at most the rest
        of its window (evictions make room for more)."""
        rest = max(0, req.seq_len - computed)
        future = rest + self.ratio.reserve(req.remaining_tokens, self.config.reserve_clip_tokens)
        limit = self.cache.kv_limit
        return future if limit is None else min(future, max(0, limit - computed))

    def _inflight(self, plan: StepPlan) -> _InflightPrefixes:
        inflight = _InflightPrefixes(self.config.stagger_min_tokens)
        for req in self.requests.running_reqs():
            if req.pending_len > 1:
                inflight.add(req)
        return inflight


class _InflightPrefixes:
    """Token sequences being prefilled now; a candidate sharing >= min_tokens beyond its
    cached prefix with one of them should wait until that part is cached."""

    def __init__(self, min_tokens: int) -> None:
        self.min_tokens = min_tokens
        self._tree = RadixCache(page_size=1)

    def add(self, req: Req) -> None:
        ids = req.prefix_key(req.seq_len)
        self._tree.insert(ids, np.zeros(len(ids), dtype=np.int32))

    def should_wait(self, req: Req, cached: int) -> bool:
        shared = self._tree.cached_prefix_len(req.prefix_key(req.seq_len - 1))
        return shared - cached >= self.min_tokens
