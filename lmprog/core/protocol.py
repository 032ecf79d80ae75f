"""The backend protocol: plain request/response objects and the `Backend` ABC.

Backends never see interpreter types. The interpreter turns `gen` / `select` nodes into
these requests; the llama.cpp backend, the in-process runtime and (later) endpoint backends
answer them.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from lmprog.core.sampling import SamplingParams

if TYPE_CHECKING:
    from lmprog.core.chat import ChatTemplate

FinishReason = Literal["stop", "length", "abort", "error"]
# How an endpoint backend takes part in API speculative execution (see Backend.api_speculation).
ApiSpeculation = Literal["text", "message"]

# Called with each new piece of generated text, in order, as soon as it is final
# (stop-string prefixes are held back until they are resolved).
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


@dataclass(frozen=True)
class GenerateRequest:
    """Continue `prompt` (text, or token ids) under `params`.

    `constraint` is an `lmprog.fsm.Constraint` (or None): the output text must match it
    exactly. Typed as Any so this module imports nothing from fsm.
    """

    prompt: str | tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    constraint: Any = None


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

    def meta_info(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
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
    """

    prompt: str
    choices: tuple[str, ...]
    unconditional: bool = False


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


class Backend(abc.ABC):
    """What the interpreter needs from a model.

    Contract:
    - Every method is thread-safe: the interpreter calls from many threads at once, and a
      backend that cannot run requests concurrently serialises them itself.
    - Invalid requests raise (TypeError/ValueError/ConstraintError/ContextLengthError/
      BackendError) from the call that received them; the backend stays usable afterwards.
    - Output at temperature 0 is deterministic for a given prompt.
    """

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

    def shutdown(self) -> None:
        """Release resources. Idempotent."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
