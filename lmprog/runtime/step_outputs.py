"""StepOutputs: one forward pass's logits -> what process_results needs, per batch entry.

The logits rows come in entry order, `end - logits_from` rows per entry that wants logits:

    logits:  | entry a: prompt-logprob rows ... last row | entry b: last row | ...
                                                 ^ sampled from when entry.sample

Per entry: prompt logprobs are recorded first (positions p -> prompt token p + 1), then
every sampling entry's last row goes to the batch sampler, and each drawn token through its
request's DecodeState.accept. Anything that raises there fails that request alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .batch_sampler import BatchSampler
from .decode_state import DecodeState
from .request import Req
from .scheduler import ScheduledBatch, ScheduledEntry


@dataclass(frozen=True)
class StepResult:
    """tokens[i] / reasons[i]: what entry i appends and its finish reason (None: goes on);
    jumps: (request, JumpResult) to mirror with replace_tokens after process_results."""

    tokens: list[tuple[int, ...]]
    reasons: list[str | None]
    jumps: list[tuple[Req, Any]]

    @property
    def num_sampled(self) -> int:
        return sum(1 for t in self.tokens if t)


class StepOutputs:
    def __init__(self, sampler: BatchSampler) -> None:
        self.sampler = sampler

    def process(self, batch: ScheduledBatch, logits: torch.Tensor) -> StepResult:
        entries = batch.entries
        result = StepResult([()] * len(entries), [None] * len(entries), [])
        sampled: list[tuple[int, int]] = []  # (entry index, logits row)
        row = 0
        for i, e in enumerate(entries):
            if e.logits_from is None:
                continue
            n = e.end - e.logits_from
            state: DecodeState = e.req.engine_data
            if state.prompt_logprob_start is not None:
                guarded(state, record_prompt_logprobs, e, logits[row:row + n])
            if state.done:  # failed just now
                result.reasons[i] = "error"
            elif e.sample:
                sampled.append((i, row + n - 1))
            row += n
        if sampled:
            self._sample(entries, logits, sampled, result)
        return result

    def _sample(self, entries: Sequence[ScheduledEntry], logits: torch.Tensor,
                sampled: list[tuple[int, int]], result: StepResult) -> None:
        rows = [r for _, r in sampled]
        sub = logits if rows == list(range(logits.shape[0])) else logits[rows]
        states = [entries[i].req.engine_data for i, _ in sampled]
        for (i, _), state, draw in zip(sampled, states, self.sampler.sample(sub, states)):
            req = entries[i].req
            if draw.error is not None:
                state.fail(draw.error)
            else:
                room = req.max_seq_len - req.seq_len - 1  # after this token
                jump = guarded(state, state.accept, draw.token, room, draw.logprob, draw.top)
                if state.error is None:
                    result.tokens[i] = (draw.token,)
                    if jump is not None and not state.done:
                        result.jumps.append((req, jump))
            if state.done:
                result.reasons[i] = state.finish_reason


def guarded(state: DecodeState, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args); an exception fails the request of `state` instead of the engine."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - one request's fault
        state.fail(exc)
        return None


def record_prompt_logprobs(e: ScheduledEntry, rows: torch.Tensor) -> None:
    """Record the logprobs of prompt tokens p + 1 from the logits at fed positions p."""
    req, state = e.req, e.req.engine_data
    lo = max(e.logits_from, req.prompt_logprob_start)
    hi = min(e.end, req.prompt_len - 1)
    if lo >= hi:
        return
    lps = torch.log_softmax(rows[lo - e.logits_from: hi - e.logits_from].float(), dim=-1)
    targets = req.token_ids[lo + 1: hi + 1]
    chosen = lps.gather(1, torch.tensor(targets, device=lps.device)[:, None])[:, 0].tolist()
    k = req.params.top_logprobs_num
    top: list[tuple[tuple[int, float], ...]] = [()] * len(targets)
    if k:
        best = lps.topk(k, dim=-1)
        top = [tuple(zip(i, v)) for i, v in zip(best.indices.tolist(), best.values.tolist())]
    for j, token in enumerate(targets):
        state.record_prompt_logprob(lo + 1 + j, token, chosen[j], top[j])
