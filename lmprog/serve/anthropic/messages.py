"""/v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) over the
chat-completions pipeline.

    Messages request ──to_chat──► ChatCompletionRequest ──start_chat_completion──► choices
    Message object / its events ◄──MessagesReply── the chat reply's body / chunks

Errors come in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`. How each
field maps: docs/design/server.md#anthropics-messages-api.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from ..context import ServeContext
from ..errors import APIError, validation_error
from ..openai.chat_completions import prepare_prompt, start_chat_completion
from ..respond import respond
from ..schemas.chat import ChatCompletionRequest
from ..schemas.messages import CountTokensRequest, MessagesRequest, ToolParam
from .messages_output import MessagesReply, prompt_tokens


async def create_message(ctx: ServeContext, body: MessagesRequest, request: Request) -> Response:
    ctx.check_model(body.model)
    chat, origin = to_chat(body)
    try:
        group, chat_reply = await start_chat_completion(ctx, chat, request)
        reply = MessagesReply(ctx, body, chat_reply, group)
        return await respond(request, group, reply, stream=bool(body.stream), param="messages")
    except APIError as exc:
        raise renamed(exc, origin) from None


async def count_tokens(ctx: ServeContext, body: CountTokensRequest, request: Request) -> Response:
    """{"input_tokens": N}: the tokens of the prompt `body` renders to (its tools included)."""
    ctx.check_model(body.model)
    chat, origin = to_chat(MessagesRequest.model_construct(**dict(body), max_tokens=1))
    try:
        prompt = await ctx.blocking(prepare_prompt, ctx, chat)
        tokens = await ctx.blocking(prompt_tokens, ctx, prompt)
    except APIError as exc:
        raise renamed(exc, origin) from None
    return JSONResponse({"input_tokens": tokens})


# -- the request: Messages -> chat -----------------------------------------------------------
def to_chat(body: MessagesRequest) -> tuple[ChatCompletionRequest, list[int]]:
    """The chat request doing `body`'s work, and for each chat message the index of the
    Messages message it came from (-1: the system prompt), for errors."""
    messages: list[dict[str, Any]] = []
    origin: list[int] = []
    system = _system(body.system)
    if system:
        messages.append({"role": "system", "content": system})
        origin.append(-1)
    for i, message in enumerate(body.messages):
        for m in _chat_messages(message.role, message.content, i):
            messages.append(m)
            origin.append(i)
    chat: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "max_completion_tokens": body.max_tokens,
        "stop": body.stop_sequences,
        "stream": bool(body.stream),
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "seed": body.seed,
        "min_p": body.min_p,
        "repetition_penalty": body.repetition_penalty,
    }
    if body.stream:
        chat["stream_options"] = {"include_usage": True}
    if body.tools:
        chat["tools"] = [_chat_tool(t, i) for i, t in enumerate(body.tools)]
    _tool_choice(chat, body)
    _thinking(chat, body)
    chat = {k: v for k, v in chat.items() if v is not None}
    try:
        return ChatCompletionRequest.model_validate(chat), origin
    except ValidationError as exc:
        raise renamed(validation_error(exc.errors()), origin) from None


def _system(system: str | list[dict[str, Any]] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return "".join(_text_block(b, f"system.{j}") for j, b in enumerate(system))


def _text_block(block: dict[str, Any], param: str) -> str:
    if block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise _bad_block(block, param, "a text block")
    return block["text"]


def _bad_block(block: Any, param: str, wanted: str) -> APIError:
    kind = block.get("type") if isinstance(block, dict) else type(block).__name__
    return APIError(
        400,
        f"{param}.type: expected {wanted}, got {kind!r} (this server takes text, image, "
        "tool_use, tool_result and thinking blocks; documents are not supported)",
        param=f"{param}.type",
        code="unsupported_content",
    )


def _chat_messages(role: str, content: str | list[dict[str, Any]], i: int) -> list[dict]:
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "user":
        return _user_blocks(content, i)
    return [_assistant_blocks(content, i)]


def _user_blocks(blocks: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []  # the user message's text and image parts, in order
    for j, block in enumerate(blocks):
        param = f"messages.{i}.content.{j}"
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise APIError(400, f"{param}.tool_use_id: required", param=f"{param}.tool_use_id")
            result = _tool_result(block.get("content", ""), param)
            if block.get("is_error"):
                result = f"Error: {result}"
            tools.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        elif isinstance(block, dict) and block.get("type") == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, param)}})
        else:
            if not isinstance(block, dict):
                raise _bad_block(block, param, "a content block")
            parts.append({"type": "text", "text": _text_block(block, param)})
    out = tools
    if any(p["type"] == "image_url" for p in parts):
        out.append({"role": "user", "content": parts})
    elif parts or not tools:
        out.append({"role": "user", "content": "".join(p["text"] for p in parts)})
    return out


def _image_url(block: dict[str, Any], param: str) -> str:
    """An image block's source as a URL: base64 data as a data URL; a url source as it is
    (fetched only where the server allows image URLs)."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not media.startswith("image/"):
            raise APIError(
                400,
                f"{param}.source.media_type: an image type (image/png, image/jpeg, ...)",
                param=f"{param}.source.media_type",
            )
        if not isinstance(data, str) or not data:
            raise APIError(
                400, f"{param}.source.data: base64 image data", param=f"{param}.source.data"
            )
        return f"data:{media};base64,{data}"
    if kind == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise APIError(
        400,
        f'{param}.source: an image source is {{"type": "base64", "media_type", '
        f'"data"}} or {{"type": "url", "url"}}',
        param=f"{param}.source",
    )


def _tool_result(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{param}.content: a string or text blocks", param=f"{param}.content")
    return "".join(_text_block(b, f"{param}.content.{k}") for k, b in enumerate(content))


def _assistant_blocks(blocks: list[dict[str, Any]], i: int) -> dict[str, Any]:
    text, calls, thinking = [], [], []
    for j, block in enumerate(blocks):
        param = f"messages.{i}.content.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            if not isinstance(block.get("input"), dict) or not isinstance(block.get("name"), str):
                raise APIError(
                    400, f"{param}: a tool_use block has a name and an input object", param=param
                )
            call_id = block.get("id") if isinstance(block.get("id"), str) else f"toolu_{i}_{j}"
            arguments = json.dumps(block["input"], ensure_ascii=False)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": block["name"], "arguments": arguments},
                }
            )
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # nothing readable to give the template
        else:
            if not isinstance(block, dict):
                raise _bad_block(block, param, "a content block")
            text.append(_text_block(block, param))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
        message["content"] = message["content"] or None
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    return message


def _chat_tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise APIError(
            400,
            f"tools.{i}.type: {kind!r} is a server tool, which this server does not run; give "
            "custom tools (name, description, input_schema)",
            param=f"tools.{i}.type",
            code="unsupported_parameter",
        )
    try:
        t = ToolParam.model_validate(tool)
    except ValidationError as exc:
        err = validation_error(exc.errors())
        param = f"tools.{i}.{err.param}" if err.param else f"tools.{i}"
        raise APIError(400, f"{param}: {exc.errors()[0]['msg']}", param=param) from None
    function: dict[str, Any] = {"name": t.name, "parameters": t.input_schema}
    if t.description is not None:
        function["description"] = t.description
    if t.strict is not None:
        function["strict"] = t.strict
    return {"type": "function", "function": function}


def _tool_choice(chat: dict[str, Any], body: MessagesRequest) -> None:
    choice = body.tool_choice
    if choice is None:
        return
    if choice.disable_parallel_tool_use:
        chat["parallel_tool_calls"] = False
    if choice.type == "tool":
        if not choice.name:
            raise APIError(
                400, "tool_choice.name: required with type 'tool'", param="tool_choice.name"
            )
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif body.tools:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    elif choice.type == "any":
        raise APIError(400, "tool_choice: type 'any' needs tools", param="tool_choice")


def _thinking(chat: dict[str, Any], body: MessagesRequest) -> None:
    thinking = body.thinking
    if thinking is None:
        return
    if thinking.type == "disabled":
        chat["chat_template_kwargs"] = {"enable_thinking": False}
        return
    budget = thinking.budget_tokens
    if budget is None:
        raise APIError(
            400,
            "thinking.budget_tokens: required with type 'enabled'",
            param="thinking.budget_tokens",
        )
    if budget >= body.max_tokens:
        raise APIError(
            400,
            f"thinking.budget_tokens: {budget} must be less than max_tokens ({body.max_tokens})",
            param="thinking.budget_tokens",
        )
    chat["chat_template_kwargs"] = {"enable_thinking": True}
    chat["thinking_budget"] = budget


_RENAMED = (  # chat request fields -> the Messages fields they came from
    (re.compile(r"max_(completion_)?tokens\b"), "max_tokens"),
    (re.compile(r"stop\b"), "stop_sequences"),
    (re.compile(r"tools\[(\d+)\]\.function\.parameters\b"), r"tools.\1.input_schema"),
    (re.compile(r"tools\[(\d+)\]\.function\b"), r"tools.\1"),
    (re.compile(r"thinking_budget\b"), "thinking.budget_tokens"),
    (re.compile(r"chat_template_kwargs\b.*"), "thinking"),
    (re.compile(r"tool_choice\b"), "tool_choice"),
    (re.compile(r"(temperature|top_p|top_k|seed|min_p|repetition_penalty)\b"), r"\1"),
)


def renamed(exc: APIError, origin: list[int]) -> APIError:
    """`exc` naming the Messages field where the chat pipeline named its own."""
    if exc.param is None:
        return exc
    param = exc.param
    m = re.match(r"messages\[(\d+)\]", param)
    if m:
        k = int(m.group(1))
        i = origin[k] if k < len(origin) else k
        param = ("system" if i < 0 else f"messages.{i}") + param[m.end() :]
    else:
        for pattern, name in _RENAMED:
            match = pattern.match(param)
            if match:
                param = match.expand(name) + param[match.end() :]
                break
    param = re.sub(r"\[(\d+)\]", r".\1", param)
    message = exc.message
    if message.startswith(exc.param):
        message = param + message[len(exc.param) :]
    return APIError(exc.status, message, param=param, code=exc.code, type=exc.type)
