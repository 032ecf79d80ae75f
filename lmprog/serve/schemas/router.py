"""Request fields that SGLang's router (`sglang-router`) adds to the bodies it forwards.

Accepted at the values lmprog always has, refused at any other with a 400 naming the field.
Own base class: completions.py imports this module. Design:
docs/design/server.md#behind-a-router-the-worker-role.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


def _only(value: Any, allowed: tuple[Any, ...], what: str) -> Any:
    if value not in allowed:
        raise ValueError(f"lmprog {what}")
    return value


class RouterFields(_Strict):
    """What sglang-router adds to each /generate body it forwards (SGLang's
    GenerateReqInput): `model` (null, or the client's; checked like the OpenAI routes'),
    flags at their defaults."""

    model: str | None = None
    log_metrics: bool | None = None  # accepted: the access log and /metrics count every request
    no_logs: bool | None = None  # accepted: lmprog logs no request content
    return_hidden_states: bool | None = None
    return_entropy: bool | None = None
    return_bytes: bool | None = None
    background: bool | None = None
    data_parallel_rank: int | None = None  # --dp-aware routers: lmprog reports dp_size 1

    @field_validator("return_hidden_states", "return_entropy", "return_bytes", "background")
    @classmethod
    def _off(cls, v: bool | None, info: Any) -> bool | None:
        return _only(v, (None, False), f"does not support {info.field_name}; leave it false")

    @field_validator("data_parallel_rank")
    @classmethod
    def _rank(cls, v: int | None) -> int | None:
        return _only(
            v,
            (None, 0),
            "serves as one data-parallel rank (its --dp replicas are routed inside it); "
            "only rank 0 exists",
        )


class OpenAIRouterFields(_Strict):
    """SGLang's extensions of the OpenAI bodies that sglang-router sends on every chat and
    completion request, accepted at lmprog's behaviour."""

    no_stop_trim: bool | None = None  # the stop string is trimmed
    skip_special_tokens: bool | None = None  # special tokens are left out of the text
    return_hidden_states: bool | None = None

    @field_validator("no_stop_trim", "return_hidden_states")
    @classmethod
    def _off(cls, v: bool | None, info: Any) -> bool | None:
        return _only(v, (None, False), f"does not support {info.field_name}; leave it false")

    @field_validator("skip_special_tokens")
    @classmethod
    def _on(cls, v: bool | None) -> bool | None:
        return _only(v, (None, True), "always skips special tokens in the text")


class ChatRouterFields(OpenAIRouterFields):
    """OpenAIRouterFields plus the chat-only ones."""

    continue_final_message: bool | None = None
    stream_reasoning: bool | None = None  # reasoning is streamed as it comes

    @field_validator("continue_final_message")
    @classmethod
    def _no_continue(cls, v: bool | None) -> bool | None:
        return _only(v, (None, False), "does not support continue_final_message; leave it false")

    @field_validator("stream_reasoning")
    @classmethod
    def _streamed(cls, v: bool | None) -> bool | None:
        return _only(v, (None, True), "always streams reasoning as it is generated")
