"""API speculative execution (SGLang, §5): fewer calls to an endpoint backend.

With `@lp.function(num_api_spec_tokens=N)` on a backend whose `api_speculation` is set, a gen
asks the endpoint for N tokens more than its `max_tokens` and keeps the surplus: constant text
the program appends next must match it, and a following gen is cut from it instead of calling
the endpoint again; a mismatch drops it. Only plain gens take part, and speculative calls are
not streamed. Design: docs/design/frontend.md.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmprog.core.errors import BackendError
from lmprog.core.protocol import Backend, GenerateRequest, GenerateResult
from lmprog.core.sampling import SamplingParams

if TYPE_CHECKING:
    from lmprog.core.images import ImageInput
    from lmprog.fsm import Constraint

# Sampling fields that must be equal for a surplus to serve a gen (it was sampled with them).
_KEY_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos")


def sampling_key(params: SamplingParams) -> tuple[Any, ...]:
    return tuple(getattr(params, f) for f in _KEY_FIELDS)


def eligible(params: SamplingParams, constraint: Constraint | None) -> bool:
    """Whether a gen with these parameters may speculate or be served from a surplus."""
    return (
        constraint is None
        and not params.return_logprob
        and not params.stop_token_ids
        and params.min_tokens == 0
        and params.frequency_penalty == 0
        and params.presence_penalty == 0
        and params.repetition_penalty == 1
    )


@dataclass(frozen=True)
class Surplus:
    """The output of one speculative call and how far the program has consumed it.

    `ends[i]` is where token i ends in `text` (strictly increasing); `complete` means the
    generation ended by itself (end of sequence), so nothing follows `text`.
    """

    text: str
    ends: tuple[int, ...]
    complete: bool
    key: tuple[Any, ...]
    pos: int = 0

    def __post_init__(self) -> None:
        assert all(a < b for a, b in zip(self.ends, self.ends[1:])), "token ends must increase"
        assert not self.ends or self.ends[-1] == len(self.text), "tokens must cover the text"
        assert 0 <= self.pos <= len(self.text)

    @classmethod
    def from_result(cls, result: GenerateResult, key: tuple[Any, ...]) -> Surplus | None:
        """The surplus of a call made with `return_logprob`; None without token logprobs.

        Token strings are laid end to end over the text; where they stop agreeing with it
        (a character split over tokens, say) the surplus is cut there. A last token with no
        text of its own in a finished output is the end-of-sequence token.
        """
        if result.logprobs is None:
            return None
        ends: list[int] = []
        at = 0
        for i, lp in enumerate(result.logprobs):
            token = lp.token
            if token and result.text.startswith(token, at):
                at += len(token)
                ends.append(at)
                continue
            last = i == len(result.logprobs) - 1
            if last and at == len(result.text) and result.finish_reason == "stop":
                return cls(result.text, tuple(ends), True, key)  # the EOS token's own text
            return cls(result.text[:at], tuple(ends), False, key)
        complete = result.finish_reason == "stop" and at == len(result.text)
        return cls(result.text[:at], tuple(ends), complete, key)

    def after_text(self, piece: str) -> Surplus | None:
        """The surplus after the program appended `piece`, or None if it does not match."""
        if self.text.startswith(piece, self.pos):
            return dataclasses.replace(self, pos=self.pos + len(piece))
        return None

    def serve(self, params: SamplingParams) -> tuple[GenerateResult, Surplus] | None:
        """A gen's result cut from the surplus, and the surplus after it; None when the
        surplus cannot tell what a real call would return (not at a token boundary, or
        ending before the gen would)."""
        first = bisect.bisect_right(self.ends, self.pos)  # the first token after pos
        if self.pos != 0 and (first == 0 or self.ends[first - 1] != self.pos):
            return None
        left = len(self.ends) - first
        hit = _first_stop(self.text, self.pos, params.stop)
        if hit is not None:
            end, start, stop = hit
            used = bisect.bisect_left(self.ends, end) - first + 1
            if used <= params.max_tokens:
                return self._cut(start, used, "stop", stop)
        if left >= params.max_tokens:
            end = self.ends[first + params.max_tokens - 1] if params.max_tokens else self.pos
            return self._cut(end, params.max_tokens, "length", None)
        if self.complete:
            return self._cut(len(self.text), left, "stop", None)
        return None

    def _cut(
        self, end: int, tokens: int, finish: str, stop: str | None
    ) -> tuple[GenerateResult, Surplus]:
        result = GenerateResult(
            text=self.text[self.pos : end],
            token_ids=(),
            finish_reason=finish,  # type: ignore[arg-type]
            prompt_tokens=0,
            completion_tokens=tokens,
            matched_stop=stop,
        )
        return result, dataclasses.replace(self, pos=end)


def _first_stop(text: str, pos: int, stops: tuple[str, ...]) -> tuple[int, int, str] | None:
    """(end, start, stop) of the stop occurrence after `pos` that completes first (then
    starts first): the one a token-by-token check would see first (as `decoding.detok` does)."""
    best: tuple[int, int, str] | None = None
    for stop in stops:
        at = text.find(stop, pos)
        if at >= 0 and (best is None or (at + len(stop), at) < best[:2]):
            best = (at + len(stop), at, stop)
    return best


class ApiSpeculator:
    """One state's API speculation: the surplus of its last speculative call, if any.

    Not thread-safe: only the state's worker calls it. The executor reports every piece
    of constant text (`on_text`) and drops the surplus at anything it cannot match
    (`drop`: selects, joins).
    """

    def __init__(self, backend: Backend, num_tokens: int) -> None:
        assert num_tokens >= 1 and backend.api_speculation is not None
        self._backend = backend
        self._num_tokens = num_tokens
        self._surplus: Surplus | None = None

    def on_text(self, piece: str) -> None:
        if self._surplus is not None and piece:
            self._surplus = self._surplus.after_text(piece)

    def drop(self) -> None:
        self._surplus = None

    def gen(
        self,
        text: str,
        message_start: int | None,
        params: SamplingParams,
        constraint: Constraint | None,
        images: Callable[[str], tuple[ImageInput, ...]] = lambda _: (),
    ) -> GenerateResult | None:
        """The gen's result from speculation (calling the backend at most once), or None:
        the caller then makes an ordinary call. `message_start`: where the open role
        message's content begins in `text`, if one is open; `images`: the images of a
        prompt (a prefix of `text`)."""
        if not eligible(params, constraint):
            self._surplus = None
            return None
        key = sampling_key(params)
        if self._surplus is not None and self._surplus.key == key:
            served = self._surplus.serve(params)
            if served is not None:
                result, self._surplus = served
                return result
        return self._call(text, message_start, params, key, images)

    def _call(
        self,
        text: str,
        message_start: int | None,
        params: SamplingParams,
        key: tuple[Any, ...],
        images: Callable[[str], tuple[ImageInput, ...]],
    ) -> GenerateResult | None:
        anchor = len(text)
        if message_start is not None and self._backend.api_speculation == "message":
            anchor = message_start  # a chat API cannot continue a partly written message
        spec = dataclasses.replace(
            params,
            max_tokens=params.max_tokens + self._num_tokens,
            stop=(),
            return_logprob=True,
            top_logprobs_num=0,
        )
        prompt = text[:anchor]
        called = self._backend.generate(GenerateRequest(prompt, spec, images=images(prompt)))
        surplus = Surplus.from_result(called, key)
        if surplus is None:
            raise BackendError(
                f"num_api_spec_tokens needs token logprobs from the endpoint, and "
                f"{type(self._backend).__name__} returned none; drop num_api_spec_tokens for it"
            )
        self._surplus = surplus.after_text(text[anchor:])
        served = self._surplus.serve(params) if self._surplus is not None else None
        if served is None:
            self._surplus = None
            return None
        result, self._surplus = served
        return dataclasses.replace(
            result, prompt_tokens=called.prompt_tokens, cached_tokens=called.cached_tokens
        )
