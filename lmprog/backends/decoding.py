"""One request's decoding, independent of the engine that produces the logits.

The engine loop is:

    dec = SequenceDecoder(params, ...)
    logits = engine.eval(prompt)                      # next-token logits [V]
    while not dec.done:
        dec.step(logits)                              # sample, stream text, check finish
        if not dec.done:
            logits = engine.eval_to(prompt + dec.output_ids)   # usually one new token

`step` samples with the shared sampler (penalties, min_tokens, constraint mask, seed),
feeds the text stream (stop strings held back and cut), advances the constraint guide and
applies jump-forward, which may replace the last output tokens: engines always re-read
`output_ids` rather than appending the sampled token themselves.

Finish rules: a stop token id or EOS (unless ignore_eos) -> "stop" (the token is in
`output_ids` but not in the text); a stop string -> "stop" (the text ends before it); a
finished constraint -> "stop"; max_tokens -> "length" (with a message inside a constraint).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from lmprog.core.detok import TextStream
from lmprog.core.errors import BackendError
from lmprog.core.protocol import FinishReason, GenerateResult, StreamCallback, TokenLogprob, TopLogprob
from lmprog.core.sampler import SamplingTensors, make_generator, sample
from lmprog.core.sampling import SamplingParams


class SequenceDecoder:
    """Mutable per-request state; not thread-safe (one engine thread drives it)."""

    def __init__(
        self,
        params: SamplingParams,
        *,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        prompt_ids: Sequence[int] = (),
        guide: Any = None,
        jump_forward: bool = True,
        stream: StreamCallback | None = None,
        token_text: Callable[[int], str] | None = None,
    ):
        self.params = params
        self.output_ids: list[int] = []
        self.done = params.max_tokens == 0
        self.finish_reason: FinishReason = "length"
        self.matched_stop: str | int | None = None
        self.message: str | None = None
        self._tokenizer = tokenizer
        self._stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self._tensors = SamplingTensors.from_params([params], eos_token_ids=eos_token_ids)
        self._generators = [make_generator(params.seed)]
        self._counts = torch.zeros(1, vocab_size, dtype=torch.int32) if self._tensors.any_penalty else None
        self._text = TextStream(tokenizer, params.stop, prompt_ids, armed=params.min_tokens == 0)
        self._stream = stream
        self._guide = guide
        # Jump-forward appends tokens the model did not sample, which have no logprob.
        self._jump = jump_forward and guide is not None and not self._tensors.return_logprob
        self._logprobs: list[TokenLogprob] | None = [] if self._tensors.return_logprob else None
        self._token_text = token_text or (lambda t: tokenizer.decode([t]))
        self._vocab_size = vocab_size

    @property
    def text(self) -> str:
        return self._text.text

    def step(self, logits: np.ndarray | torch.Tensor) -> None:
        """Sample the next token from next-token `logits` ([V] or [1, V]) and update."""
        assert not self.done, "step after the request finished"
        row = torch.as_tensor(logits).reshape(1, -1)
        out = sample(
            row,
            self._tensors,
            generators=self._generators,
            output_counts=self._counts,
            num_output_tokens=[len(self.output_ids)],
            allowed=self._allowed(row.shape[1]),
        )
        token = int(out.token_ids[0])
        self._record_logprob(token, out)
        self._accept(token)

    def _allowed(self, width: int) -> torch.Tensor | None:
        if self._guide is None:
            return None
        from lmprog.fsm.mask import batch_allowed_mask

        return batch_allowed_mask([self._guide], width)

    def _accept(self, token: int) -> None:
        self.output_ids.append(token)
        if self._counts is not None:
            self._counts[0, token] += 1
        if len(self.output_ids) >= self.params.min_tokens:
            self._text.arm()
        if token in self._stop_ids:
            self._advance_guide(token, allow_fail=True)
            return self._finish("stop", matched=token)
        self._advance_guide(token)
        self._emit(self._text.push(token))
        if self._text.matched_stop is not None:
            return self._finish("stop", matched=self._text.matched_stop)
        if self._guide is not None and self._guide.is_finished():
            return self._finish("stop")
        if self._jump:
            self._jump_forward()
        if len(self.output_ids) >= self.params.max_tokens:
            message = self._guide.length_message() if self._guide is not None else None
            self._finish("length", message=message)

    def _advance_guide(self, token: int, allow_fail: bool = False) -> None:
        if self._guide is None:
            return
        try:
            self._guide.advance(token)
        except ValueError as exc:
            if not allow_fail:
                raise BackendError(f"sampled a token the constraint forbids: {exc}") from exc

    def _jump_forward(self) -> None:
        from lmprog.fsm.jump import jump_forward

        budget = self.params.max_tokens - len(self.output_ids)
        jump = jump_forward(self._guide, self.output_ids, self._tokenizer, max_new_tokens=budget)
        if jump.is_noop:
            return
        kept = len(self.output_ids) - jump.drop_last_n_tokens
        if self._counts is not None:
            for t in self.output_ids[kept:]:
                self._counts[0, t] -= 1
            for t in jump.new_token_ids:
                self._counts[0, t] += 1
        self.output_ids = jump.apply(self.output_ids)
        self._emit(self._text.splice(jump.drop_last_n_tokens, jump.new_token_ids))
        if self._text.matched_stop is not None:
            self._finish("stop", matched=self._text.matched_stop)
        elif self._guide.is_finished():
            self._finish("stop")

    def _record_logprob(self, token: int, out: Any) -> None:
        if self._logprobs is None:
            return
        top: tuple[TopLogprob, ...] = ()
        n = self.params.top_logprobs_num
        if n and out.top_token_ids is not None:
            ids = out.top_token_ids[0, :n].tolist()
            lps = out.top_logprobs[0, :n].tolist()
            top = tuple(TopLogprob(i, self._token_text(i), lp) for i, lp in zip(ids, lps))
        self._logprobs.append(TokenLogprob(token, self._token_text(token), float(out.logprobs[0]), top))

    def finish_length(self, message: str | None = None) -> None:
        """The engine ran out of room (context full): end with finish_reason "length"."""
        if not self.done:
            self._finish("length", message=message)

    def _finish(self, reason: FinishReason, *, matched: str | int | None = None, message: str | None = None) -> None:
        self.done = True
        self.finish_reason = reason
        self.matched_stop = matched
        self.message = message
        self._emit(self._text.finish())

    def _emit(self, piece: str) -> None:
        if piece and self._stream is not None:
            self._stream(piece)

    def result(self, *, prompt_tokens: int, cached_tokens: int) -> GenerateResult:
        assert self.done, "result before the request finished"
        return GenerateResult(
            text=self._text.text,
            token_ids=tuple(self.output_ids),
            finish_reason=self.finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(self.output_ids),
            cached_tokens=cached_tokens,
            matched_stop=self.matched_stop,
            logprobs=tuple(self._logprobs) if self._logprobs is not None else None,
            message=self.message,
        )
