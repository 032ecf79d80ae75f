"""A step's results, recorded (Scheduler.process_results / resolve_tokens): tokens appended,
accepted drafts and computed KV counted, requests finished, finished prefill chunks put in
the prefix cache for reuse by others.

Overlap scheduling (the host prepares step N+1 while the device runs step N) defers the
tokens: record(batch, placeholders, unresolved=True) right after step N is launched
appends one placeholder per sampling entry (see request.py); step N+1 is scheduled,
feeding them; after N+1 is launched the host reads N's tokens and calls resolve(batch_N,
tokens, finish_reasons), which writes them in place and finishes requests. A request
finished there was also fed in step N+1: that work is dropped (its KV slots are freed,
nothing of it reaches the prefix cache). A request whose placeholder is its last token (its
length cap) finishes at once, before step N+1 is scheduled: its row and KV are not held a
step longer; the engine gives it its token when N settles.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lmprog.core.protocol import FinishReason

from ..cache.manager import CacheManager
from ..request import Req, ReqStatus
from .batch import ScheduledBatch, ScheduledEntry


class ResultRecorder:
    """Applies a step's outcome to its requests. finish: Scheduler.finish (releases the KV,
    marks the request FINISHED)."""

    def __init__(self, cache: CacheManager, finish: Callable[[Req, FinishReason], bool]) -> None:
        self.cache = cache
        self.finish = finish

    def record(
        self,
        batch: ScheduledBatch,
        next_tokens: Sequence[Sequence[int]],
        finish_reasons: Sequence[FinishReason | None] | None,
        unresolved: bool,
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
        cache; resolve skips them), and so do prefill-only requests whose last chunk
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

    def resolve(
        self,
        batch: ScheduledBatch,
        tokens: Sequence[Sequence[int]],
        finish_reasons: Sequence[FinishReason | None],
    ) -> list[Req]:
        """Write the real tokens of a step recorded with record(unresolved=True)
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
