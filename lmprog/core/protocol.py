"""The backend protocol: plain request/response objects and the `Backend` ABC.

Backends never see interpreter types. The interpreter turns `gen` / `select` nodes into
these requests; the llama.cpp backend, the in-process runtime and (later) endpoint backends
answer them.
"""

from __future__ import annotations

import abc
import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from lmprog.core.errors import BackendError
from lmprog.core.sampling import SamplingParams

if TYPE_CHECKING:
    from lmprog.core.chat import ChatTemplate
    from lmprog.core.images import ImageInput

FinishReason = Literal["stop", "length", "abort", "error"]
# How an endpoint backend takes part in API speculative execution (see Backend.api_speculation).
ApiSpeculation = Literal["text", "message"]

# Called with each new piece of generated text, in order, as soon as it is final
# (stop-string prefixes are held back until they are resolved). Backends that know how far
# generation is pass a StreamPiece (a str), which the program's streams show as meta data.
StreamCallback = Callable[[str], None]


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    token: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """Logprob of one chosen token, plus the `top_logprobs_num` most likely alternatives."""

    token_id: int
    token: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


class StreamPiece(str):
    """A streamed text piece that also says how far generation was when it was emitted:
    `completion_tokens` so far, and (when the request asked for logprobs) the `logprobs` of
    the tokens since the previous piece. It is a str, so any stream consumer takes it as one.
    """

    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] | None
    logprobs_length: int  # logprobs sent so far, this piece's included

    def __new__(
        cls,
        text: str,
        completion_tokens: int,
        logprobs: tuple[TokenLogprob, ...] | None = None,
        logprobs_length: int = 0,
    ) -> StreamPiece:
        piece = super().__new__(cls, text)
        piece.completion_tokens = completion_tokens
        piece.logprobs = logprobs
        piece.logprobs_length = logprobs_length
        return piece

    def meta_info(self) -> dict[str, Any]:
        """SGLang's streamed meta info of this piece (`text_async_iter(return_meta_data=True)`):
        completion_tokens so far; with logprobs, this piece's `output_token_logprobs` and
        `output_token_logprobs_length`, the count so far."""
        meta: dict[str, Any] = {"completion_tokens": self.completion_tokens}
        if self.logprobs is not None:
            meta["output_token_logprobs"] = list(self.logprobs)
            meta["output_token_logprobs_length"] = self.logprobs_length
        return meta


@dataclass(frozen=True)
class GenerateRequest:
    """Continue `prompt` (text, or token ids) under `params`.

    `constraint` is an `lmprog.fsm.Constraint` (or None): the output text must match it
    exactly. Typed as Any so this module imports nothing from fsm.
    `images`: for a vision-language model, one per occurrence of the backend's `image_token`
    in `prompt`, in order (a backend with no `image_token` refuses any).
    """

    prompt: str | tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    constraint: Any = None
    images: tuple[ImageInput, ...] = ()


@dataclass(frozen=True)
class GenerateResult:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    matched_stop: str | int | None = None  # the stop string or token id that ended it
    logprobs: tuple[TokenLogprob, ...] | None = None
    # Set when finish_reason == "length" inside a constraint: the text is an unfinished match.
    message: str | None = None

    def finish_info(self) -> dict[str, Any]:
        """The finish reason as SGLang's meta info has it: {"type": "stop", "matched": the
        stop string, token id or stop_regex (None at a finished constraint)}, {"type":
        "length", "length": completion tokens}, {"type": "abort", "message": why}."""
        if self.finish_reason == "length":
            return {"type": "length", "length": self.completion_tokens}
        if self.finish_reason in ("abort", "error"):
            return {"type": "abort", "message": self.message or self.finish_reason}
        return {"type": "stop", "matched": self.matched_stop}

    def meta_info(self) -> dict[str, Any]:
        """SGLang's meta info of a gen: token counts, `finish_reason` (`finish_info`), and
        lmprog's `matched_stop`, `output_token_logprobs` and `message`."""
        meta: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_info(),
            "matched_stop": self.matched_stop,
        }
        if self.logprobs is not None:
            meta["output_token_logprobs"] = list(self.logprobs)
        if self.message:
            meta["message"] = self.message
        return meta


@dataclass(frozen=True)
class ScoreRequest:
    """Score each choice as a continuation of `prompt` (used by `select`).

    The backend tokenizes `prompt + choice` as one text and scores every token from the
    first one that differs from the tokenization of `prompt` alone (token healing), so a
    choice that merges with the end of the prompt is not penalised. With `unconditional`,
    each choice is also scored with no context (for unconditional-likelihood normalisation).
    `images`: one per `Backend.image_token` in `prompt`, in order (GenerateRequest's rule).
    """

    prompt: str
    choices: tuple[str, ...]
    unconditional: bool = False
    lora_path: str | None = None  # the LoRA adapter to score under (SamplingParams.lora_path)
    images: tuple[ImageInput, ...] = ()  # as GenerateRequest.images, for `prompt`


@dataclass(frozen=True)
class ChoiceScore:
    token_logprobs: tuple[float, ...]
    token_ids: tuple[int, ...]
    unconditional_token_logprobs: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ScoreResult:
    choices: tuple[ChoiceScore, ...]
    prompt_tokens: int
    cached_tokens: int = 0


class TokenUsage:
    """Tokens a backend's calls have used so far (SGLang's `backend.token_usage`).

        backend.token_usage.prompt_tokens, backend.token_usage.completion_tokens
        backend.token_usage.reset()

    prompt_tokens counts every token a call read: a generate call's prompt (cached
    prefix tokens included, as endpoints report them) and a score call's prompt plus the
    tokens of every choice it scored; completion_tokens counts generated tokens.
    Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prompt = 0
        self._completion = 0

    @property
    def prompt_tokens(self) -> int:
        return self._prompt

    @property
    def completion_tokens(self) -> int:
        return self._completion

    @property
    def total_tokens(self) -> int:
        with self._lock:
            return self._prompt + self._completion

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            self._prompt += prompt_tokens
            self._completion += completion_tokens

    def add_result(self, result: object) -> None:
        """Count what one backend call returned (a result or a list of results)."""
        if isinstance(result, GenerateResult):
            self.add(result.prompt_tokens, result.completion_tokens)
        elif isinstance(result, ScoreResult):
            scored = sum(
                len(c.token_ids) + len(c.unconditional_token_logprobs or ()) for c in result.choices
            )
            self.add(result.prompt_tokens + scored, 0)
        elif isinstance(result, (list, tuple)):
            for item in result:
                self.add_result(item)

    def reset(self) -> None:
        with self._lock:
            self._prompt = self._completion = 0

    def __repr__(self) -> str:
        with self._lock:
            return f"TokenUsage(prompt_tokens={self._prompt}, completion_tokens={self._completion})"


# Backends whose metered call is in progress on this thread: a backend's generate that calls
# another of its own metered methods (a subclass calling super().generate) is counted once.
_metering = threading.local()


def _metered(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Backend, *args: Any, **kwargs: Any) -> Any:
        active: set[int] = _metering.__dict__.setdefault("active", set())
        if id(self) in active:
            return method(self, *args, **kwargs)
        active.add(id(self))
        try:
            result = method(self, *args, **kwargs)
        finally:
            active.discard(id(self))
        self.token_usage.add_result(result)
        return result

    wrapper._lmprog_metered = True  # type: ignore[attr-defined]
    return wrapper


class Backend(abc.ABC):
    """What the interpreter needs from a model.

    Every backend counts the tokens its `generate` and `score` calls use in
    `token_usage` (a subclass's methods are wrapped when the class is defined).

    Contract:
    - Every method is thread-safe: the interpreter calls from many threads at once, and a
      backend that cannot run requests concurrently serialises them itself.
    - Invalid requests raise (TypeError/ValueError/ConstraintError/ContextLengthError/
      BackendError) from the call that received them; the backend stays usable afterwards.
    - Output at temperature 0 is deterministic for a given prompt.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("generate", "score"):
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "_lmprog_metered", False):
                setattr(cls, name, _metered(method))

    @property
    def token_usage(self) -> TokenUsage:
        """Tokens used by this backend's calls so far; `.reset()` starts again from zero."""
        usage: TokenUsage | None = self.__dict__.get("_token_usage")
        if usage is None:
            usage = self.__dict__.setdefault("_token_usage", TokenUsage())
        return usage

    @abc.abstractmethod
    def generate(
        self, request: GenerateRequest, stream: StreamCallback | None = None
    ) -> GenerateResult:
        """Generate one continuation; `stream` receives the text pieces as they are final."""

    @abc.abstractmethod
    def score(self, request: ScoreRequest) -> ScoreResult:
        """Token logprobs of each choice given the prompt (one pass sharing the prefix)."""

    def cache_prefix(self, prompt: str) -> None:
        """Compute and keep the KV of `prompt` so later requests sharing it start there.

        Called before fanning out forks and batches. Always safe to ignore.
        """

    @property
    @abc.abstractmethod
    def chat_template(self) -> ChatTemplate:
        """How role messages are rendered for this backend's model."""

    @property
    @abc.abstractmethod
    def tokenizer(self) -> Any:
        """A Hugging Face tokenizer for the model (encode/decode/vocab)."""

    @property
    def image_token(self) -> str | None:
        """The text that stands for one image in a prompt (a request's `images` fill them in
        order); None (the default): the model takes no images."""
        return None

    @property
    def api_speculation(self) -> ApiSpeculation | None:
        """Whether (and how) programs with `num_api_spec_tokens` speculate over calls here.

        None (the default): never; a backend with a prefix cache gains nothing from it.
        "text": an endpoint that continues any text; a speculative call starts at the
        current text. "message": an endpoint that cannot continue a partly written role
        message (a chat API); a speculative call starts where the open message began, and
        the message's text so far is matched against the output like later constant text.
        """
        return None

    def stats(self) -> dict[str, Any]:
        """Backend metrics (cache hits, tokens/s, ...); empty if the backend keeps none."""
        return {}

    def prompt_logprobs(
        self, prompt_ids: Sequence[int], start: int, top_logprobs_num: int = 0
    ) -> tuple[TokenLogprob, ...]:
        """The logprob of each prompt token from position `start` (>= 1: the first token has
        none) to the end under the model, with its `top_logprobs_num` most likely
        alternatives: SGLang's input_token_logprobs (`lmprog serve`'s /generate with
        logprob_start_len). BackendError here: this backend gives none."""
        raise BackendError(f"the {type(self).__name__} backend gives no prompt logprobs")

    def flush_cache(self) -> bool:
        """Empty the backend's prefix cache (SGLang's `flush_cache`); True once emptied,
        False when nothing was (requests are running, or the backend keeps no cache it can
        empty, as here)."""
        return False

    def get_server_info(self) -> dict[str, Any]:
        """What serves the model (SGLang's `get_server_info`): `model_path` and
        `tokenizer_path` (the model's name or path), `backend` (the class), `version`
        (lmprog's) and `stats`."""
        from importlib.metadata import PackageNotFoundError, version  # lazy: ~20 ms of imports

        name = getattr(self, "model_name", None) or ""
        try:
            lmprog_version = version("lmprog")
        except PackageNotFoundError:
            lmprog_version = "unknown"
        return {
            "model_path": name,
            "tokenizer_path": name,
            "backend": type(self).__name__,
            "version": lmprog_version,
            "stats": self.stats(),
        }

    def shutdown(self) -> None:
        """Release resources. Idempotent."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
