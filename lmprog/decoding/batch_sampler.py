"""BatchSampler: one token for each request of a step, from their next-token logits.

    draws = sampler.sample(logits, states)            # or sample_async (overlap scheduling)

Wraps sampler.py with each request's DecodeState (params, generator, penalties, guide);
per-row tensors are rebuilt only when the sampled set changes; `judge` runs the rejection
rule for drafts with distributions; a faulty row fails alone. Design: docs/design/sampling.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from lmprog.fsm.mask import allowed_bitmask

from .array_ops import device_of, ops_for
from .arrays import Array
from .decode_state import DecodeState
from .sampler import (
    NO_TOKEN,
    SampleOutput,
    SamplingTensors,
    probabilities,
    sample,
    with_logprobs,
)


class Draw(NamedTuple):
    """One row's outcome: a token with its raw logprob and top alternatives, or an error.
    (A NamedTuple: one is made per sampled row per step, at a third of a dataclass's cost.)"""

    token: int = -1
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
    error: BaseException | None = None


class BatchSampler:
    def __init__(self, eos_token_ids: Sequence[int]) -> None:
        self._eos = tuple(eos_token_ids)
        self._key: tuple[int, ...] = ()
        self._held: list[DecodeState] = []  # keeps the keyed states alive: ids stay unique
        self._tensors: SamplingTensors | None = None

    def sample(self, logits: Array, states: Sequence[DecodeState]) -> list[Draw]:
        """logits [B, V] (a torch tensor or a numpy array; may be modified in place),
        states[b] the request of row b."""
        assert logits.shape[0] == len(states) > 0
        try:
            out = self._sample(logits, states, self._tensors_for(states, device_of(logits)))
        except Exception:  # noqa: BLE001 - isolate the faulty rows below
            return [self._sample_alone(logits[b : b + 1], st) for b, st in enumerate(states)]
        return _draws(out, len(states))

    def sample_async(self, logits: Any, states: Sequence[DecodeState]) -> PendingDraws:
        """As `sample`, without waiting for the device: the tokens stay on it (for the next
        step's inputs) and reach the host by a copy that `PendingDraws.draws()` waits for."""
        assert logits.shape[0] == len(states) > 0
        try:
            out = self._sample(logits, states, self._tensors_for(states, logits.device))
        except Exception:  # noqa: BLE001 - isolate the faulty rows, synchronously
            return PendingDraws.ready(self.sample(logits, states), logits.device)
        return PendingDraws.start(out, len(states))

    def judge(
        self,
        logits: Any,
        states: Sequence[DecodeState],
        drafts: Sequence[int],
        draft_probs: Any,
    ) -> list[tuple[Draw, bool]]:
        """The rejection rule per row: draft drafts[b], drawn from draft_probs[b] [V], against
        the distribution `sample` would draw row b from. Returns (draw, accepted) per row."""
        assert logits.shape[0] == len(states) == len(drafts) == draft_probs.shape[0] > 0
        try:
            return self._judge(
                logits, states, drafts, draft_probs, self._tensors_for(states, logits.device)
            )
        except Exception:  # noqa: BLE001 - isolate the faulty rows below
            return [
                self._judge_alone(logits[b : b + 1], st, drafts[b : b + 1], draft_probs[b : b + 1])
                for b, st in enumerate(states)
            ]

    def _judge(
        self,
        logits: Any,
        states: Sequence[DecodeState],
        drafts: Sequence[int],
        draft_probs: Any,
        tensors: SamplingTensors,
    ) -> list[tuple[Draw, bool]]:
        from .rejection import rejection_sample  # torch tensors only (the runtime)

        ops = ops_for(logits)
        raw, p, gaps = self._target(logits, states, tensors)
        d = ops.asarray(list(drafts), "int64")
        tokens, accepted = rejection_sample(
            p, draft_probs.to(p.device), d, [s.generator for s in states]
        )
        draws = _verdicts(tokens, raw, p, gaps, tensors.max_top_logprobs, len(states))
        return list(zip(draws, accepted.tolist()))

    def judge_siblings(
        self,
        logits: Any,
        states: Sequence[DecodeState],
        drafts: Sequence[Sequence[int]],
        draft_probs: Sequence[Any],
    ) -> list[tuple[Draw, int]]:
        """Row b's alternatives drafts[b] (siblings of a token tree, drafts[b][j] drawn from
        draft_probs[b][j] [V]) against the distribution `sample` would draw row b from, by
        the multi-draft rule (rejection.sibling_rejection). Returns (draw, index of the
        accepted sibling or -1) per row."""
        assert logits.shape[0] == len(states) == len(drafts) == len(draft_probs) > 0
        try:
            return self._judge_siblings(
                logits, states, drafts, draft_probs, self._tensors_for(states, logits.device)
            )
        except Exception:  # noqa: BLE001 - isolate the faulty rows below
            out = []
            for b, st in enumerate(states):
                try:
                    tensors = SamplingTensors.from_params(
                        [st.params], eos_token_ids=self._eos, device=device_of(logits)
                    )
                    out.append(
                        self._judge_siblings(
                            logits[b : b + 1], [st], drafts[b : b + 1], draft_probs[b : b + 1],
                            tensors,
                        )[0]
                    )  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - becomes this request's error
                    out.append((Draw(error=exc), -1))
            return out

    def _judge_siblings(
        self,
        logits: Any,
        states: Sequence[DecodeState],
        drafts: Sequence[Sequence[int]],
        draft_probs: Sequence[Any],
        tensors: SamplingTensors,
    ) -> list[tuple[Draw, int]]:
        from .rejection import sibling_rejection  # torch tensors only (the runtime)

        ops = ops_for(logits)
        raw, p, gaps = self._target(logits, states, tensors)
        outcomes = [
            sibling_rejection(p[b], draft_probs[b].to(p.device), drafts[b], st.generator)
            for b, st in enumerate(states)
        ]
        tokens = ops.asarray([t for t, _ in outcomes], "int64")
        draws = _verdicts(tokens, raw, p, gaps, tensors.max_top_logprobs, len(states))
        return [(d, j) for d, (_, j) in zip(draws, outcomes)]

    def _target(
        self, logits: Any, states: Sequence[DecodeState], tensors: SamplingTensors
    ) -> tuple[Any, Any, bool]:
        """The raw logprobs (when asked for), the distribution `sample` would draw each row
        from (what a verify judges drafts against), and whether a row may be all zeros (a
        constraint or min_tokens leaves it nothing)."""
        ops = ops_for(logits)
        raw = ops.log_softmax(ops.astype(logits, "float32")) if tensors.return_logprob else None
        counts, prompt, n_out, bitmask = self._inputs(logits, states, tensors)
        p = probabilities(
            logits,
            tensors,
            output_counts=counts,
            prompt_mask=prompt,
            num_output_tokens=n_out,
            bitmask=bitmask,
        )
        return raw, p, bitmask is not None or tensors.any_min_tokens

    def _judge_alone(
        self,
        logits: Any,
        state: DecodeState,
        drafts: Sequence[int],
        draft_probs: Any,
    ) -> tuple[Draw, bool]:
        try:
            tensors = SamplingTensors.from_params(
                [state.params], eos_token_ids=self._eos, device=device_of(logits)
            )
            return self._judge(logits, [state], drafts, draft_probs, tensors)[0]
        except Exception as exc:  # noqa: BLE001 - becomes this request's error
            return Draw(error=exc), False

    def _sample_alone(self, logits: Array, state: DecodeState) -> Draw:
        try:
            tensors = SamplingTensors.from_params(
                [state.params], eos_token_ids=self._eos, device=device_of(logits)
            )
            return _draws(self._sample(logits, [state], tensors), 1)[0]
        except Exception as exc:  # noqa: BLE001 - becomes this request's error
            return Draw(error=exc)

    def _tensors_for(self, states: Sequence[DecodeState], device: Any) -> SamplingTensors:
        key = tuple(map(id, states))
        if key != self._key or self._tensors is None:
            self._tensors = SamplingTensors.from_params(
                [s.params for s in states], eos_token_ids=self._eos, device=device
            )
            self._key, self._held = key, list(states)
        return self._tensors

    def _sample(
        self, logits: Array, states: Sequence[DecodeState], tensors: SamplingTensors
    ) -> SampleOutput:
        counts, prompt, n_out, bitmask = self._inputs(logits, states, tensors)
        generators = None  # all-greedy rows draw nothing
        if not tensors.all_greedy:
            generators = [s.generator for s in states]
            if all(g is None for g in generators):
                generators = None
        return sample(
            logits,
            tensors,
            generators=generators,
            output_counts=counts,
            prompt_mask=prompt,
            num_output_tokens=n_out,
            bitmask=bitmask,
            mask_in_place=True,
        )

    @staticmethod
    def _inputs(
        logits: Array, states: Sequence[DecodeState], tensors: SamplingTensors
    ) -> tuple[Array | None, Array | None, list[int] | None, Array | None]:
        """(penalty counts, prompt token masks, output lengths, constraint bitmask) of the
        rows, as the sampler takes them."""
        ops = ops_for(logits)
        counts: Array | None = None
        prompt: Array | None = None
        n_out: list[int] | None = None
        bitmask: Array | None = None
        width = logits.shape[1]
        if tensors.any_penalty:
            counts = ops.stack(
                [s.counts if s.counts is not None else ops.zeros(width, "int32") for s in states]
            )
        if tensors.any_repetition:
            prompt = ops.stack(
                [
                    s.prompt_mask if s.prompt_mask is not None else ops.zeros(width, "bool")
                    for s in states
                ]
            )
        if tensors.any_min_tokens:
            n_out = [len(s.output_ids) for s in states]
        guides = [s.guide for s in states]
        if any(g is not None for g in guides):
            bitmask = allowed_bitmask(guides, width, ops.device)
        return counts, prompt, n_out, bitmask


class PendingDraws:
    """Draws on their way to the host. `token_ids`: the tokens on the device [B] (int64);
    `draws()`: the Draws, waiting for the copy (the first call; later ones return them).
    Torch tensors only (overlap scheduling is the runtime's)."""

    def __init__(
        self,
        token_ids: Any,
        n: int,
        host: SampleOutput | None = None,
        done: Any = None,
        draws: list[Draw] | None = None,
    ) -> None:
        self.token_ids = token_ids
        self._n, self._host, self._done, self._draws = n, host, done, draws

    @classmethod
    def start(cls, out: SampleOutput, n: int) -> PendingDraws:
        """Start copying `out` to the host (pinned memory, asynchronous on a GPU). A NO_TOKEN
        row is fed token 0 (never read: its request fails when the draws are read)."""
        fed = out.token_ids.clamp(min=0)
        if out.token_ids.device.type == "cpu":
            return cls(fed, n, out)
        host = SampleOutput(
            *(
                None if t is None else t.to("cpu", non_blocking=True)
                for t in (out.token_ids, out.logprobs, out.top_token_ids, out.top_logprobs)
            )
        )
        import torch

        done = torch.cuda.Event()
        done.record()
        return cls(fed, n, host, done)

    @classmethod
    def ready(cls, draws: list[Draw], device: Any) -> PendingDraws:
        """Draws already on the host (a failed row's token is -1, never fed: it finishes)."""
        import torch

        ids = torch.tensor([max(d.token, 0) for d in draws], dtype=torch.int64, device=device)
        return cls(ids, len(draws), draws=draws)

    def draws(self) -> list[Draw]:
        if self._draws is None:
            if self._done is not None:
                self._done.synchronize()
            assert self._host is not None  # set by start() whenever the draws are not
            self._draws = _draws(self._host, self._n)
            self._host = self._done = None
        return self._draws


def _draws(out: SampleOutput, n: int) -> list[Draw]:
    ids = out.token_ids.tolist()
    if out.logprobs is None:
        draws = [Draw(t) for t in ids]
    elif out.top_token_ids is None:
        draws = [Draw(t, lp) for t, lp in zip(ids, out.logprobs.tolist())]
    else:
        assert out.top_logprobs is not None  # set with top_token_ids
        lps, top_ids, top_lps = (
            x.tolist() for x in (out.logprobs, out.top_token_ids, out.top_logprobs)
        )
        draws = [Draw(ids[b], lps[b], tuple(zip(top_ids[b], top_lps[b]))) for b in range(n)]
    if NO_TOKEN in ids:
        draws = [_nothing_left() if t == NO_TOKEN else d for t, d in zip(ids, draws)]
    return draws


def _nothing_left() -> Draw:
    return Draw(
        error=ValueError("a row has no token left to sample (every token is masked or -inf)")
    )


def _verdicts(tokens: Any, raw: Any, p: Any, gaps: bool, top_logprobs: int, n: int) -> list[Draw]:
    """Judged tokens as Draws; with `gaps`, a row whose distribution is all zeros draws none."""
    if gaps:
        ops = ops_for(p)
        tokens = ops.masked_fill(tokens, ops.sum(p) == 0, NO_TOKEN)
    return _draws(with_logprobs(tokens, raw, top_logprobs), n)
