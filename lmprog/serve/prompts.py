"""Chat messages -> the prompt text, through the model's own chat template.

    prompt = render_chat(template, messages, tools_prompt, max_json_depth=64, tools=tools)

Messages are normalised for the template first: text parts, and for a vision-language
model `image_url` parts (the image token goes where the template puts an image; audio and
file parts are refused). Design: docs/design/server.md#chat-completions-the-chat-pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jinja2

from lmprog.core.chat import RESERVED_VARIABLES, ChatTemplate
from lmprog.core.prompt import mark_special, unmark

from . import jsonbody
from .errors import APIError
from .schemas.chat import ChatMessage, Tool, ToolCall
from .tools.formats import GENERIC, ToolFormat


def render_chat(
    template: ChatTemplate,
    messages: Sequence[ChatMessage],
    tools_prompt: str | None,
    *,
    max_json_depth: int,
    tools: Sequence[Tool] | None = None,
    tokenizer: Any = None,
    tool_format: ToolFormat = GENERIC,
    variables: dict[str, Any] | None = None,
    add_generation_prompt: bool = True,
    image_token: str | None = None,
) -> str:
    """`max_json_depth`: the deepest nesting of a tool call's arguments; `tools`: passed to the
    template as transformers does; with `tokenizer`, a `Prompt` whose special tokens are control
    tokens only where the template wrote them; `image_token`: the model's (None: image parts
    are a 400). Every argument: docs/design/server.md."""
    plain = [_plain(m, i, max_json_depth, tool_format, image_token) for i, m in enumerate(messages)]
    if tool_format.results_as_user:
        plain = _results_as_user(plain)
    if tools_prompt:
        if plain[0]["role"] == "system":
            plain[0] = {"role": "system", "content": f"{plain[0]['content']}\n\n{tools_prompt}"}
        else:
            plain.insert(0, {"role": "system", "content": tools_prompt})
    tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
    options = dict(variables or {}, add_generation_prompt=add_generation_prompt, tools=tool_dicts)
    images = sum(_image_count(m) for m in plain)
    if not images:
        return _render(template, plain, tokenizer, options)
    assert image_token is not None  # _plain refused image parts without one
    # The template's own image items first (HF vision templates take {"type": "image"}),
    # else the image token where each image part was, in the content as a string.
    try:
        typed: str | None = _render(template, plain, tokenizer, options)
    except Exception:  # noqa: BLE001 - a template that cannot take list content (str + list)
        typed = None
    if typed is not None and typed.count(image_token) == images:
        return typed
    flat = [_flattened(m) for m in plain]
    rendered = _render(template, flat, tokenizer, options, (_IMAGE, image_token))
    found = rendered.count(image_token)
    if found != images:
        raise APIError(
            400,
            f"the prompt holds the model's image token {image_token!r} {found} times for "
            f"{images} images: message text must not hold that token text",
            param="messages",
        )
    return rendered


# Stands for an image part in a message rendered as a string (a private-use character,
# taken out of message text first); replaced by the image token after the render.
_IMAGE = "\U000f0002"


def _render(
    template: ChatTemplate,
    plain: list[dict[str, Any]],
    tokenizer: Any,
    options: dict[str, Any],
    replace: tuple[str, str] | None = None,
) -> str:
    try:
        if tokenizer is None:
            rendered = template.render(plain, **options)
            return rendered.replace(*replace) if replace else rendered
        marked, tool_dicts = mark_special([plain, options["tools"]], tokenizer)
        rendered = template.render(marked, **{**options, "tools": tool_dicts})
        return unmark(rendered.replace(*replace) if replace else rendered)
    except jinja2.TemplateError as exc:
        raise APIError(
            400, f"the model's chat template rejects these messages: {exc}", param="messages"
        ) from None


def _image_count(message: dict[str, Any]) -> int:
    content = message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(1 for item in content if item.get("type") == "image")


def _flattened(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    text = "".join(item["text"] if item["type"] == "text" else _IMAGE for item in content)
    return {**message, "content": text}


def template_kwargs(
    kwargs: dict[str, Any] | None, reasoning_effort: str | None = None
) -> dict[str, Any]:
    """The template variables of a request: its `chat_template_kwargs` (as vLLM and SGLang
    pass them: `enable_thinking`, `thinking`, ...) and its `reasoning_effort` (which gpt-oss's
    template reads); a 400 naming a key the server sets itself."""
    out = dict(kwargs or {})
    for key in out:
        if key in RESERVED_VARIABLES or not key.isidentifier():
            raise APIError(
                400,
                f"chat_template_kwargs cannot set {key!r} (the server sets messages, tools, "
                "documents and add_generation_prompt; keys are identifiers)",
                param=f"chat_template_kwargs.{key}",
            )
    if reasoning_effort is not None:
        out.setdefault("reasoning_effort", reasoning_effort)
    return out


def _plain(
    message: ChatMessage,
    index: int,
    max_json_depth: int,
    fmt: ToolFormat,
    image_token: str | None = None,
) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    if image_parts(message.content) and message.role == "user":
        if image_token is None:
            raise APIError(
                400,
                "the model takes no images (it is not a vision-language model)",
                param=f"messages[{index}].content[{image_parts(message.content)[0]}]",
                code="unsupported_content",
            )
        return {"role": role, "content": _items(message.content, index)}
    text = _text(message.content, index)
    out: dict[str, Any] = {"role": role, "content": text}
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    if message.reasoning_content is not None:  # templates read it (Qwen3) or `thinking`
        out["reasoning_content"] = message.reasoning_content
    if not message.tool_calls:
        return out
    calls = [(c, _arguments(c, index, max_json_depth)) for c in message.tool_calls]
    if fmt.native:
        # DeepSeek's template reads the content of a turn with calls: "" rather than none
        # (and gpt-oss's tests the content's text: "" too)
        keep = message.content is not None or fmt.arguments_text or fmt.family == "harmony"
        out["content"] = text if keep else None
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.function.name,
                    "arguments": c.function.arguments if fmt.arguments_text else args,
                },
            }
            for c, args in calls
        ]
        return out
    written = fmt.calls_text([(c.function.name, args) for c, args in calls])
    out["content"] = f"{text}\n{written}" if text else written
    return out


def _results_as_user(plain: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool results as user turns in a tool_output block (Gemma's convention; its template
    knows only user and model turns), a run of user turns joined into one so the turns
    still alternate."""
    out: list[dict[str, Any]] = []
    for m in plain:
        if m["role"] == "tool":
            m = {"role": "user", "content": f"```tool_output\n{m['content']}\n```"}
        if out and m["role"] == "user" and out[-1]["role"] == "user":
            out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n\n{m['content']}"}
        else:
            out.append(m)
    return out


def _text(content: str | list[dict[str, Any]] | None, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for j, part in enumerate(content):
        if not _is_text(part):
            raise APIError(
                400,
                f"only text content parts are supported here, got {part.get('type')!r}"
                + (" (images go in user messages)" if part.get("type") == "image_url" else ""),
                param=f"messages[{index}].content[{j}]",
                code="unsupported_content",
            )
        parts.append(part["text"])
    return "".join(parts)


def _is_text(part: dict[str, Any]) -> bool:
    return part.get("type") == "text" and isinstance(part.get("text"), str) and len(part) == 2


def image_parts(content: Any) -> list[int]:
    """The indices of a message content's `image_url` parts."""
    if not isinstance(content, list):
        return []
    return [j for j, part in enumerate(content) if part.get("type") == "image_url"]


def _items(content: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """A user message's text and image parts as a vision template's content items."""
    items: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if part.get("type") == "image_url":
            items.append({"type": "image"})
        elif _is_text(part):
            items.append({"type": "text", "text": part["text"].replace(_IMAGE, "")})
        else:
            raise APIError(
                400,
                f"content parts are text or image_url, got {part.get('type')!r}",
                param=f"messages[{index}].content[{j}]",
                code="unsupported_content",
            )
    return items


def _arguments(call: ToolCall, index: int, max_json_depth: int) -> Any:
    param = f"messages[{index}].tool_calls"
    try:
        arguments = jsonbody.loads(
            call.function.arguments,
            max_depth=max_json_depth,
            what="tool call arguments",
            param=param,
        )
    except APIError as exc:
        if exc.code != "invalid_json":  # too deep, too long an integer
            raise
        raise APIError(
            400,
            f"tool call arguments must be JSON text, got {call.function.arguments[:60]!r}",
            param=param,
        ) from None
    return arguments
