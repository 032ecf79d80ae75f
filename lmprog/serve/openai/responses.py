"""/v1/responses (OpenAI's Responses API): another request and response shape over the
chat-completions pipeline.

    Responses request ──to_chat──► ChatCompletionRequest ──start_chat_completion──► choices
    Response object / its events ◄──ResponseOutput── the chat reply's body / chunks

`previous_response_id` continues a stored conversation (`ResponseStore`, a bounded in-memory
LRU). Design: docs/design/server.md#the-responses-api.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError

from .. import jsonbody
from ..context import ServeContext
from ..errors import APIError, validation_error
from ..respond import respond
from ..sampling import check_supported
from ..schemas.chat import ChatCompletionRequest
from ..schemas.responses import (
    EXTENSIONS,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
)
from .chat_completions import start_chat_completion
from .responses_output import ResponseReply

MAX_STORED_RESPONSES = 1024
Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class ResponseStore:
    """Stored responses of one server, least recently used evicted beyond `capacity`: each
    response's body and its conversation (the items a follow-up continues). Event loop only.
    A stored conversation was rendered into one prompt that fit the model's context, so an
    entry's size is bounded by the context, and the store's by `capacity` contexts."""

    def __init__(self, capacity: int = MAX_STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, tuple[dict[str, Any], tuple[Item, ...]]] = OrderedDict()

    def put(self, body: dict[str, Any], conversation: tuple[Item, ...]) -> None:
        self._entries[body["id"]] = (body, conversation)
        self._entries.move_to_end(body["id"])
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> tuple[dict[str, Any], tuple[Item, ...]]:
        """(body, conversation); a 404 for an id this server does not hold."""
        entry = self._entries.get(response_id)
        if entry is None:
            raise _not_found(response_id, 404, param="response_id")
        self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> None:
        if self._entries.pop(response_id, None) is None:
            raise _not_found(response_id, 404, param="response_id")


def _not_found(response_id: str, status: int, param: str) -> APIError:
    return APIError(
        status,
        f"no response with id {response_id[:100]!r} is stored on this server (responses are "
        f"kept in memory while it runs, the last {MAX_STORED_RESPONSES}, when made with store)",
        param=param,
        code="previous_response_not_found" if param == "previous_response_id" else "not_found",
    )


async def create_response(
    ctx: ServeContext, store: ResponseStore, body: ResponsesRequest, request: Request
) -> Response:
    ctx.check_model(body.model)
    check_supported(body)
    history: tuple[Item, ...] = ()
    if body.previous_response_id is not None:
        try:
            history = store.get(body.previous_response_id)[1]
        except APIError:
            raise _not_found(body.previous_response_id, 400, "previous_response_id") from None
    if not history and not body.input:
        raise APIError(400, "input must not be empty", param="input")
    try:
        chat = to_chat(body, history, ctx)
        group, chat_reply = await start_chat_completion(ctx, chat, request)
        conversation = history + tuple(body.input)

        def keep(response: dict[str, Any], output: list[dict[str, Any]]) -> None:
            if body.store is not False:
                store.put(response, conversation + tuple(_as_input(i) for i in output))

        reply = ResponseReply(ctx, body, chat_reply, keep)
        return await respond(request, group, reply, stream=bool(body.stream), param="input")
    except APIError as exc:
        raise _renamed(exc) from None


# -- the request: Responses -> chat ------------------------------------------------------------
def to_chat(
    body: ResponsesRequest, history: tuple[Item, ...], ctx: ServeContext
) -> ChatCompletionRequest:
    """The chat request that does `body`'s work after `history` (a stored conversation)."""
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    for item in history:
        _add_item(messages, item, None, ctx)
    for i, item in enumerate(body.input):
        _add_item(messages, item, i, ctx)
    messages = _with_reasoning(messages)
    chat: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "stream": bool(body.stream),
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "parallel_tool_calls": body.parallel_tool_calls,
        **{name: getattr(body, name) for name in EXTENSIONS},
    }
    if body.stream:
        chat["stream_options"] = {"include_usage": True}
    if body.reasoning is not None and body.reasoning.effort is not None:
        chat["reasoning_effort"] = body.reasoning.effort
    if body.tools:
        chat["tools"] = [_chat_tool(t.model_dump(exclude_none=True)) for t in body.tools]
    if body.tool_choice is not None and (body.tools or body.tool_choice not in ("auto", "none")):
        choice = body.tool_choice
        chat["tool_choice"] = (
            choice
            if isinstance(choice, str)
            else {"type": "function", "function": {"name": choice.name}}
        )
    fmt = body.text.format if body.text else None
    if fmt is not None and fmt.type != "text":
        chat["response_format"] = _response_format(fmt.model_dump(by_alias=True, exclude_none=True))
    if body.top_logprobs is not None or "message.output_text.logprobs" in (body.include or ()):
        chat["logprobs"] = True
        chat["top_logprobs"] = body.top_logprobs or 0
    chat = {k: v for k, v in chat.items() if v is not None}
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def _response_format(fmt: dict[str, Any]) -> dict[str, Any]:
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = {k: v for k, v in fmt.items() if k != "type"}
    return {"type": "json_schema", "json_schema": schema}


def _add_item(messages: list[dict[str, Any]], item: Item, index: int | None, ctx: Any) -> None:
    """Append `item` (input[index], or a stored one when None) to the chat messages."""
    param = f"input[{index}]" if index is not None else "previous_response_id"
    if isinstance(item, ReasoningItem):  # joins the assistant turn that follows it
        messages.append({"role": _REASONING, "content": item.text()})
    elif isinstance(item, MessageItem):
        if item.role == "user" and _has_images(item.content):
            messages.append({"role": "user", "content": _parts(item.content, param, ctx)})
        else:
            messages.append({"role": item.role, "content": _text(item.content, param, ctx)})
    elif isinstance(item, FunctionCallItem):
        if index is not None:  # the chat pipeline parses it too; this names the item
            jsonbody.loads(
                item.arguments,
                max_depth=ctx.limits.max_json_depth,
                what="function_call arguments",
                param=f"{param}.arguments",
            )
        call = {
            "id": item.call_id,
            "type": "function",
            "function": {"name": item.name, "arguments": item.arguments},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":  # text and calls: one message
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    else:
        text = _text(item.output, param + ".output" if index is not None else param, ctx)
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": text})


_REASONING = "\x00reasoning"  # a reasoning item's place among the messages, until merged


def _with_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reasoning items as the reasoning_content of the assistant message after them (as
    the model's chat template renders a turn's thinking); one with none after it is dropped."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for m in messages:
        if m["role"] == _REASONING:
            pending.append(m["content"])
            continue
        if m["role"] == "assistant" and pending:
            m = {**m, "reasoning_content": "".join(pending)}
            pending = []
        elif m["role"] != "assistant":
            pending = []
        out.append(m)
    return out


_TEXT_PARTS = {
    "input_text": {"type", "text", "prompt_cache_breakpoint"},
    "output_text": {"type", "text", "annotations", "logprobs"},
    "refusal": {"type", "refusal"},
}


def _text(content: str | list[dict[str, Any]], param: str, ctx: Any) -> str:
    """A message's text: its text parts joined (an assistant's refusal is what it said)."""
    if isinstance(content, str):
        return content
    return "".join(_part_text(part, f"{param}.content[{j}]", ctx) for j, part in enumerate(content))


def _part_text(part: dict[str, Any], param: str, ctx: Any) -> str:
    kind = part.get("type")
    key = "refusal" if kind == "refusal" else "text"
    if kind not in _TEXT_PARTS or not isinstance(part.get(key), str):
        raise APIError(
            400,
            f"only text content parts (input_text, output_text; input_image on a vision "
            f"model) are supported, got {kind!r}",
            param=param,
            code="unsupported_content",
        )
    for extra in sorted(set(part) - _TEXT_PARTS[kind]):
        if ctx.limits.strict_requests:
            name = f"{param}.{extra}"
            raise APIError(
                400,
                f"Unrecognized request argument supplied: {name}",
                param=name,
                code="unknown_parameter",
            )
        ctx.unknown_fields.warn(f"input[].content[].{extra}")
    return str(part[key])


def _has_images(content: str | list[dict[str, Any]]) -> bool:
    return isinstance(content, list) and any(p.get("type") == "input_image" for p in content)


def _parts(content: list[dict[str, Any]], param: str, ctx: Any) -> list[dict[str, Any]]:
    """A user message with images as chat content parts (`input_image` -> `image_url`); a
    model without vision: 400 naming the first image part."""
    vision = getattr(getattr(ctx, "backend", None), "image_token", None) is not None
    out: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        where = f"{param}.content[{j}]"
        if part.get("type") != "input_image":
            out.append({"type": "text", "text": _part_text(part, where, ctx)})
            continue
        if not vision:
            raise APIError(
                400,
                f"{where}: the model takes no images (it is not a vision-language model)",
                param=where,
                code="unsupported_content",
            )
        if not isinstance(part.get("image_url"), str):
            raise APIError(
                400,
                f"{where}: an input_image needs image_url (a data URL; file_id is not served)",
                param=f"{where}.image_url",
                code="unsupported_content",
            )
        out.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
    return out


_RENAMED = (  # chat request fields -> the Responses fields they came from
    (re.compile(r"messages\b.*"), "input"),
    (re.compile(r"response_format\.json_schema\.(schema|name)\b"), r"text.format.\1"),
    (re.compile(r"response_format\b.*"), "text.format"),
    (re.compile(r"max_(completion_)?tokens\b"), "max_output_tokens"),
    (re.compile(r"(tools\[\d+\])\.function\b"), r"\1"),
    (re.compile(r"(top_)?logprobs\b"), "top_logprobs"),
)


def _renamed(exc: APIError) -> APIError:
    """`exc` naming the Responses field where the chat pipeline named its own."""
    if exc.param is None:
        return exc
    for pattern, name in _RENAMED:
        match = pattern.match(exc.param)
        if match:
            param = match.expand(name) + exc.param[match.end() :]
            message = exc.message
            if message.startswith(exc.param):
                message = param + message[len(exc.param) :]
            return APIError(exc.status, message, param=param, code=exc.code, type=exc.type)
    return exc


def _as_input(item: dict[str, Any]) -> Item:
    """An output item as the input item a follow-up sends back."""
    if item["type"] == "message":
        return MessageItem.model_validate(item)
    if item["type"] == "reasoning":
        return ReasoningItem.model_validate(item)
    return FunctionCallItem.model_validate(item)
