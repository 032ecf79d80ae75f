"""The /v1/responses request body (OpenAI's Responses API) as pydantic models.

`input` is a string or a list of message, function_call and function_call_output items;
errors name the Responses field (`input[2].arguments`).
Design: docs/design/server.md#request-bodies-json-within-limits.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails

from .completions import Strict

Status = Literal["in_progress", "completed", "incomplete"]
Content = str | list[dict[str, Any]]


class MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Content
    id: str | None = None
    status: Status | None = None
    phase: Literal["commentary", "final_answer"] | None = None  # accepted, ignored


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: Status | None = None


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: Content
    id: str | None = None
    name: str | None = None
    status: Status | None = None


class ReasoningItem(Strict):
    """A reasoning model's thinking, as a response's output gives it (sent back as input,
    it is the next assistant turn's reasoning_content for the template)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None  # none is written here; one sent back is ignored
    status: Status | None = None

    def text(self) -> str:
        parts = self.content or self.summary
        return "".join(p["text"] for p in parts if isinstance(p.get("text"), str))


class ReasoningConfig(Strict):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # accepted: no summaries
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # older name


ITEM_TYPES = {
    "message": MessageItem,
    "reasoning": ReasoningItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
}


def _item_type(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("type", "message" if "role" in value else None)
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(
        _item_type,
        custom_error_type="invalid_item",
        custom_error_message="an input item is a message (role and content), a function_call, "
        "a function_call_output or a reasoning item; other item types are not supported",
    ),
]


def _as_items(value: Any) -> Any:
    return [{"role": "user", "content": value}] if isinstance(value, str) else value


class FunctionTool(Strict):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceFunction(Strict):
    type: Literal["function"]
    name: str


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, max_length=64)
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> TextFormat:
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise ValueError("a json_schema format needs name and schema")
        if self.type != "json_schema" and (self.name is not None or self.schema_ is not None):
            raise ValueError(f"a {self.type} format takes no name or schema")
        return self


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesStreamOptions(Strict):
    include_obfuscation: bool | None = None  # accepted, ignored (nothing to obfuscate locally)


Includable = Literal[
    "message.output_text.logprobs",  # the only one that applies here; the others are no-ops
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
]

# The chat endpoint's sampling extensions (SGLang's names), passed on to it as they are: the
# chat request type checks them, under the same names.
EXTENSIONS = (
    "seed",
    "top_k",
    "min_p",
    "min_tokens",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "thinking_budget",
    "chat_template_kwargs",
)


class ResponsesRequest(Strict):
    model: str
    input: Annotated[list[InputItem], BeforeValidator(_as_items)] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    include: list[Includable] | None = None
    stream: bool | None = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool | None = True
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: ReasoningConfig | None = None  # effort: the template's reasoning_effort
    metadata: dict[str, str] | None = None  # echoed in the response
    user: str | None = None  # accepted, ignored
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None  # the radix cache needs no key
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    service_tier: str | None = None
    # OpenAI fields this server does not implement
    background: bool | None = None
    background_options: Any = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: int | None = None
    context_management: Any = None
    moderation: Any = None
    image: Any = None
    access_programs: Any = None
    # extensions (checked by the chat request they are passed to)
    seed: Any = None
    top_k: Any = None
    min_p: Any = None
    min_tokens: Any = None
    repetition_penalty: Any = None
    frequency_penalty: Any = None
    presence_penalty: Any = None
    stop: Any = None
    stop_token_ids: Any = None
    ignore_eos: Any = None
    thinking_budget: Any = None  # a reasoning model's (SGLang's name)
    chat_template_kwargs: Any = None  # vLLM's and SGLang's

    UNSUPPORTED: ClassVar[tuple[str, ...]] = (
        "background",
        "background_options",
        "conversation",
        "prompt",
        "max_tool_calls",
        "context_management",
        "moderation",
        "image",
        "access_programs",
    )

    def unsupported_fields(self) -> list[str]:
        names = [name for name in self.UNSUPPORTED if getattr(self, name) not in (None, False)]
        if self.truncation == "auto":
            names.append("truncation")
        if self.text is not None and self.text.verbosity is not None:
            names.append("text.verbosity")
        return names

    @model_validator(mode="wrap")
    @classmethod
    def _name_items_fields(cls, data: Any, handler: Any) -> ResponsesRequest:
        """Errors inside an input item name its field (`input[0].arguments`), not the union
        branch it was tried as (`input[0].function_call.arguments`)."""
        try:
            return handler(data)
        except ValidationError as exc:
            errors = [_untagged(e) for e in exc.errors()]
            raise ValidationError.from_exception_data(exc.title, errors) from None


def _untagged(error: Any) -> InitErrorDetails:
    loc = error["loc"]
    if len(loc) > 2 and loc[0] == "input" and isinstance(loc[1], int) and loc[2] in ITEM_TYPES:
        loc = loc[:2] + loc[3:]
    details: dict[str, Any] = {"type": error["type"], "loc": loc, "input": error["input"]}
    if "ctx" in error:
        details["ctx"] = error["ctx"]
    if error["type"] == "invalid_item":  # a custom error type: its message travels with it
        from pydantic_core import PydanticCustomError

        details["type"] = PydanticCustomError("invalid_item", error["msg"])
    return InitErrorDetails(**details)  # type: ignore[typeddict-item]
