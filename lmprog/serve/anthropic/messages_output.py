"""The Message object of /v1/messages and its streamed events, written from the chat reply's
message.

messages.py converts the request; this, what comes back: a chat message becomes `thinking`,
`text` and `tool_use` content blocks; streamed, Anthropic's events (message_start ...
message_stop). The events and stop reasons: docs/design/server.md#anthropics-messages-api.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from lmprog.core.protocol import GenerateResult

from ..context import ServeContext
from ..generations import Generations
from ..respond import payloads, sse
from ..schemas.messages import MessagesRequest

SIGNATURE = ""  # thinking blocks carry no signature: nothing here checks one


class MessagesReply:
    """What runs.respond needs of a reply (`ctx`, `response_body`, `stream`)."""

    def __init__(
        self, ctx: ServeContext, body: MessagesRequest, chat: Any, group: Generations
    ) -> None:
        self.ctx, self.body, self.chat, self.group = ctx, body, chat, group
        self.id = f"msg_{uuid.uuid4().hex[:24]}"

    def _message(self, content: list[dict[str, Any]], stop: tuple[Any, Any], usage: Any) -> dict:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.ctx.model_name,
            "content": content,
            "stop_reason": stop[0],
            "stop_sequence": stop[1],
            "usage": usage,
        }

    def response_body(self, results: list[GenerateResult]) -> dict[str, Any]:
        chat = self.chat.response_body(results)
        choice = chat["choices"][0]
        message, content = choice["message"], []
        if message.get("reasoning_content"):
            content.append(
                {
                    "type": "thinking",
                    "thinking": message["reasoning_content"],
                    "signature": SIGNATURE,
                }
            )
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or ():
            content.append(
                _tool_use(call["id"], call["function"]["name"], call["function"]["arguments"])
            )
        stop = self._stop(choice["finish_reason"], results[0])
        return self._message(content, stop, _usage(chat["usage"]))

    def _stop(self, reason: str | None, result: GenerateResult | None) -> tuple[str, str | None]:
        if reason == "tool_calls":
            return "tool_use", None
        if reason == "length":
            return "max_tokens", None
        matched = result.matched_stop if result is not None else None
        if isinstance(matched, str) and matched in (self.body.stop_sequences or ()):
            return "stop_sequence", matched
        return "end_turn", None

    async def stream(self, group: Generations) -> AsyncIterator[bytes]:
        # the prompt's tokens are known before the first one is generated, as Anthropic's are
        n_prompt = await self.ctx.blocking(prompt_tokens, self.ctx, self.group.prompt)
        usage0 = {"input_tokens": n_prompt, "output_tokens": 0}
        yield _event({"type": "message_start", "message": self._message([], (None, None), usage0)})
        blocks, reason, usage = _Blocks(), None, None
        async for chunk in self.chat.stream(group):
            for data in payloads(chunk):
                if "error" in data:
                    error = data["error"]
                    kind = (
                        "invalid_request_error"
                        if error.get("type") == "invalid_request_error"
                        else "api_error"
                    )
                    yield _event(
                        {"type": "error", "error": {"type": kind, "message": error["message"]}}
                    )
                    return
                if data.get("usage") is not None:
                    usage = data["usage"]
                for c in data.get("choices", ()):
                    reason = c.get("finish_reason") or reason
                    for payload in blocks.delta(c["delta"]):
                        yield _event(payload)
        for payload in blocks.close():
            yield _event(payload)
        stop = self._stop(reason, group.result(0))
        out = _usage(usage) if usage is not None else usage0
        yield _event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop[0], "stop_sequence": stop[1]},
                "usage": out,  # the whole usage, cumulative, as Anthropic's final delta
            }
        )
        yield _event({"type": "message_stop"})


def prompt_tokens(ctx: ServeContext, prompt: Any) -> int:
    """How many tokens the backend reads `prompt` as (count_tokens, message_start)."""
    from lmprog.core.prompt import encode_prompt

    return len(encode_prompt(ctx.backend.tokenizer, prompt))


class _Blocks:
    """The content blocks of a streamed message, opened and closed as the chat deltas come."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None

    def delta(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if delta.get("reasoning_content"):
            out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(
                self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]})
            )
        if delta.get("content"):
            out += self._open("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or ():
            fn = call.get("function") or {}
            if call.get("id"):  # a new call
                out += self.close()
                block = {
                    "type": "tool_use",
                    "id": _tool_id(call["id"]),
                    "name": fn.get("name"),
                    "input": {},
                }
                out += self._open("tool_use", block, fresh=True)
            if fn.get("arguments"):
                out.append(
                    self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]})
                )
        return out

    def _open(self, kind: str, block: dict[str, Any], fresh: bool = False) -> list[dict[str, Any]]:
        if self.kind == kind and not fresh:
            return []
        out = self.close()
        self.index += 1
        self.kind = kind
        return out + [{"type": "content_block_start", "index": self.index, "content_block": block}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}

    def close(self) -> list[dict[str, Any]]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": SIGNATURE}))
        self.kind = None
        return out + [{"type": "content_block_stop", "index": self.index}]


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _tool_use(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": _tool_id(call_id),
        "name": name,
        "input": json.loads(arguments),
    }


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": usage["prompt_tokens"] - cached,
        "output_tokens": usage["completion_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def _event(payload: dict[str, Any]) -> bytes:
    return f"event: {payload['type']}\n".encode() + sse(payload)
