"""Driving a Scheduler without an engine: these helpers play the decoding side, which in the
engine is each request's DecodeState writing through ReqOutputs (the one copy of its tokens)."""

from __future__ import annotations

from collections.abc import Sequence

from lmprog.runtime.request import Req, ReqOutputs, ReqStatus
from lmprog.runtime.scheduler import ScheduledBatch, Scheduler


def append_outputs(batch: ScheduledBatch, tokens: Sequence[Sequence[int]]) -> None:
    """Append entry i's tokens to its request (a placeholder is filled first), as far as
    its length cap allows; entries whose request no longer runs in that row get none."""
    assert len(tokens) == len(batch.entries), "one token tuple per entry"
    for e, toks in zip(batch.entries, tokens):
        req = e.req
        if req.status is ReqStatus.FINISHED or (req.row != e.row and req.row is not None):
            continue
        outputs = ReqOutputs(req)
        for t in toks:
            if not req.num_placeholders and req.remaining_tokens == 0:
                break
            outputs.append(int(t))


def process(
    s: Scheduler,
    batch: ScheduledBatch,
    tokens: Sequence[Sequence[int]],
    reasons: Sequence[str | None] | None = None,
) -> list[Req]:
    """A step's tokens appended, then its results recorded: the finished requests."""
    append_outputs(batch, tokens)
    return s.process_results(batch, reasons)


def resolve(
    s: Scheduler,
    batch: ScheduledBatch,
    tokens: Sequence[Sequence[int]],
    reasons: Sequence[str | None],
) -> list[Req]:
    """A launched step's real tokens written over its placeholders, then resolved."""
    append_outputs(batch, tokens)
    return s.resolve_tokens(batch, reasons)


def rewrite(req: Req, keep: int, new_tokens: Sequence[int]) -> None:
    """Keep req's first `keep` tokens and append new_tokens, as a jump-forward rewrites a
    tail (mid-step: the next process_results drops the KV of the rewritten tokens)."""
    outputs = ReqOutputs(req)
    outputs[keep - req.prompt_end + len(req.evicted_output_ids) :] = new_tokens
