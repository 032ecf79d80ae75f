"""StepOutputs: one forward pass's logits -> tokens handed to each request's DecodeState,
per batch entry. The DecodeState appends them to the request and decides its finish reason.

    out = outputs.process(batch, logits, draft_probs)   # sampled, drafts verified, accepted
    step = outputs.defer(batch, logits)                 # overlap: draws queued on the device
    step = outputs.defer_settled(batch, logits)         # ... after the step before settled
    out = outputs.settle(step)                          # ... their tokens, a step later

Logits row layout, verify chains and the rejection rule: docs/design/engine-step.md and
docs/design/speculative.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lmprog.core.protocol import FinishReason
from lmprog.decoding.batch_sampler import BatchSampler, Draw, PendingDraws
from lmprog.decoding.decode_state import DecodeState
from lmprog.decoding.sampler import argmax_rows

from ..draft_tree import children, walk
from ..request import Req, ReqStatus
from ..scheduler import ScheduledBatch, ScheduledEntry

DraftProbs = Callable[[Req], Any]  # a verify entry's request -> [k, V] draft probs or None


@dataclass(frozen=True)
class StepResult:
    """tokens[i] / reasons[i]: the tokens entry i sampled (its request's DecodeState has
    appended them) and its finish reason (None: goes on); jumped: tokens jump-forwards
    appended;
    accepted[i] / rejected[i]: entry i's draft tokens accepted, and whether its chain ended
    at a rejected draft (False: all accepted, or it finished or jumped first)."""

    tokens: list[tuple[int, ...]]
    reasons: list[FinishReason | None]
    jumped: list[int]
    accepted: list[int] = field(default_factory=list)
    rejected: list[bool] = field(default_factory=list)

    @property
    def num_sampled(self) -> int:
        """Tokens drawn from the model this step (accepted drafts included)."""
        return sum(map(len, self.tokens))

    @property
    def num_accepted(self) -> int:
        return sum(self.accepted)


@dataclass(frozen=True)
class DeferredStep:
    """A launched step whose tokens are still on the device. `sampling`: the indices of its
    sampling entries, in logits-row order; `draws`: their draws; `capped`: requests the
    scheduler ended at their length cap with this step's token (it still goes to them);
    `seconds`: the host time the step took to launch (for the metrics)."""

    batch: ScheduledBatch
    sampling: tuple[int, ...]
    draws: PendingDraws | None
    capped: tuple[Req, ...] = ()
    seconds: float = 0.0

    @property
    def token_ids(self) -> torch.Tensor | None:
        """The sampled tokens on the device, row b for placeholder -1 - b."""
        return None if self.draws is None else self.draws.token_ids

    def placeholders(self) -> list[tuple[int, ...]]:
        """Per entry, what process_launched appends."""
        tokens: list[tuple[int, ...]] = [()] * len(self.batch.entries)
        for b, i in enumerate(self.sampling):
            tokens[i] = (-1 - b,)
        return tokens


@dataclass(eq=False)
class _Chain:
    """One sampling entry being verified (a plain decode is a chain without drafts; a token
    tree is walked from its root, one accepted node per position)."""

    index: int  # entry index
    row: int  # logits row of position 0 (the root); draft i's row is row + 1 + i
    drafts: tuple[int, ...]
    probs: Any  # [len(drafts), V] draft distributions, or None (deterministic drafts)
    parents: tuple[int, ...] | None = None  # a token tree's (None: a chain)
    tokens: list[int] = field(default_factory=list)
    node: int = -1  # the draft reached (-1: the root)
    kids: list[list[int]] | None = None  # a tree's children per node + 1

    def __post_init__(self) -> None:
        if self.parents is not None:
            self.kids = children(self.parents)

    @property
    def at(self) -> int:
        """The logits row of the next position: after the node reached."""
        return self.row + self.node + 1

    def candidates(self) -> list[int]:
        """The drafts that may come next (a chain's next one; a tree node's children)."""
        if self.kids is not None:
            return self.kids[self.node + 1]
        nxt = self.node + 1
        return [nxt] if nxt < len(self.drafts) else []

    def follow(self, token: int) -> bool:
        """Move to the first candidate whose token is `token`; False when none is."""
        for c in self.candidates():
            if self.drafts[c] == token:
                self.node = c
                return True
        return False

    def judged(self, state: DecodeState) -> bool:
        """The next position uses the rejection rule (explicit q, a sampled request)."""
        return self.probs is not None and bool(self.candidates()) and not state.params.greedy


class StepOutputs:
    def __init__(self, sampler: BatchSampler) -> None:
        self.sampler = sampler

    def process(
        self, batch: ScheduledBatch, logits: torch.Tensor, draft_probs: DraftProbs | None = None
    ) -> StepResult:
        entries = batch.entries
        n = len(entries)
        result = StepResult([()] * n, [None] * n, [], [0] * n, [False] * n)
        sampling: list[tuple[int, int]] = []  # (entry index, logits row of its position 0)
        states: list[DecodeState] = []  # of the sampling entries
        verify, row = False, 0
        for i, e in enumerate(entries):
            if e.logits_from is None:
                continue
            rows = e.start + e.num_new - e.logits_from
            if e.req.status is ReqStatus.FINISHED:  # while this step was in flight
                row += rows
                continue
            state: DecodeState = e.req.engine_data
            if state.prompt_logprob_start is not None:
                guarded(state, record_prompt_logprobs, e, logits[row : row + rows])
            if state.done:  # failed just now
                result.reasons[i] = "error"
            elif e.sample:
                k = len(e.draft_ids)
                sampling.append((i, row + rows - 1 - k))
                states.append(state)
                verify = verify or k > 0
            row += rows
        if verify:
            self._verify(
                entries,
                logits,
                [_chain(entries[i], i, r, draft_probs) for i, r in sampling],
                result,
            )
        elif sampling:
            self._decode(entries, logits, sampling, states, result)
        return result

    def defer(self, batch: ScheduledBatch, logits: torch.Tensor) -> DeferredStep | None:
        """Queue this step's draws without waiting for them, when every entry with logits
        is a plain sampling entry of a history-free request (else None: `process` it)."""
        sampling, states = [], []
        for i, e in enumerate(batch.entries):
            if e.logits_from is None:
                continue
            state: DecodeState = e.req.engine_data
            if not e.sample or e.draft_ids or not state.history_free:
                return None
            sampling.append(i)
            states.append(state)
        assert logits.shape[0] == len(sampling), "one logits row per sampling entry"
        draws = self.sampler.sample_async(logits, states) if sampling else None
        return DeferredStep(batch, tuple(sampling), draws)

    def defer_settled(self, batch: ScheduledBatch, logits: torch.Tensor) -> DeferredStep | None:
        """As `defer`, once the step in flight before this one has settled: the host holds
        every previous token, so what sampling reads from them -- a constraint's mask, penalty
        counts, min_tokens -- is current, and is computed while this step's forward pass
        runs. Every entry with logits must be a plain sampling entry (no drafts, one row) of
        a request without prompt logprobs to record (else None: `process` it). An entry whose
        request finished as the last step settled, or rewrote its last tokens (a
        jump-forward), draws nothing: its row was computed for tokens it no longer has, and
        the scheduler feeds its new ones next (`ResultRecorder.launched`)."""
        rows, sampling, states = [], [], []
        row = 0
        for i, e in enumerate(batch.entries):
            if e.logits_from is None:
                continue
            state: DecodeState = e.req.engine_data
            one_row = e.start + e.num_new - e.logits_from == 1
            if not e.sample or e.draft_ids or not one_row or state.prompt_logprob_start is not None:
                return None
            if not state.done and e.req.rewritten_from is None:
                rows.append(row)
                sampling.append(i)
                states.append(state)
            row += 1
        assert logits.shape[0] == row, "one logits row per sampling entry"
        draws = self.sampler.sample_async(_rows(logits, rows), states) if sampling else None
        return DeferredStep(batch, tuple(sampling), draws)

    def settle(self, step: DeferredStep) -> StepResult:
        """The deferred step's outcome (waits for its tokens): as `process` would give."""
        entries = step.batch.entries
        n = len(entries)
        result = StepResult([()] * n, [None] * n, [], [0] * n, [False] * n)
        if step.draws is None:
            return result
        for i, draw in zip(step.sampling, step.draws.draws()):
            e = entries[i]
            if e.req.engine_data.done:  # (a request at its length cap has not: see capped)
                continue
            if _hand(e.req, i, draw, result)[0]:
                result.tokens[i] = (draw.token,)
        return result

    def _decode(
        self,
        entries: Sequence[ScheduledEntry],
        logits: torch.Tensor,
        sampling: list[tuple[int, int]],
        states: list[DecodeState],
        result: StepResult,
    ) -> None:
        """A step without drafts: one token per sampling entry from one sampler call, as
        _verify would draw and take them (every chain of length one), minus its bookkeeping."""
        sub = _rows(logits, [r for _, r in sampling])
        for (i, _), draw in zip(sampling, self.sampler.sample(sub, states)):
            req = entries[i].req
            if _hand(req, i, draw, result)[0]:
                result.tokens[i] = (draw.token,)

    def _verify(
        self,
        entries: Sequence[ScheduledEntry],
        logits: torch.Tensor,
        chains: list[_Chain],
        result: StepResult,
    ) -> None:
        argmax = [c for c in chains if c.drafts and _argmax_suffices(entries[c.index].req)]
        if argmax:
            self._verify_by_argmax(entries, logits, argmax, result)
        active = [c for c in chains if c not in argmax] if argmax else chains
        while active:
            states = [entries[c.index].req.engine_data for c in active]
            judged = [c.judged(st) for c, st in zip(active, states)]
            outcomes = self._draw(logits, active, states, judged)
            active = [
                c
                for c, draw in zip(active, outcomes)
                if self._take(entries[c.index], c, draw, result)
            ]
        for c in chains:
            i = c.index
            result.tokens[i] = tuple(c.tokens)
            path = walk(c.drafts, c.parents, c.tokens)
            result.accepted[i] = len(path)
            c.node = path[-1] if path else -1
            result.rejected[i] = len(c.tokens) > len(path) and bool(c.candidates())

    def _verify_by_argmax(
        self,
        entries: Sequence[ScheduledEntry],
        logits: torch.Tensor,
        chains: list[_Chain],
        result: StepResult,
    ) -> None:
        """Greedy chains (and trees) whose choice at every position is the plain argmax (see
        _argmax_suffices): all their rows in one argmax and one device read."""
        rows = [c.row + j for c in chains for j in range(len(c.drafts) + 1)]
        ids = argmax_rows(_rows(logits, rows)).tolist()
        at = 0
        for c in chains:
            while self._take(entries[c.index], c, Draw(ids[at + c.node + 1]), result):
                pass
            at += len(c.drafts) + 1

    def _draw(
        self,
        logits: torch.Tensor,
        active: list[_Chain],
        states: list[DecodeState],
        judged: list[bool],
    ) -> list[Draw]:
        """The next position's token for every active chain: one sampler call for the plain
        rows (deterministic drafts: the target's own draw decides which child, if any, is
        accepted), one rejection-rule call for the judged ones with one candidate, one
        multi-draft call for those with several (siblings of a tree)."""
        out: list[Draw] = [Draw()] * len(active)
        plain = [b for b, x in enumerate(judged) if not x]
        if plain:
            sub = _rows(logits, [active[b].at for b in plain])
            for b, draw in zip(plain, self.sampler.sample(sub, [states[b] for b in plain])):
                out[b] = draw
        rule = [b for b, x in enumerate(judged) if x and len(active[b].candidates()) == 1]
        if rule:
            sub = logits[[active[b].at for b in rule]]
            nxt = [active[b].candidates()[0] for b in rule]
            q = torch.stack([active[b].probs[n] for b, n in zip(rule, nxt)])
            verdicts = self.sampler.judge(
                sub, [states[b] for b in rule], [active[b].drafts[n] for b, n in zip(rule, nxt)], q
            )
            for b, (draw, _) in zip(rule, verdicts):
                out[b] = draw
        multi = [b for b, x in enumerate(judged) if x and len(active[b].candidates()) > 1]
        if multi:
            sub = logits[[active[b].at for b in multi]]
            kids = [active[b].candidates() for b in multi]
            siblings = self.sampler.judge_siblings(
                sub,
                [states[b] for b in multi],
                [[active[b].drafts[k] for k in ks] for b, ks in zip(multi, kids)],
                [active[b].probs[ks] for b, ks in zip(multi, kids)],
            )
            for b, (draw, _) in zip(multi, siblings):
                out[b] = draw
        return out

    @staticmethod
    def _take(e: ScheduledEntry, c: _Chain, draw: Draw, result: StepResult) -> bool:
        """Hand the next token to the request's state; True when the chain goes on (the
        token is a candidate draft's, now the node reached)."""
        taken, jump = _hand(e.req, c.index, draw, result)
        if taken:
            c.tokens.append(draw.token)
        if e.req.engine_data.done:
            return False
        return jump is None and c.follow(draw.token)


def _chain(e: ScheduledEntry, index: int, row: int, draft_probs: DraftProbs | None) -> _Chain:
    probs = draft_probs(e.req) if e.draft_ids and draft_probs is not None else None
    return _Chain(index, row, e.draft_ids, probs, e.draft_parents)


def _hand(req: Req, index: int, draw: Draw, result: StepResult) -> tuple[bool, Any]:
    """Hand draw, a token of entry `index`, to req's state, which appends it to the request
    (and may jump forward): a draw error fails the request; a finished request's reason
    goes to result.reasons[index]. Returns (whether the token joined the request's output,
    the JumpResult accept returned or None)."""
    state: DecodeState = req.engine_data
    jump = None
    if draw.error is not None:
        state.fail(draw.error)
    else:
        room = req.max_seq_len - req.known_len - 1  # after this token
        try:  # as guarded(), inline: this runs for every sampled token
            jump = state.accept(draw.token, room, draw.logprob, draw.top)
        except Exception as exc:  # noqa: BLE001 - one request's fault
            state.fail(exc)
        if jump is not None:
            result.jumped.append(len(jump.new_token_ids))
    if state.done:
        result.reasons[index] = state.finish_reason
    return state.error is None, jump


def _rows(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """logits[rows], without a copy when rows are consecutive (a view: the usual step, and
    every verify at batch 1). A list index gathers through an index tensor built from the
    list: on a CPU ~0.3 ms for 9 rows of a 49k vocabulary, on a GPU a host-to-device copy."""
    if rows and rows[-1] - rows[0] == len(rows) - 1 and rows == list(range(rows[0], rows[-1] + 1)):
        return logits if len(rows) == logits.shape[0] else logits[rows[0] : rows[-1] + 1]
    return logits[rows]


def _argmax_suffices(req: Req) -> bool:
    """Greedy, and nothing in its sampling depends on the tokens accepted before: no
    penalties, no constraint, min_tokens already met, no logprobs to report."""
    state: DecodeState = req.engine_data
    return (
        state.params.greedy
        and state.counts is None
        and state.guide is None
        and state.logprobs is None
        and len(state.output_ids) >= state.params.min_tokens
    )


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
    # called for an entry with logits whose request asked for prompt logprobs
    assert e.logits_from is not None and req.prompt_logprob_start is not None
    lo = max(e.logits_from, req.prompt_logprob_start)
    hi = min(e.end, req.prompt_len - 1)
    if lo >= hi:
        return
    lps = torch.log_softmax(rows[lo - e.logits_from : hi - e.logits_from].float(), dim=-1)
    targets = req.token_ids[lo + 1 : hi + 1]
    chosen = lps.gather(1, torch.tensor(targets, device=lps.device)[:, None])[:, 0].tolist()
    k = req.params.top_logprobs_num
    top: list[tuple[tuple[int, float], ...]] = [()] * len(targets)
    if k:
        best = lps.topk(k, dim=-1)
        top = [tuple(zip(i, v)) for i, v in zip(best.indices.tolist(), best.values.tolist())]
    for j, token in enumerate(targets):
        state.record_prompt_logprob(lo + 1 + j, token, chosen[j], top[j])
