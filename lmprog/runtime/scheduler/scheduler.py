"""Scheduler: continuous batching with a per-step token budget (hybrid prefill/decode).

    batch = scheduler.schedule()              # may be empty (nothing to do)
    ... run the model on batch; each sampling entry's DecodeState appends its tokens
        to the request (ReqOutputs: Req.token_ids is the one copy) ...
    finished = scheduler.process_results(batch, finish_reasons)

A step takes the decodes (retracting the newest requests if their slots are not
obtainable), then prefill chunks and admissions up to the budget. Between the two calls
the engine may abort or finish requests, never schedule. Overlap scheduling
(process_launched, resolve_tokens), attention sinks and host-tier staging:
docs/design/scheduling.md.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from lmprog.core.protocol import FinishReason

from ..cache.manager import CacheManager
from ..config import AttentionSinkConfig, CacheConfig, SchedulerConfig
from ..request import Req, ReqStatus
from .batch import ScheduledBatch
from .budget import NewTokenRatio, StepBudget
from .decode import DecodePolicy
from .lengths import LengthLimits
from .plan import StepPlan
from .prefill import PrefillPolicy
from .requests import RequestTable
from .results import ResultRecorder
from .retract import RetractPolicy
from .sinks import KVShift, SinkWindow
from .stats import SchedulerStats


class Scheduler:
    """See docs/design/scheduling.md. num_slots: usable KV slots (slot 0, the dummy, excluded);
    max_context_len: the model's context length; sinks: attention sinks (None: off);
    max_loras: LoRA adapters that may run at once (the adapter pool's slots; a waiting
    request of another adapter is passed over until one of them has no running request);
    None: no limit (no adapters)."""

    def __init__(
        self,
        num_slots: int,
        max_context_len: int,
        config: SchedulerConfig | None = None,
        cache_config: CacheConfig | None = None,
        sinks: AttentionSinkConfig | None = None,
        max_loras: int | None = None,
    ) -> None:
        self.config = config or SchedulerConfig()
        self.cache_config = cache_config or CacheConfig()
        self.max_context_len = max_context_len
        page = self.cache_config.page_size
        usable = num_slots - num_slots % page
        self.sinks = (
            None if sinks is None else SinkWindow(sinks, min(max_context_len, usable), page)
        )
        self.cache = CacheManager(
            num_slots,
            self.config.max_running_requests,
            max_context_len,
            self.cache_config,
            kv_limit=None if self.sinks is None else self.sinks.limit,
        )
        self.requests = RequestTable()
        self.ratio = NewTokenRatio(
            self.config.init_new_token_ratio,
            self.config.min_new_token_ratio,
            self.config.new_token_ratio_decay,
        )
        self.limits = LengthLimits(max_context_len, self.cache, self.sinks)
        self.decode_policy = DecodePolicy()
        self.prefill_policy = PrefillPolicy(
            self.config, self.cache, self.requests, self.ratio, max_loras=max_loras
        )
        self.retract_policy = RetractPolicy(self.cache, self.requests, self.ratio)
        self.results = ResultRecorder(self.cache, self.finish)

    # -- queries (always safe) -------------------------------------------------------------
    @property
    def req_to_token(self) -> np.ndarray:
        """int32 [max_running_requests, width >= max_context_len]; see ReqToTokenTable."""
        return self.cache.req_to_token

    @property
    def has_work(self) -> bool:
        return len(self.requests) > 0

    @property
    def num_running(self) -> int:
        return self.requests.num_running

    @property
    def num_waiting(self) -> int:
        return self.requests.num_waiting

    @property
    def num_retractions(self) -> int:
        return self.retract_policy.num_retractions

    @property
    def evicted_tokens(self) -> int:
        """Attention sinks: tokens evicted from running requests (0 without sinks)."""
        return 0 if self.sinks is None else self.sinks.evicted_tokens

    def get(self, rid: Hashable) -> Req | None:
        """The unfinished request with this rid, or None."""
        return self.requests.get(rid)

    def decoding(self) -> list[Req]:
        """Running requests that may carry `draft_ids` (verify tokens) into the next
        schedule(): those whose pending tokens were all generated — the last sampled one,
        and after a jump-forward the tokens it forced (a tail of fewer tokens than the step
        budget; it is fed before the drafts, in the same verify entry: see batch.py). Never
        a prompt chunk. Empty in prefill-first mode (config.hybrid_batching False) while
        anything has several pending tokens: that step likely prefills only."""
        return self.decode_policy.verifiable(self.requests, self.config)

    def stats(self) -> SchedulerStats:
        cache = self.cache
        return SchedulerStats(
            self.num_running,
            self.num_waiting,
            self.num_retractions,
            self.prefill_policy.admitted_prompt_tokens,
            self.prefill_policy.admitted_cached_tokens,
            cache.capacity - cache.allocator.num_free,
            cache.prefix_cache.evictable_size,
            cache.capacity,
            self.evicted_tokens,
            cache.tier_stats(),
            self.prefill_policy.admitted_host_tokens,
            self.prefill_policy.admitted_disk_tokens,
        )

    # -- submission ------------------------------------------------------------------------
    def submit(self, req: Req) -> Req:
        """Queue a new request (status WAITING). Raises ContextLengthError if its prompt plus
        one generated token exceeds the context length or the whole KV pool, ValueError if
        the rid is in use or req was submitted before. Mutates nothing on error."""
        if req.status is not ReqStatus.WAITING or req.arrival != -1:
            raise ValueError(f"request {req.rid!r} was submitted before; make a new Req")
        if req.rid in self.requests:
            raise ValueError(f"request id {req.rid!r} is already in use by an unfinished request")
        self.check_fits(req.prompt_len)
        pls = req.prompt_logprob_start
        if pls is not None and not 0 <= pls < req.prompt_len:
            raise ValueError(f"prompt_logprob_start must be in [0, {req.prompt_len}), got {pls}")
        self.limits.cap(req)
        self.requests.add(req)
        return req

    def check_fits(self, prompt_len: int) -> None:
        """ContextLengthError unless a prompt of prompt_len tokens plus one generated token
        fits the context length and the whole KV pool (with attention sinks any prompt fits:
        it is fed in chunks, evicting as it goes). Reads only constants: any thread."""
        self.limits.check_fits(prompt_len)

    # -- one step --------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """Choose and allocate the next step's work (docs/design/scheduling.md).

        Mutates: retracted requests (KV released, re-queued), admitted requests (status
        RUNNING, row, locked prefix), every scheduled request's num_allocated, its row of
        req_to_token and extend_len. Never fails for lack of memory: it retracts instead.
        """
        self.ratio.step()
        running = self.requests.running
        retracted: list[Req] = []
        shift = self._evict_for_windows(retracted)
        tokens, rows = self.config.max_num_batched_tokens, self.config.max_running_requests
        budget = StepBudget(tokens, rows - len(running), image_room=tokens - rows)
        plan = StepPlan(self.cache)
        decoders, extenders = self.decode_policy.split(running.values())
        if not self.config.hybrid_batching and self._plan_prefill_only(extenders, plan, budget):
            return plan.to_batch(retracted, shift)
        page = self.cache.page_size
        while self.decode_policy.slots_needed(decoders, page) > self.cache.available_tokens:
            self._retract_newest(retracted)
            decoders, extenders = self.decode_policy.split(running.values())
        self.decode_policy.plan(decoders, plan, budget, page)
        self.prefill_policy.continue_running(extenders, plan, budget)
        while not plan and len(running) > 1:  # every running prefill is stuck for memory
            self._retract_newest(retracted)
            _, extenders = self.decode_policy.split(running.values())
            self.prefill_policy.continue_running(extenders, plan, budget)
        assert plan or not running, "a lone running request must always fit the pool"
        if not retracted:
            self.prefill_policy.admit_waiting(plan, budget)
        batch = plan.to_batch(retracted, shift)
        if not retracted:  # host-tier prefixes of the queue's head, loaded ahead
            self.prefill_policy.stage_waiting()
        return batch

    def _plan_prefill_only(self, extenders: list[Req], plan: StepPlan, budget: StepBudget) -> bool:
        """Prefill-first (config.hybrid_batching False): plan pending chunks and admissions
        without decodes; True when that found work (else the step decodes)."""
        self.prefill_policy.continue_running(extenders, plan, budget)
        self.prefill_policy.admit_waiting(plan, budget)
        return bool(plan)

    def process_results(
        self, batch: ScheduledBatch, finish_reasons: Sequence[FinishReason | None] | None = None
    ) -> list[Req]:
        """Record a step whose tokens its requests already hold (their decoding side
        appended them); return the requests that finished. In full: ResultRecorder.record."""
        return self.results.record(batch, finish_reasons)

    def process_launched(
        self, batch: ScheduledBatch, placeholders: Sequence[Sequence[int]]
    ) -> list[Req]:
        """Overlap scheduling: record a step whose tokens are still on the device, feeding
        placeholders; return the requests that ended at their length cap. In full:
        ResultRecorder.launched."""
        return self.results.launched(batch, placeholders)

    def resolve_tokens(
        self, batch: ScheduledBatch, finish_reasons: Sequence[FinishReason | None]
    ) -> list[Req]:
        """Finish the requests of a step recorded with process_launched once their tokens
        replaced the placeholders; return those that finished. Safe while the next step is
        in flight. In full: ResultRecorder.resolve."""
        return self.results.resolve(batch, finish_reasons)

    def take_kv_moves(self) -> KVShift | None:
        """The KV copies the recorded steps' token trees need (their accepted paths moved to
        the columns a chain would have used), to do on the device before anything else
        reads or writes the pool; None when there are none. Each is handed out once."""
        moves, self.results.kv_moves = self.results.kv_moves, []
        if not moves:
            return None
        src, dst = np.array(moves, dtype=np.int64).T
        return KVShift(src, dst, np.zeros_like(src))

    # -- request control -------------------------------------------------------------------
    def finish(self, req: Req, reason: FinishReason, cache: bool = True) -> bool:
        """End req (waiting or running): release its KV — computed tokens go to the prefix
        cache when `cache` — and mark it FINISHED. Returns False (a no-op) if it already
        finished. Safe mid-step."""
        if req.status is ReqStatus.FINISHED:
            return False
        if self.requests.get(req.rid) is not req:
            raise ValueError(f"request {req.rid!r} was not submitted to this scheduler")
        self.cache.release(req, cache=cache)
        self.requests.remove(req)
        req.status, req.finish_reason = ReqStatus.FINISHED, reason
        req.draft_ids, req.draft_parents, req.extend_len = [], None, 0
        return True

    def abort(self, rid: Hashable) -> Req | None:
        """Finish the unfinished request rid with reason "abort"; None if there is none.
        Safe mid-step and at any time."""
        req = self.requests.get(rid)
        if req is not None:
            self.finish(req, "abort")
        return req

    def retract(self, req: Req) -> None:
        """Take a running request's KV back (computed tokens go to the prefix cache) and
        re-queue it at its arrival position; its tokens are kept and it resumes later by
        prefilling what is no longer cached. Not mid-step."""
        self.retract_policy.retract(req)

    def flush_cache(self) -> bool:
        """Empty the prefix cache; only when nothing runs (returns False otherwise)."""
        if self.requests.num_running:
            return False
        self.cache.reset()
        return True

    def reset(self) -> list[Req]:
        """Start over after an internal error, when the bookkeeping cannot be trusted: every
        KV slot is free again and the prefix cache empty. Requests that hold no KV and know
        every token keep their place in the queue: those that never started (WAITING) and
        those retracted before (RETRACTED, without a placeholder of a lost step); every
        other unfinished request (running: the failing step's, or a retracted one waiting
        for a lost step's token) is dropped and returned, FINISHED with reason "error" and
        holding nothing. Not mid-step."""
        reqs = self.requests.clear()
        self.cache.clear(reqs)
        self.results.kv_moves = []  # a token tree's copies into slots now free
        dropped = []
        for req in reqs:
            status = req.status
            if status is ReqStatus.WAITING or (
                status is ReqStatus.RETRACTED and not req.num_placeholders
            ):
                self.requests.add(req)  # in their order (clear lists the waiting first)
                req.status = status
                continue
            req.status, req.finish_reason = ReqStatus.FINISHED, "error"
            req.draft_ids, req.draft_parents, req.extend_len = [], None, 0
            dropped.append(req)
        return dropped

    def check_integrity(self) -> None:
        """Raise IntegrityError unless requests, rows, locks and every KV slot are
        consistent (see CacheManager.check_integrity). O(pool size); not mid-step."""
        running = self.requests.check_integrity(self.config.max_running_requests)
        self.cache.check_integrity(running)

    # -- internals -------------------------------------------------------------------------
    def _retract_newest(self, retracted: list[Req]) -> None:
        retracted.append(self.retract_policy.retract_newest())

    def _evict_for_windows(self, retracted: list[Req]) -> KVShift | None:
        """Attention sinks: make room in the windows of running requests (SinkWindow.evict),
        retracting the newest requests if a copy of a cached prefix finds no slots."""
        if self.sinks is None:
            return None
        return self.sinks.evict(self.requests, self.cache, lambda: self._retract_newest(retracted))
