"""A step's results, recorded (Scheduler.process_results / process_launched / resolve_tokens):
computed KV counted (minus rejected drafts and rewritten tokens), requests finished,
finished prefill chunks put in the prefix cache for reuse by others. The tokens themselves
are already in the requests: their DecodeStates appended them (ReqOutputs). Overlap
scheduling's placeholders: docs/design/engine-step.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lmprog.core.protocol import FinishReason

from ..cache.manager import CacheManager
from ..draft_tree import path_moves, walk
from ..request import Req, ReqStatus
from .batch import ScheduledBatch, ScheduledEntry


class ResultRecorder:
    """Applies a step's outcome to its requests. finish: Scheduler.finish (releases the KV,
    marks the request FINISHED)."""

    def __init__(self, cache: CacheManager, finish: Callable[[Req, FinishReason], bool]) -> None:
        self.cache = cache
        self.finish = finish
        # KV copies (src slot, dst slot) that token trees' accepted paths need before the
        # next forward (Scheduler.take_kv_moves)
        self.kv_moves: list[tuple[int, int]] = []

    def record(
        self, batch: ScheduledBatch, finish_reasons: Sequence[FinishReason | None] | None = None
    ) -> list[Req]:
        """Record a step whose tokens its requests already hold; return those that finished.

        The decoding side appended each sampling entry's tokens to `req.token_ids` (for a
        verify entry the accepted drafts and one more; a jump-forward may have rewritten the
        tail, marked by `req.rewritten_from`). finish_reasons[i]: its verdict for entry i
        (stop token or string, length, error, ...) or None. A request at its length cap
        finishes with "length" if no reason came. Entries whose request no longer runs
        (aborted mid-step) are skipped. Finished requests' KV goes to the prefix cache;
        finished prefill chunks are inserted into it too, for reuse by others.
        """
        reasons = self._reasons(batch, finish_reasons)
        finished = []
        for entry, reason in zip(batch.entries, reasons):
            req = self._advance(entry)
            if req is None:
                continue
            if reason is None and self._capped(req, entry):
                reason = "length"
            if reason is not None:
                self.finish(req, reason)
                finished.append(req)
            elif entry.num_new > 1 and not entry.draft_ids:
                self.cache.cache_progress(req)
        return finished

    def launched(self, batch: ScheduledBatch, placeholders: Sequence[Sequence[int]]) -> list[Req]:
        """Overlap scheduling: record a step launched with its tokens still on the device.
        placeholders[i]: the one placeholder of sampling entry i (plain sampled tokens only:
        no drafts), appended so the next step can feed it. Only requests that can take no
        token after it (their length cap) finish now, and prefill-only requests whose last
        chunk ran; they are returned. The others finish in `resolve`."""
        if len(placeholders) != len(batch.entries):
            raise ValueError(
                f"need one placeholder tuple per batch entry ({len(batch.entries)}), "
                f"got {len(placeholders)}"
            )
        assert not any(e.draft_ids for e in batch.entries), "placeholders are plain tokens"
        finished = []
        for entry, tokens in zip(batch.entries, placeholders):
            if entry.sample and tokens and self._running(entry):
                entry.req.token_ids.append(int(tokens[0]))
            req = self._advance(entry)
            if req is None:
                continue
            if self._capped(req, entry):
                self.finish(req, "length")
                finished.append(req)
            elif entry.num_new > 1:
                self.cache.cache_progress(req)
        return finished

    def resolve(
        self, batch: ScheduledBatch, finish_reasons: Sequence[FinishReason | None]
    ) -> list[Req]:
        """Finish the requests of a step recorded with `launched`, once the decoding side has
        written their tokens over the placeholders; return those that finished. Finished
        requests are skipped (those at their length cap finished when launched). Safe while
        the next step is in flight (docs/design/engine-step.md)."""
        finished = []
        for entry, reason in zip(batch.entries, self._reasons(batch, finish_reasons)):
            req = entry.req
            if not entry.sample or req.status is ReqStatus.FINISHED or reason is None:
                continue
            self.finish(req, reason)
            finished.append(req)
        return finished

    @staticmethod
    def _reasons(
        batch: ScheduledBatch, reasons: Sequence[FinishReason | None] | None
    ) -> Sequence[FinishReason | None]:
        if reasons is None:
            return [None] * len(batch.entries)
        if len(reasons) != len(batch.entries):
            raise ValueError(
                f"need one finish reason per batch entry ({len(batch.entries)}), got {len(reasons)}"
            )
        return reasons

    @staticmethod
    def _running(entry: ScheduledEntry) -> bool:
        req = entry.req
        return req.status is ReqStatus.RUNNING and req.row == entry.row

    @staticmethod
    def _capped(req: Req, entry: ScheduledEntry) -> bool:
        """At its length cap with nothing left to wait for: its last token was sampled now,
        or (a prefill-only request, e.g. max_tokens=0) every token is computed."""
        return len(req.token_ids) >= req.stop_len and (
            entry.sample or req.num_computed == len(req.token_ids)
        )

    def _advance(self, entry: ScheduledEntry) -> Req | None:
        """Move num_computed past the KV this step wrote that stays valid: the fed tokens,
        minus rejected drafts and rewritten tokens. None when the request no longer runs."""
        req = entry.req
        req.extend_len = 0
        rewritten, req.rewritten_from = req.rewritten_from, None
        if not self._running(entry):
            return None
        if entry.num_new == 1 and rewritten is None and len(req.token_ids) == entry.end + 1:
            req.num_computed = entry.end  # a plain decode (the common case)
            if req.draft_ids:
                req.draft_ids, req.draft_parents = [], None
            return req
        real_end = entry.end - len(entry.draft_ids)  # the fed tokens that are req's own
        path = walk(entry.draft_ids, entry.draft_parents, req.token_ids[real_end:])
        valid = real_end + len(path)  # ... and the accepted drafts
        computed = min(valid, len(req.token_ids) - 1) if entry.sample else entry.end
        if rewritten is not None:
            computed = min(computed, rewritten)
        if entry.draft_parents is not None and entry.sample:
            # a token tree: the accepted path's KV was computed at its nodes' columns
            row = self.cache.req_table.table[req.row]
            for node, j in path_moves(path):
                if real_end + j < computed:
                    self.kv_moves.append((int(row[real_end + node]), int(row[real_end + j])))
        if self.cache.round_up(computed) < req.num_allocated:
            self.cache.trim(req, computed)
        else:
            req.num_computed = computed
        req.draft_ids, req.draft_parents = [], None
        return req
