"""lmprog requests to OpenAI API fields, and API responses back to lmprog results.

Pure functions over the `openai` client's response objects (read by attribute, so any
object of the same shape works); no network here.

    SamplingParams ──request_fields──► keyword arguments + extra_body (non-OpenAI fields)
    Constraint ─────constraint_fields► response_format json_schema, or a server's regex field
    response(s) ────ReplyBuilder─────► GenerateResult
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lmprog.core.errors import BackendError, ContextLengthError, LmprogError
from lmprog.core.protocol import FinishReason, GenerateResult, TokenLogprob, TopLogprob
from lmprog.core.sampling import SamplingParams

_FINISH: dict[str | None, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "stop",
    "function_call": "stop",
    "content_filter": "abort",
    "abort": "abort",
    "error": "error",
    None: "stop",
}
NO_TOKEN_ID = -1  # endpoints name tokens by their text; TokenLogprob.token_id is unknown


def request_fields(params: SamplingParams, *, chat: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(standard OpenAI keyword arguments, extra body fields) for one generation.

    Fields OpenAI lacks (top_k, min_p, min_tokens, ignore_eos, repetition_penalty,
    stop_token_ids, SGLang's stop_regex) go in the
    extra body only when set, under the names vLLM, SGLang and lmprog's server share; a
    server that does not know them answers with an error.
    """
    kwargs: dict[str, Any] = {"max_tokens": params.max_tokens, "temperature": params.temperature}
    if params.top_p != 1.0:
        kwargs["top_p"] = params.top_p
    if params.stop:
        kwargs["stop"] = list(params.stop)
    if params.seed is not None:
        kwargs["seed"] = params.seed
    if params.frequency_penalty:
        kwargs["frequency_penalty"] = params.frequency_penalty
    if params.presence_penalty:
        kwargs["presence_penalty"] = params.presence_penalty
    if params.return_logprob:
        if chat:
            kwargs.update(logprobs=True, top_logprobs=params.top_logprobs_num)
        else:
            kwargs["logprobs"] = params.top_logprobs_num
    extra: dict[str, Any] = {}
    for name, value, unset in (
        ("top_k", params.top_k, -1),
        ("min_p", params.min_p, 0.0),
        ("min_tokens", params.min_tokens, 0),
        ("ignore_eos", params.ignore_eos, False),
        ("repetition_penalty", params.repetition_penalty, 1.0),
    ):
        if value != unset:
            extra[name] = value
    if params.stop_token_ids:
        extra["stop_token_ids"] = list(params.stop_token_ids)
    if params.stop_regex:
        extra["stop_regex"] = list(params.stop_regex)
    return kwargs, extra


def constraint_fields(constraint: Any, regex_field: str | None) -> dict[str, Any]:
    """Body fields that ask the server for output matching `constraint` (None: none).

    A JSON-schema constraint becomes `response_format` json_schema (OpenAI's structured
    output), `strict` as the constraint was built (`Constraint.from_json_schema(strict=)`:
    true, the default, asks for no keys the schema does not list; false for the spec's open
    objects, which OpenAI's strict mode refuses). A regex, choices or dtype constraint has no
    OpenAI field: it goes in `regex_field` if the server has one (vLLM: "guided_regex",
    SGLang: "regex"), else raises BackendError before any call.
    """
    if constraint is None:
        return {}
    if constraint.kind == "json_schema":
        schema = json.loads(constraint.source)
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "output",
                    "schema": schema,
                    "strict": constraint.strict is not False,
                },
            }
        }
    if constraint.kind == "ebnf":
        raise BackendError(
            "an OpenAI-compatible endpoint has no standard field for an ebnf grammar: run it on "
            "lp.Runtime or lp.LlamaCpp (or lp.RuntimeEndpoint, whose SGLang protocol has one)"
        )
    if regex_field is None:
        raise BackendError(
            f"an OpenAI-compatible endpoint has no standard field for a {constraint.kind} constraint "
            "(only response_format json_schema): use gen(json_schema=...), or pass "
            "OpenAI(regex_field=...) naming the server's regex field ('guided_regex' on vLLM, "
            "'regex' on SGLang)"
        )
    return {regex_field: constraint.pattern}


def mismatch_message(constraint: Any, text: str, finish: FinishReason) -> str | None:
    """Why a result does not satisfy its constraint, for GenerateResult.message (None: it does)."""
    if constraint is None or constraint.matches(text):
        return None
    if finish == "length":
        return "generation stopped at max_tokens before the output was complete"
    return (
        f"the endpoint's output does not match the {constraint.kind} constraint; the server may "
        "not enforce response_format"
    )


@dataclass
class ReplyBuilder:
    """Collects one choice of a response, whole or streamed chunk by chunk."""

    chat: bool
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish: str | None = None
    matched_stop: str | int | None = None
    usage: Any = None

    def add_choice(self, choice: Any) -> str:
        """Fold in one choice (or chunk choice); returns its new text."""
        piece = _choice_text(choice, self.chat) or ""
        self.text.append(piece)
        tokens = (
            _chat_logprobs(choice.logprobs) if self.chat else _completion_logprobs(choice.logprobs)
        )
        if tokens is not None:
            self.logprobs = (self.logprobs or []) + tokens
        if choice.finish_reason is not None:
            self.finish = choice.finish_reason
            self.matched_stop = _matched_stop(choice)
        return piece

    def result(self, constraint: Any) -> GenerateResult:
        text = "".join(self.text)
        finish = _FINISH.get(self.finish, "stop")
        prompt, completion, cached = _usage(self.usage)
        if completion == 0 and self.logprobs:
            completion = len(self.logprobs)
        return GenerateResult(
            text=text,
            token_ids=(),
            finish_reason=finish,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            matched_stop=self.matched_stop,
            logprobs=tuple(self.logprobs) if self.logprobs is not None else None,
            message=mismatch_message(constraint, text, finish),
        )


def _choice_text(choice: Any, chat: bool) -> str | None:
    if not chat:
        return choice.text
    message = getattr(choice, "delta", None) or getattr(choice, "message", None)
    return getattr(message, "content", None)


def _completion_logprobs(lp: Any) -> list[TokenLogprob] | None:
    if lp is None or lp.tokens is None:
        return None
    tops = lp.top_logprobs or [None] * len(lp.tokens)
    out = []
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs or [None] * len(lp.tokens), tops):
        alts = tuple(TopLogprob(NO_TOKEN_ID, t, float(v)) for t, v in (top or {}).items())
        out.append(TokenLogprob(NO_TOKEN_ID, token, _float(logprob), alts))
    return out


def _chat_logprobs(lp: Any) -> list[TokenLogprob] | None:
    if lp is None or lp.content is None:
        return None
    return [
        TokenLogprob(
            NO_TOKEN_ID,
            t.token,
            _float(t.logprob),
            tuple(
                TopLogprob(NO_TOKEN_ID, a.token, float(a.logprob)) for a in (t.top_logprobs or ())
            ),
        )
        for t in lp.content
    ]


def _float(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _matched_stop(choice: Any) -> str | int | None:
    """The stop that ended the choice, where the server says (vLLM: stop_reason; SGLang,
    lmprog: matched_stop); OpenAI itself does not."""
    extra = getattr(choice, "model_extra", None) or {}
    for name in ("matched_stop", "stop_reason"):
        value = extra.get(name)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return value
    return None


def _usage(usage: Any) -> tuple[int, int, int]:
    if usage is None:
        return 0, 0, 0
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) or 0
    return usage.prompt_tokens or 0, usage.completion_tokens or 0, cached


def endpoint_error(exc: Exception, where: str) -> LmprogError:
    """The lmprog error for an `openai` client exception, carrying the server's message."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        message, code = _server_message(exc)
        text = f"{where} answered HTTP {exc.status_code}: {message}"
        if code == "context_length_exceeded":
            return ContextLengthError(text)
        return BackendError(text)
    if isinstance(exc, openai.APITimeoutError):
        return BackendError(f"{where} did not answer in time (raise OpenAI(timeout=...)): {exc}")
    if isinstance(exc, openai.APIConnectionError):
        return BackendError(f"cannot reach {where}: {exc}; is the server running?")
    return BackendError(f"{where}: {exc}")


def _server_message(exc: Any) -> tuple[str, str | None]:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"]), error.get("code")
        if isinstance(error, str):
            return error, None
    return str(exc.message), None
