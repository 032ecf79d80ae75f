"""DecodeState: the output side of one request, shared by every backend (one thread drives it).

A backend samples a token for the request (the runtime engine for many requests at once,
the llama.cpp backend for one; both through `BatchSampler`) and hands it to `accept`, which
applies the finish rules:

    stop token id / EOS (unless ignore_eos)  -> "stop" (the token is in output_ids, not in text)
    a stop string                            -> "stop" (the text ends before it)
    the constraint is finished               -> "stop"
    max_tokens                               -> "length" (with a message inside a constraint)
    no room left in the context              -> "length" ("the context of N tokens is full")

and may jump forward through text the constraint forces. The tokens have one owner,
`outputs` (a list, or the runtime's request: ReqOutputs), which accept appends to and a
jump rewrites. Text pieces go to `emit` as soon as they are final. Abort and errors:
`finish` / `fail`. Design: docs/design/engine-step.md#finish-rules.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableSequence, Sequence
from typing import Any

import numpy as np

from lmprog.core.errors import BackendError, ConstraintError
from lmprog.core.protocol import (
    FinishReason,
    GenerateResult,
    StreamPiece,
    TokenLogprob,
    TopLogprob,
)
from lmprog.core.sampling import SamplingParams

from .array_ops import ops_on
from .detok import TextStream
from .result import EngineResult
from .rng import make_generator

TokenText = Callable[[int], str]


class _NoText:
    """The text stream of an engine without a tokenizer (token ids only; no stop strings)."""

    text = ""
    matched_stop = None

    def arm(self) -> None:
        pass

    def push(self, token_id: int) -> str:
        return ""

    def splice(self, drop: int, new_ids: Sequence[int]) -> str:
        return ""

    def finish(self) -> str:
        return ""


def _net_tokens(jump: Any) -> int:
    """How many tokens a jump-forward (or None) added to the outputs."""
    return 0 if jump is None else len(jump.new_token_ids) - jump.drop_last_n_tokens


def _token_mask(ids: Sequence[int], vocab_size: int, device: Any) -> Any:
    """bool [vocab_size]: True at each id of `ids` (ids outside the vocabulary skipped)."""
    inside = [t for t in ids if 0 <= t < vocab_size]
    if device is None:
        mask = np.zeros(vocab_size, dtype=np.bool_)
        mask[inside] = True
        return mask
    host = ops_on("cpu")
    mask = host.zeros(vocab_size, "bool")
    if inside:
        mask[host.asarray(inside, "int64")] = True
    return mask.to(device)


class DecodeState:
    """Per-request mutable state: output ids, text stream, guide, RNG, penalty counts,
    logprobs. Not thread-safe; the backend's decoding thread owns it. `device`: where the
    sampler's arrays live, a torch device or None (numpy; no torch imported).

    What `BatchSampler` reads: params, output_ids (min_tokens), counts (penalties), prompt_mask
    (the repetition penalty's prompt tokens), guide
    (mask), generator (seed). A request with max_tokens == 0 never reaches `accept`: its
    backend ends it with `finish("length")`.
    """

    def __init__(
        self,
        params: SamplingParams,
        *,
        tokenizer: Any,
        prompt_ids: Sequence[int],
        eos_token_ids: Sequence[int],
        vocab_size: int,
        token_text: TokenText,
        emit: Callable[[str], None] | None = None,
        guide: Any = None,
        jump_forward: bool = True,
        prompt_logprob_start: int | None = None,
        device: Any = "cpu",
        outputs: MutableSequence[int] | None = None,
    ) -> None:
        """outputs: where the generated tokens live (empty at the start); a new list if None."""
        self.params = params
        self.output_ids: MutableSequence[int] = [] if outputs is None else outputs
        self._prompt_len = len(prompt_ids)
        self.done = False
        self.finish_reason: FinishReason = "length"
        self.matched_stop: str | int | None = None
        self.message: str | None = None
        self.error: BaseException | None = None
        self.first_token_at: float | None = None  # time.perf_counter() of the first output
        self.guide = guide
        self.generator = make_generator(params.seed)
        # penalty counts and the prompt's tokens as arrays of the sampler's kind (device
        # None: numpy, as the llama.cpp backend samples)
        self.counts = ops_on(device).zeros(vocab_size, "int32") if params.penalised else None
        # the prompt's tokens, which the repetition penalty counts as seen (bool [V])
        self.prompt_mask = (
            _token_mask(prompt_ids, vocab_size, device)
            if params.repetition_penalty != 1.0
            else None
        )
        self.stop_ids = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        )
        wants_logprobs = params.return_logprob or params.top_logprobs_num > 0
        self.logprobs: list[TokenLogprob] | None = [] if wants_logprobs else None
        # Jump-forward appends tokens the model did not sample, which have no logprob.
        self.jump = jump_forward and guide is not None and not wants_logprobs
        self.prompt_logprob_start = prompt_logprob_start
        self.prompt_logprobs: dict[int, TokenLogprob] = {}  # keyed by position of the token
        self._armed = params.min_tokens == 0  # stop strings are looked for (min_tokens met)
        self._text: TextStream | _NoText = (
            TextStream(
                tokenizer,
                params.stop,
                prompt_ids,
                armed=self._armed,
                stop_regex=params.stop_regex,
                skip_special_tokens=params.skip_special_tokens,
            )
            if tokenizer is not None
            else _NoText()
        )
        self._tokenizer = tokenizer
        self._emit = emit
        self._token_text = token_text
        self._logprobs_emitted = 0  # logprobs already sent with a piece

    @property
    def text(self) -> str:
        return self._text.text

    @property
    def history_free(self) -> bool:
        """Its next token can be drawn before the host knows the previous one (overlap
        scheduling): nothing its sampling reads changes with that token — no constraint
        guide, no penalty counts, min_tokens already met — and no prompt logprobs to record."""
        return (
            self.guide is None
            and self.counts is None
            and not self.done
            and self.prompt_logprob_start is None
            and len(self.output_ids) >= self.params.min_tokens
        )

    # -- one sampled token -----------------------------------------------------------------
    def accept(
        self,
        token: int,
        room: int | None = None,
        logprob: float | None = None,
        top: Sequence[tuple[int, float]] = (),
    ) -> Any:
        """Take the sampled token; return a non-noop JumpResult to mirror, else None.

        room: how many more tokens the sequence has room for after this one (bounds a
        jump; None: only max_tokens does). logprob/top: the token's raw logprob and the
        (token, logprob) alternatives, when the params ask for logprobs. Raises
        BackendError if the token breaks the constraint (a bug upstream).
        """
        assert not self.done, "accept after the request finished"
        # Runs for every request every step: calls that would do nothing are skipped.
        if self.logprobs is not None:
            self._record_logprob(token, logprob, top)
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.output_ids.append(token)
        if self.counts is not None:
            self.counts[token] += 1
        if not self._armed and len(self.output_ids) >= self.params.min_tokens:
            self._text.arm()
            self._armed = True
        if token in self.stop_ids:
            self._advance_guide(token, allow_fail=True)
            self.finish("stop", matched=token)
            return None
        if self.guide is not None:
            self._advance_guide(token)
        piece = self._text.push(token)
        if piece:
            self._emit_piece(piece)
        if self._settled():
            return None
        jump = self._jump_forward(room) if self.jump else None
        if self.done:
            return jump
        if len(self.output_ids) >= self.params.max_tokens:
            self.finish("length", message=self._length_message())
        elif room is not None and room - _net_tokens(jump) <= 0:
            total = self._prompt_len + len(self.output_ids)
            self.finish("length", message=f"the context of {total} tokens is full")
        return jump

    def _settled(self) -> bool:
        """Finish on a matched stop string or a finished constraint; True if finished."""
        if self._text.matched_stop is not None:
            self.finish("stop", matched=self._text.matched_stop)
        elif self.guide is not None and self.guide.is_finished():
            self.finish("stop")
        return self.done

    def _advance_guide(self, token: int, allow_fail: bool = False) -> None:
        if self.guide is None:
            return
        try:
            self.guide.advance(token)
        except ValueError as exc:
            if allow_fail:
                return
            if isinstance(exc, ConstraintError):
                raise  # a limit this request's constraint reached here: its own error
            raise BackendError(f"sampled a token the constraint forbids: {exc}") from exc

    def _jump_forward(self, room: int | None) -> Any:
        from lmprog.fsm.jump import jump_forward

        budget = self.params.max_tokens - len(self.output_ids)
        if room is not None:
            budget = min(budget, room)
        jump = jump_forward(self.guide, self.output_ids, self._tokenizer, max_new_tokens=budget)
        if jump.is_noop:
            return None
        kept = len(self.output_ids) - jump.drop_last_n_tokens
        if self.counts is not None:
            for t in self.output_ids[kept:]:
                self.counts[t] -= 1
            for t in jump.new_token_ids:
                self.counts[t] += 1
        self.output_ids[kept:] = jump.new_token_ids
        self._emit_piece(self._text.splice(jump.drop_last_n_tokens, jump.new_token_ids))
        self._settled()
        return jump

    def _length_message(self) -> str | None:
        return self.guide.length_message() if self.guide is not None else None

    # -- logprobs --------------------------------------------------------------------------
    def _record_logprob(
        self, token: int, logprob: float | None, top: Sequence[tuple[int, float]]
    ) -> None:
        if self.logprobs is None:
            return
        assert logprob is not None, "the sampler returns logprobs for rows that want them"
        n = self.params.top_logprobs_num
        alts = tuple(TopLogprob(t, self._token_text(t), lp) for t, lp in top[:n])
        self.logprobs.append(TokenLogprob(token, self._token_text(token), logprob, alts))

    def record_prompt_logprob(
        self, position: int, token: int, logprob: float, top: Sequence[tuple[int, float]] = ()
    ) -> None:
        """The logprob of prompt token `position` (recomputing one overwrites it)."""
        alts = tuple(TopLogprob(t, self._token_text(t), lp) for t, lp in top)
        self.prompt_logprobs[position] = TokenLogprob(token, self._token_text(token), logprob, alts)

    # -- the end ---------------------------------------------------------------------------
    def finish(
        self, reason: FinishReason, *, matched: str | int | None = None, message: str | None = None
    ) -> None:
        """End the request (idempotent): flush held-back text."""
        if self.done:
            return
        self.done = True
        self.finish_reason, self.matched_stop, self.message = reason, matched, message
        self._emit_piece(self._text.finish())

    def fail(self, error: BaseException) -> None:
        """End the request with an error (its caller gets `error` raised)."""
        if self.error is None:
            self.error = error
        self.done = True
        self.finish_reason = "error"

    def _emit_piece(self, piece: str) -> None:
        if not piece or self._emit is None:
            return
        logprobs = None
        if self.logprobs is not None:
            logprobs = tuple(self.logprobs[self._logprobs_emitted :])
            self._logprobs_emitted = len(self.logprobs)
        self._emit(StreamPiece(piece, len(self.output_ids), logprobs, self._logprobs_emitted))

    def result(self, *, prompt_tokens: int, cached_tokens: int) -> GenerateResult:
        """The finished request's GenerateResult."""
        return GenerateResult(**self._result_fields(prompt_tokens, cached_tokens))

    def engine_result(self, *, prompt_tokens: int, cached_tokens: int) -> EngineResult:
        """`result()` plus the prompt logprobs asked for with `prompt_logprob_start`."""
        prompt_lps = None
        if self.prompt_logprob_start is not None:  # all of them, unless aborted part way
            got: list[TokenLogprob] = []
            for p in range(self.prompt_logprob_start + 1, prompt_tokens):
                lp = self.prompt_logprobs.get(p)
                if lp is None:
                    break
                got.append(lp)
            prompt_lps = tuple(got)
        return EngineResult(
            **self._result_fields(prompt_tokens, cached_tokens), prompt_logprobs=prompt_lps
        )

    def _result_fields(self, prompt_tokens: int, cached_tokens: int) -> dict[str, Any]:
        assert self.done, "result before the request finished"
        return dict(
            text=self._text.text,
            token_ids=tuple(self.output_ids),
            finish_reason=self.finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(self.output_ids),
            cached_tokens=cached_tokens,
            matched_stop=self.matched_stop,
            logprobs=tuple(self.logprobs) if self.logprobs is not None else None,
            message=self.message,
        )
