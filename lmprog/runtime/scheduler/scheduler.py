"""Scheduler: continuous batching with a per-step token budget (hybrid prefill/decode).

Composed of managers that each own one resource — CacheManager (KV slots, prefix cache,
req_to_token rows), RequestTable (waiting/running), the per-step StepBudget — and of
separate policies: DecodePolicy, PrefillPolicy, RetractPolicy. One step:

    1. decodes: every running request with one pending token feeds it (+ verify drafts);
       if their slots are not obtainable (free + evictable), retract the newest running
       requests until they are
    2. prefill chunks of running requests with several pending tokens, oldest first (a
       jump-forward's tail fed whole: + verify drafts)
    3. admissions from the waiting queue (LPM / FCFS), chunked to fill the budget;
       skipped in a step that had to retract
    (with config.hybrid_batching False, prefill-first: a step with prefill work (2, 3) runs
    only that)
    4. slots are allocated (evicting cached prefixes as needed) and written to req_to_token

The engine drives it from one thread:

    batch = scheduler.schedule()              # may be empty (nothing to do)
    ... run the model on batch, sample for entries with e.sample ...
    finished = scheduler.process_results(batch, next_tokens, finish_reasons)

Between those two calls the engine may call abort/finish (process_results then skips the
request); it must not call schedule, retract or replace_tokens.

Overlap scheduling (the host prepares step N+1 while the device runs step N) defers the
tokens: process_results(batch, placeholders, unresolved=True) right after step N is
launched records one placeholder per sampling entry (see request.py); step N+1 is
scheduled, feeding them; after N+1 is launched the host reads N's tokens and calls
resolve_tokens(batch_N, tokens, finish_reasons), which writes them in place and finishes
requests. A request finished there was also fed in step N+1: that work is dropped (its
KV slots are freed, nothing of it reaches the prefix cache). A request whose placeholder
is its last token (its length cap) finishes at once, before step N+1 is scheduled: its
row and KV are not held a step longer; the engine gives it its token when N settles.

Attention sinks (AttentionSinkConfig; see sinks.py): each step first evicts, from every
running request whose next chunk would not fit its window, a chunk of tokens after its
sinks (CacheManager.evict_middle frees or copies the slots, SinkWindow.delete drops the
tokens); the batch carries the KV moves (`kv_shift`) the engine has done before its forward.
Requests are then never cut at the context length: positions stay below sinks + window.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Sequence

import numpy as np

from lmprog.core.errors import ContextLengthError
from lmprog.core.protocol import FinishReason

from ..cache.allocator import SLOT_DTYPE
from ..cache.base import require
from ..cache.manager import CacheManager
from ..config import AttentionSinkConfig, CacheConfig, SchedulerConfig
from ..request import Req, ReqStatus
from .batch import ScheduledBatch, ScheduledEntry
from .budget import NewTokenRatio, StepBudget
from .decode import DecodePolicy
from .plan import StepPlan
from .prefill import PrefillPolicy
from .requests import RequestTable
from .retract import RetractPolicy
from .sinks import KVShift, SinkWindow
from .stats import SchedulerStats

_NO_SLOTS = np.empty(0, dtype=SLOT_DTYPE)
_NO_POSITIONS = np.empty(0, dtype=np.int64)


class Scheduler:
    """See the module docstring. num_slots: usable KV slots (slot 0, the dummy, excluded);
    max_context_len: the model's context length; sinks: attention sinks (None: off)."""

    def __init__(
        self,
        num_slots: int,
        max_context_len: int,
        config: SchedulerConfig | None = None,
        cache_config: CacheConfig | None = None,
        sinks: AttentionSinkConfig | None = None,
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
        self.decode_policy = DecodePolicy()
        self.prefill_policy = PrefillPolicy(self.config, self.cache, self.requests, self.ratio)
        self.retract_policy = RetractPolicy()
        self.num_retractions = 0
        self.evicted_tokens = 0  # attention sinks: tokens evicted from running requests

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
        running = self.requests.running.values()
        if not self.config.hybrid_batching and (
            self.requests.waiting or any(r.pending_len > 1 for r in running)
        ):
            return []
        budget = self.config.max_num_batched_tokens
        return [
            r
            for r in running
            if r.num_computed == len(r.token_ids) - 1
            or (r.num_computed >= r.prompt_end and len(r.token_ids) - r.num_computed < budget)
        ]

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
        if self.sinks is None:
            req.max_seq_len = min(self.max_context_len, self.cache.capacity)
            req.stop_len = min(req.stop_len, req.max_seq_len)
        elif pls is not None and req.prompt_len + 1 > self.sinks.limit:
            raise ContextLengthError(
                f"prompt logprobs need the whole prompt in the attention-sink window: a prompt "
                f"of {req.prompt_len} tokens plus 1 exceeds its {self.sinks.limit} tokens"
            )
        else:
            req.max_seq_len = sys.maxsize  # evictions keep the KV within the window
        self.requests.add(req)
        return req

    def check_fits(self, prompt_len: int) -> None:
        """ContextLengthError unless a prompt of prompt_len tokens plus one generated token
        fits the context length and the whole KV pool (with attention sinks any prompt fits:
        it is fed in chunks, evicting as it goes). Reads only constants: any thread."""
        if self.sinks is not None:
            return
        need = prompt_len + 1
        if need > self.max_context_len:
            raise ContextLengthError(
                f"prompt of {prompt_len} tokens plus 1 generated token exceeds the "
                f"model's context length of {self.max_context_len} tokens; shorten the prompt"
            )
        if self.cache.round_up(need) > self.cache.capacity:
            raise ContextLengthError(
                f"prompt of {prompt_len} tokens plus 1 generated token does not fit the "
                f"KV pool of {self.cache.capacity} tokens; shorten the prompt or raise the KV "
                "memory budget (max_total_tokens)"
            )

    # -- one step --------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """Choose and allocate the next step's work (see module docstring).

        Mutates: retracted requests (KV released, re-queued), admitted requests (status
        RUNNING, row, locked prefix), every scheduled request's num_allocated, its row of
        req_to_token and extend_len. Never fails for lack of memory: it retracts instead.
        """
        self.ratio.step()
        running = self.requests.running
        retracted: list[Req] = []
        shift = self._evict_for_windows(retracted) if self.sinks is not None else None
        budget = StepBudget(
            self.config.max_num_batched_tokens, self.config.max_running_requests - len(running)
        )
        plan = StepPlan(self.cache)
        decoders, extenders = self.decode_policy.split(running.values())
        if not self.config.hybrid_batching and self._plan_prefill_only(extenders, plan, budget):
            return self._build(plan, retracted, shift)
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
        return self._build(plan, retracted, shift)

    def _plan_prefill_only(self, extenders: list[Req], plan: StepPlan, budget: StepBudget) -> bool:
        """Prefill-first (config.hybrid_batching False): plan pending chunks and admissions
        without decodes; True when that found work (else the step decodes)."""
        self.prefill_policy.continue_running(extenders, plan, budget)
        self.prefill_policy.admit_waiting(plan, budget)
        return bool(plan)

    def process_results(
        self,
        batch: ScheduledBatch,
        next_tokens: Sequence[Sequence[int]],
        finish_reasons: Sequence[FinishReason | None] | None = None,
        *,
        unresolved: bool = False,
    ) -> list[Req]:
        """Record a step's outcome; return the requests that finished.

        next_tokens[i]: the tokens to append for entry i — empty unless entry.sample; for a
        verify entry the accepted drafts followed by one bonus token; tokens forced by
        jump-forward may follow the sampled one. Tokens past the request's max_tokens are
        dropped. finish_reasons[i]: the engine's verdict (stop token/string, error, ...)
        after appending next_tokens[i], or None. Requests reaching max_tokens or their
        length cap finish with "length". Entries whose request is no longer running
        (aborted mid-step) are skipped. Finished requests' KV goes to the prefix cache;
        finished prefill chunks are inserted into it too, for reuse by others.

        unresolved: next_tokens are placeholders, one per sampling entry, of tokens still
        on the device (overlap scheduling; no drafts, no finish reasons): only requests
        that reached their length cap finish now (the placeholder stays out of the prefix
        cache; resolve_tokens skips them), and so do prefill-only requests whose last chunk
        ran (they wait for no token); the others once their tokens are known.
        """
        entries = batch.entries
        if len(next_tokens) != len(entries) or (
            finish_reasons is not None and len(finish_reasons) != len(entries)
        ):
            raise ValueError(
                f"need one next_tokens (and finish reason) entry per batch entry "
                f"({len(entries)}), got {len(next_tokens)}"
            )
        finished = []
        running = ReqStatus.RUNNING
        reasons = finish_reasons if finish_reasons is not None else [None] * len(entries)
        assert not unresolved or (
            finish_reasons is None and not any(e.draft_ids for e in entries)
        ), "placeholders stand for plain sampled tokens only"
        for entry, tokens, reason in zip(entries, next_tokens, reasons):
            req = entry.req
            req.extend_len = 0
            if req.status is not running or req.row != entry.row:
                continue
            if entry.num_new == 1 and entry.sample and len(tokens) == 1:  # plain decode
                req.token_ids.append(int(tokens[0]))
                req.num_computed += 1
                if req.draft_ids:
                    req.draft_ids = []
                sampled = True
            else:
                sampled = self._advance(req, entry, tokens, reason is not None)
            # at its cap: the last token was sampled now, or (a prefill-only request, e.g.
            # max_tokens=0) every token is computed; neither waits for a placeholder
            capped = len(req.token_ids) >= req.stop_len and (
                sampled or req.num_computed == len(req.token_ids)
            )
            if unresolved and not capped:
                if entry.num_new > 1:
                    self.cache.cache_progress(req)
                continue
            if reason is None and capped:
                reason = "length"
            if reason is not None:
                self.finish(req, reason)
                finished.append(req)
            elif entry.num_new > 1 and not entry.draft_ids:
                self.cache.cache_progress(req)
        return finished

    def resolve_tokens(
        self,
        batch: ScheduledBatch,
        tokens: Sequence[Sequence[int]],
        finish_reasons: Sequence[FinishReason | None],
    ) -> list[Req]:
        """Write the real tokens of a step recorded with process_results(unresolved=True)
        over its placeholders and finish requests; return those that finished.

        tokens[i]: the one token of sampling entry i, or () when its draw failed (its finish
        reason says so); finish_reasons[i]: the engine's verdict after it. Finished
        requests are skipped (those at their length cap finished when the placeholder was
        recorded); a retracted one gets its token too (it resumes with it). Safe while the
        next step is in flight (see the module docstring)."""
        if len(tokens) != len(batch.entries) or len(finish_reasons) != len(batch.entries):
            raise ValueError(
                f"need one token tuple and finish reason per batch entry "
                f"({len(batch.entries)}), got {len(tokens)} and "
                f"{len(finish_reasons)}"
            )
        finished = []
        for entry, toks, reason in zip(batch.entries, tokens, finish_reasons):
            req = entry.req
            if not entry.sample or req.status is ReqStatus.FINISHED:
                continue
            at = entry.end - (req.num_evicted - entry.evicted)  # tokens evicted since
            assert req.token_ids[at] < 0, f"{req}: no placeholder at {at}"
            assert at + 1 < req.stop_len, f"{req}: at its length cap, yet unfinished"
            if toks:
                req.token_ids[at] = int(toks[0])
            if reason is not None:
                self.finish(req, reason)
                finished.append(req)
        return finished

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
        req.draft_ids, req.extend_len = [], 0
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
        if req.status is not ReqStatus.RUNNING:
            raise ValueError(
                f"only running requests can be retracted, {req.rid!r} is {req.status.value}"
            )
        self.cache.release(req, cache=True)
        self.requests.requeue(req)
        req.draft_ids = []
        req.num_retractions += 1
        self.num_retractions += 1
        self.ratio.on_retract()

    def replace_tokens(self, req: Req, num_keep: int, new_tokens: Sequence[int]) -> None:
        """Keep req's first num_keep tokens (>= prompt_len) and append new_tokens, e.g. after
        re-tokenizing a jump-forward. KV of dropped tokens is forgotten (recomputed as
        needed). Not mid-step."""
        if req.status is ReqStatus.FINISHED:
            raise ValueError(f"request {req.rid!r} has finished")
        if not req.prompt_end <= num_keep <= req.seq_len:
            raise ValueError(
                f"num_keep must be in [{req.prompt_end}, {req.seq_len}], got {num_keep}"
            )
        if num_keep + len(new_tokens) > req.max_seq_len:
            raise ValueError(
                f"{num_keep + len(new_tokens)} tokens exceed the request's length "
                f"cap of {req.max_seq_len}"
            )
        del req.token_ids[num_keep:]
        req.token_ids.extend(int(t) for t in new_tokens)
        if req.status is ReqStatus.RUNNING:
            keep = min(req.num_computed, num_keep, req.seq_len - 1)
            if keep < req.num_computed:
                self.cache.trim(req, keep)

    def flush_cache(self) -> bool:
        """Empty the prefix cache; only when nothing runs (returns False otherwise)."""
        if self.requests.num_running:
            return False
        self.cache.reset()
        return True

    def reset(self) -> list[Req]:
        """Start over after an internal error, when the bookkeeping cannot be trusted: every
        KV slot is free again and the prefix cache empty. Requests that never started
        (WAITING) keep their place in the queue; every other unfinished request (running,
        or retracted with tokens that may include placeholders of a lost step) is dropped
        and returned, FINISHED with reason "error" and holding nothing. Not mid-step."""
        reqs = self.requests.clear()
        self.cache.clear(reqs)
        dropped = []
        for req in reqs:
            if req.status is ReqStatus.WAITING:
                self.requests.add(req)
                continue
            req.status, req.finish_reason = ReqStatus.FINISHED, "error"
            req.draft_ids, req.extend_len = [], 0
            dropped.append(req)
        return dropped

    def check_integrity(self) -> None:
        """Raise IntegrityError unless requests, rows, locks and every KV slot are
        consistent (see CacheManager.check_integrity). O(pool size); not mid-step."""
        running = list(self.requests.running_reqs())
        for req in running:
            require(req.status is ReqStatus.RUNNING, f"{req} is in the running set")
            require(req.num_computed < req.seq_len, f"{req}: no pending token")
        for req in self.requests.waiting:
            require(
                req.status in (ReqStatus.WAITING, ReqStatus.RETRACTED),
                f"{req} is in the waiting queue",
            )
            require(
                req.row is None and req.last_node is None and not req.num_allocated,
                f"{req} waits but holds KV",
            )
        require(len(running) <= self.config.max_running_requests, "too many running requests")
        self.cache.check_integrity(running)

    # -- internals -------------------------------------------------------------------------
    def _retract_newest(self, retracted: list[Req]) -> None:
        victim = self.retract_policy.pick(self.requests.running_reqs())
        assert victim is not None
        self.retract(victim)
        retracted.append(victim)

    def _advance(
        self, req: Req, entry: ScheduledEntry, tokens: Sequence[int], has_reason: bool
    ) -> bool:
        """Append tokens and move num_computed past the KV this step wrote (minus rejected
        drafts). Returns whether tokens were appended."""
        end = entry.end
        if not entry.sample or len(tokens) == 0:
            if len(tokens):
                raise ValueError(f"request {req.rid!r} does not sample this step but got tokens")
            if entry.sample and not has_reason:
                raise ValueError(
                    f"request {req.rid!r} samples this step: pass its next token or a finish reason"
                )
            req.num_computed = end - len(entry.draft_ids)
            return False
        tokens = [int(t) for t in tokens[: req.remaining_tokens]]
        req.token_ids.extend(tokens)
        valid = end - len(entry.draft_ids)
        for draft, token in zip(entry.draft_ids, tokens):
            if draft != token:
                break
            valid += 1
        computed = min(valid, len(req.token_ids) - 1)
        if self.cache.round_up(computed) < req.num_allocated:
            self.cache.trim(req, computed)
        else:
            req.num_computed = computed
        req.draft_ids = []
        return True

    def _evict_for_windows(self, retracted: list[Req]) -> KVShift | None:
        """Attention sinks: make room in the windows of running requests (SinkWindow.evict),
        retracting the newest requests if a copy of a cached prefix finds no slots."""
        assert self.sinks is not None
        shift, evicted = self.sinks.evict(
            self.requests, self.cache, lambda: self._retract_newest(retracted)
        )
        self.evicted_tokens += evicted
        return shift

    def _build(
        self, plan: StepPlan, retracted: list[Req], shift: KVShift | None = None
    ) -> ScheduledBatch:
        items = plan.items
        if not items:
            return ScheduledBatch((), _NO_SLOTS, _NO_POSITIONS, tuple(retracted), shift)
        reqs, counts, _ = zip(*items)
        out_slots, positions = self.cache.extend(reqs, counts)
        entries, offset = [], 0
        new_entry = ScheduledEntry._make  # no argument parsing in this per-request loop
        for req, n, drafts in items:
            start = req.num_computed
            end = start + n
            real_end = end - len(drafts)
            seq_len = len(req.token_ids)
            sample = real_end == seq_len and seq_len < req.stop_len
            logits_from = real_end - 1 if sample else None
            if req.prompt_logprob_start is not None and req.prompt_logprob_start < end:
                first = max(start, req.prompt_logprob_start)
                logits_from = first if logits_from is None else min(logits_from, first)
            entries.append(
                new_entry(
                    (
                        req,
                        req.row,
                        start,
                        n,
                        offset,
                        logits_from,
                        sample,
                        req.row_dirty,
                        drafts,
                        req.num_evicted,
                    )
                )
            )
            req.row_dirty = False
            req.extend_len = n
            offset += n
        return ScheduledBatch(tuple(entries), out_slots, positions, tuple(retracted), shift)
