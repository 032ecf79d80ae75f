"""What goes into the engine and what comes back: EngineRequest, RequestHandle.

    handle = engine.submit(EngineRequest(prompt_ids, params))   # any thread
    for piece in handle.pieces(): ...                           # text as it becomes final
    result = handle.result()                                    # EngineResult, or raises

The engine thread only puts events into a handle; the caller's thread takes them out, so
stream callbacks never run on the engine thread. Design: docs/design/engine-step.md.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from lmprog.core.sampling import SamplingParams
from lmprog.decoding.result import EngineResult

from ..images import keyed_ids


@dataclass(frozen=True)
class EngineRequest:
    """One generation: token ids in, tokens out.

    guide: a fresh `lmprog.fsm.guide.Guide` (its index already built) when the output is
        constrained; the engine owns it from submission on.
    prompt_logprob_start: when set, the logprobs of prompt tokens prompt_ids[s + 1:] are
        returned (`EngineResult.prompt_logprobs`), each computed from the logits at the
        position before it; positions >= s are recomputed even when cached.
    lora: the name of the LoRA adapter to run under (None: the base model); a name the
        engine has not loaded fails the request with a LoraError.
    images: for a vision-language model, the prompt's images (runtime.images.ImageRun, in
        order): prompt_ids holds the image token at each of their positions (the engine
        keys them by image for the radix cache).
    """

    prompt_ids: tuple[int, ...]
    params: SamplingParams = SamplingParams()
    guide: Any = None
    prompt_logprob_start: int | None = None
    lora: str | None = None
    images: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(self.params).__name__}")
        if not self.prompt_ids:
            raise ValueError("prompt_ids must hold at least one token id")
        if self.lora is not None and not isinstance(self.lora, str):
            raise TypeError(f"lora must be an adapter name (str) or None, got {self.lora!r}")
        s = self.prompt_logprob_start
        if self.images and s is not None:
            raise ValueError("prompt logprobs are not computed for a prompt with images")
        if s is not None and not 0 <= s < len(self.prompt_ids):
            raise ValueError(
                f"prompt_logprob_start must be in [0, {len(self.prompt_ids)}), got {s}"
            )

    @property
    def cache_ids(self) -> Sequence[int]:
        """The prompt as the radix cache and the data-parallel router match it: each image
        position holds its image's key (runtime.images.keyed_ids), so the same text before
        another image is another prefix."""
        return keyed_ids(self.prompt_ids, self.images) if self.images else self.prompt_ids


_PIECE, _DONE, _ERROR = 0, 1, 2


class RequestHandle:
    """The caller's end of one submitted request. `pieces()`/`result()` are for one consumer
    thread; `abort()` is safe from any thread, at any time.

    Timestamps (time.perf_counter()): `submitted_at`; once the request ended, `first_token_at`
    (its first output token was sampled; None without output) and `finished_at` (the outcome
    was put). Benchmarks read TTFT and time per output token from them without waking a
    thread per token."""

    def __init__(
        self, rid: Hashable, abort: Callable[[Hashable], None], stream: bool = True
    ) -> None:
        self.rid = rid
        self.stream = stream  # False: pieces are dropped at once (no wake-up per token)
        self._abort = abort
        self._events: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._outcome: tuple[int, Any] | None = None
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None  # set by the engine at completion
        self.finished_at: float | None = None

    # -- engine side -----------------------------------------------------------------------
    def put_piece(self, text: str) -> None:
        if self.stream:
            self._events.put((_PIECE, text))

    def put_result(self, result: EngineResult) -> None:
        self.finished_at = time.perf_counter()
        self._events.put((_DONE, result))

    def put_error(self, error: BaseException) -> None:
        self.finished_at = time.perf_counter()
        self._events.put((_ERROR, error))

    # -- caller side -----------------------------------------------------------------------
    def pieces(self) -> Iterator[str]:
        """Yield text pieces until the request ends (then `result()` returns at once)."""
        while self._outcome is None:
            kind, value = self._events.get()
            if kind == _PIECE:
                yield value
            else:
                self._outcome = (kind, value)

    def result(self, timeout: float | None = None) -> EngineResult:
        """Block until the request ends; return its result or raise its error. Pieces not
        consumed are dropped (they are all in `result().text`). TimeoutError on timeout."""
        while self._outcome is None:
            try:
                kind, value = self._events.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"request {self.rid!r} did not finish in {timeout} s") from None
            if kind != _PIECE:
                self._outcome = (kind, value)
        kind, value = self._outcome
        if kind == _ERROR:
            raise value
        return value

    @property
    def done(self) -> bool:
        """True once the outcome was taken (by pieces() or result())."""
        return self._outcome is not None

    def abort(self) -> None:
        """Ask the engine to stop this request (finish_reason "abort"); no-op once finished."""
        self._abort(self.rid)

    def __repr__(self) -> str:
        return f"RequestHandle(rid={self.rid!r}, done={self.done})"
