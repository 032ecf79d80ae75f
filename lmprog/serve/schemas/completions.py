"""Request bodies of the OpenAI API as pydantic models (the fields this server knows).

Every model forbids unknown fields and types every known field strictly ("5" is not an
integer); unsupported OpenAI fields are declared and refused by `unsupported_fields`.
Extensions follow SGLang's and vLLM's: docs/design/server.md#request-bodies-json-within-limits.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .router import OpenAIRouterFields

MAX_SEED = 2**63 - 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


class StreamOptions(Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # accepted, ignored (nothing to obfuscate locally)


class JsonSchemaFormat(Strict):
    name: str = Field(max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError(
                "response_format.json_schema is required with type 'json_schema' "
                "and allowed only with it"
            )
        return self


class SamplingFields(Strict):
    """What both endpoints share."""

    model: str
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    n: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    user: str | None = None
    response_format: ResponseFormat | None = None
    # extensions (SGLang's names)
    top_k: int | None = Field(default=None, ge=-1, le=2**31 - 1)  # beyond any vocabulary
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    min_tokens: int | None = Field(default=None, ge=0)
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    # constraints (at most one per request, response_format included: constraints.py)
    regex: str | None = None  # SGLang's
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None
    guided_json: str | dict[str, Any] | None = None  # vLLM's
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None  # with a JSON constraint only

    # Fields of the OpenAI API this server does not implement: rejected when set.
    UNSUPPORTED: ClassVar[tuple[str, ...]] = ()

    def unsupported_fields(self) -> list[str]:
        """The set fields this server cannot honour (logit_bias when non-empty, ...)."""
        names = [name for name in self.UNSUPPORTED if getattr(self, name) not in (None, False, "")]
        if self.logit_bias:
            names.append("logit_bias")
        return names


Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(SamplingFields, OpenAIRouterFields):
    prompt: Prompt
    best_of: int | None = Field(default=None, ge=1)
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0)
    suffix: str | None = None

    UNSUPPORTED = ("suffix",)
