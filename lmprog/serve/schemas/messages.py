"""The /v1/messages request body (Anthropic's Messages API) as pydantic models.

Content blocks stay dicts here: anthropic/messages.py checks them by their `type`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .completions import Strict


class MessageParam(Strict):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class ToolParam(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None  # accepted, ignored (the radix cache needs none)
    strict: bool | None = None


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Strict):
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = Field(default=None, ge=0)


class Metadata(Strict):
    user_id: str | None = None


class MessagesRequest(Strict):
    model: str
    messages: list[MessageParam] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    tools: list[dict[str, Any]] | None = None  # ToolParam, or a server tool (refused by name)
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    metadata: Metadata | None = None  # accepted, ignored
    service_tier: str | None = None  # accepted, ignored
    # lmprog's extensions, as on the OpenAI routes
    seed: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None


class CountTokensRequest(Strict):
    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
