"""The /v1/chat/completions request body: messages, tools, tool_choice (pydantic models)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from .completions import SamplingFields, Strict
from .router import ChatRouterFields


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Strict):
    """One message; `content` is a string or a list of content parts (only text parts are
    supported, checked when the prompt is rendered)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = None  # an earlier answer's thinking, for the template

    @model_validator(mode="after")
    def _fields_fit_the_role(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.content is None and not (
            self.role == "assistant" and (self.tool_calls or self.refusal)
        ):
            raise ValueError(f"a {self.role} message needs content")
        return self


class FunctionDefinition(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields, ChatRouterFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # false: at most one call per choice
    store: bool | None = None  # accepted, ignored: nothing is stored
    metadata: dict[str, str] | None = None  # accepted, ignored
    service_tier: str | None = None  # accepted, ignored
    prompt_cache_key: str | None = None  # accepted, ignored (the radix cache needs no key)
    safety_identifier: str | None = None  # accepted, ignored
    # OpenAI fields this server does not implement
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    # reasoning models: passed to the chat template (see reasoning.py)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's and SGLang's
    separate_reasoning: bool | None = None  # SGLang's: false keeps the thinking in content
    thinking_budget: int | None = None  # SGLang's: thinking tokens before </think> is forced
    verbosity: str | None = None
    web_search_options: Any = None

    UNSUPPORTED = (
        "functions",
        "function_call",
        "audio",
        "prediction",
        "verbosity",
        "web_search_options",
    )

    def unsupported_fields(self) -> list[str]:
        names = super().unsupported_fields()
        if self.modalities is not None and self.modalities != ["text"]:
            names.append("modalities")
        return names
