"""The Response object and its streamed events, written from the chat reply's message.

    ResponseReply(ctx, body, chat_reply, keep).response_body(results)   # the Response object
    ResponseReply(...).stream(group)                                     # its SSE events

responses.py converts the request; this, what comes back (a `message` item, one
`function_call` item per call). The events: docs/design/server.md#the-responses-api.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from lmprog.core.protocol import GenerateResult

from ..context import ServeContext
from ..generations import Generations
from ..respond import payloads, sse
from ..schemas.responses import ResponsesRequest


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseOutput:
    """A response's output items as the chat reply's message arrives (whole, or delta by
    delta), and the events that build them: `text` and `call` open an item as needed (closing
    the one before), `close` ends the last. Events carry no sequence_number (the stream's)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool_call index -> its item

    def text(self, delta: str) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open["type"] != "message":
            events += self._close_open("completed")
            item = {
                "id": _new_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            events += self._added(item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append(self._on(item, "response.content_part.added", part=dict(part)))
            item["content"].append(part)
        item = self._open
        if delta:
            item["content"][0]["text"] += delta
            events.append(self._on(item, "response.output_text.delta", delta=delta, logprobs=[]))
        return events

    def reasoning(self, delta: str) -> list[dict[str, Any]]:
        """A piece of a reasoning model's thinking: a `reasoning` item (its text as a
        `reasoning_text` part; no summary is written)."""
        events = []
        if self._open is None or self._open["type"] != "reasoning":
            events += self._close_open("completed")
            item = {
                "id": _new_id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": ""}],
                "status": "in_progress",
            }
            events += self._added(item)
        item = self._open
        if delta:
            item["content"][0]["text"] += delta
            events.append(self._on(item, "response.reasoning_text.delta", delta=delta))
        return events

    def call(self, index: int, call_id: str | None, name: str | None, delta: str) -> list[dict]:
        """A chat tool_call delta: its first carries the call's id and name."""
        events = []
        item = self._calls.get(index)
        if item is None:
            events += self._close_open("completed")
            item = {
                "id": _new_id("fc"),
                "type": "function_call",
                "call_id": call_id or _new_id("call"),
                "name": name or "",
                "arguments": "",
                "status": "in_progress",
            }
            self._calls[index] = item
            events += self._added(item)
        if delta:
            item["arguments"] += delta
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": self.items.index(item),
                    "delta": delta,
                }
            )
        return events

    def close(self, status: str, logprobs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """End the output (`status` of its last item); with no item at all, an empty message.
        `logprobs`: the message's text's, when asked for."""
        events = self.text("") if not self.items else []
        message = next((i for i in self.items if i["type"] == "message"), None)
        if logprobs is not None and message is not None:
            message["content"][0]["logprobs"] = logprobs
        return events + self._close_open(status)

    def _added(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.items.append(item)
        self._open = item
        return [
            {
                "type": "response.output_item.added",
                "output_index": len(self.items) - 1,
                "item": _copy(item),
            }
        ]

    def _on(self, item: dict[str, Any], kind: str, **fields: Any) -> dict[str, Any]:
        index = self.items.index(item)
        return {
            "type": kind,
            "item_id": item["id"],
            "output_index": index,
            "content_index": 0,
            **fields,
        }

    def _close_open(self, status: str) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = status
        index = self.items.index(item)
        events = []
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            events.append(self._on(item, "response.reasoning_text.done", text=text))
        elif item["type"] == "message":
            part = item["content"][0]
            events.append(
                self._on(
                    item, "response.output_text.done", text=part["text"], logprobs=part["logprobs"]
                )
            )
            events.append(self._on(item, "response.content_part.done", part=_copy(part)))
        else:
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "arguments": item["arguments"],
                }
            )
        events.append(
            {"type": "response.output_item.done", "output_index": index, "item": _copy(item)}
        )
        return events


def _copy(value: Any) -> Any:
    """A deep copy of JSON data (items keep growing after an event carried them)."""
    return json.loads(json.dumps(value))


class ResponseReply:
    """What runs.respond needs of a reply (`ctx`, `response_body`, `stream`): the chat reply's
    body or chunks, converted. `keep(response, output_items)` is called with each finished
    (completed or incomplete) response."""

    def __init__(
        self,
        ctx: ServeContext,
        body: ResponsesRequest,
        chat: Any,
        keep: Callable[[dict[str, Any], list[dict[str, Any]]], None],
    ) -> None:
        self.ctx, self.body, self.chat, self.keep = ctx, body, chat, keep
        self.id = _new_id("resp")
        self.created = int(time.time())

    def response_body(self, results: list[GenerateResult]) -> dict[str, Any]:
        chat = self.chat.response_body(results)
        choice = chat["choices"][0]
        message, output = choice["message"], ResponseOutput()
        if message.get("reasoning_content"):
            output.reasoning(message["reasoning_content"])
        if message.get("content"):
            output.text(message["content"])
        for i, call in enumerate(message.get("tool_calls") or ()):
            fn = call["function"]
            output.call(i, call["id"], fn["name"], fn["arguments"])
        return self._finish(output, choice, chat["usage"])[0]

    async def stream(self, group: Generations) -> AsyncIterator[bytes]:
        seq = itertools.count()
        seq_event = lambda payload: _event(payload, next(seq))
        pending = self._body("in_progress", [], None)
        yield seq_event({"type": "response.created", "response": pending})
        yield seq_event({"type": "response.in_progress", "response": pending})
        output, choice, usage = ResponseOutput(), {}, None
        async for chunk in self.chat.stream(group):
            for data in payloads(chunk):
                if "error" in data:
                    for payload in self._failed(data["error"]):
                        yield seq_event(payload)
                    return
                if data.get("usage") is not None:
                    usage = data["usage"]
                for c in data.get("choices", ()):
                    choice.update({k: c[k] for k in ("finish_reason", "logprobs") if c.get(k)})
                    for payload in _delta_events(output, c["delta"]):
                        yield seq_event(payload)
        done, closing = self._finish(output, choice, usage)
        for payload in closing:
            yield seq_event(payload)
        yield seq_event({"type": f"response.{done['status']}", "response": done})

    def _finish(
        self, output: ResponseOutput, choice: dict[str, Any], usage: dict[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The finished response (kept) and the events closing its output."""
        status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
        logprobs = (
            (choice.get("logprobs") or {}).get("content") if self.chat.body.logprobs else None
        )
        closing = output.close(status, logprobs)
        body = self._body(status, output.items, _usage(usage))
        self.keep(body, output.items)
        return body, closing

    def _failed(self, error: dict[str, Any]) -> list[dict[str, Any]]:
        body = self._body("failed", [], None)
        # response.error.code is one of OpenAI's few codes; the error event keeps ours
        code = "invalid_prompt" if error.get("type") == "invalid_request_error" else "server_error"
        body["error"] = {"code": code, "message": error["message"]}
        return [
            {"type": "error", **{k: error.get(k) for k in ("code", "message", "param")}},
            {"type": "response.failed", "response": body},
        ]

    def _body(self, status: str, output: list[dict[str, Any]], usage: Any) -> dict[str, Any]:
        b = self.body
        fmt = b.text.format if b.text and b.text.format else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "max_tool_calls": None,
            "model": self.ctx.model_name,
            "output": _copy(output),
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": b.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": b.store is not False,
            "temperature": b.temperature,
            "text": {
                "format": fmt.model_dump(by_alias=True, exclude_none=True)
                if fmt
                else {"type": "text"}
            },
            "tool_choice": _tool_choice(b),
            "tools": [t.model_dump() for t in b.tools or ()],
            "top_logprobs": b.top_logprobs,
            "top_p": b.top_p,
            "truncation": b.truncation or "disabled",
            "usage": usage,
            "user": b.user,
            "metadata": b.metadata or {},
            "background": False,
        }


def _delta_events(output: ResponseOutput, delta: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    if delta.get("reasoning_content"):
        events += output.reasoning(delta["reasoning_content"])
    if delta.get("content"):
        events += output.text(delta["content"])
    for call in delta.get("tool_calls") or ():
        fn = call.get("function") or {}
        events += output.call(
            call["index"], call.get("id"), fn.get("name"), fn.get("arguments") or ""
        )
    return events


def _tool_choice(body: ResponsesRequest) -> Any:
    choice = body.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {
            "reasoning_tokens": (usage.get("completion_tokens_details") or {}).get(
                "reasoning_tokens", 0
            )
        },
        "total_tokens": usage["total_tokens"],
    }


def _event(payload: dict[str, Any], sequence_number: int) -> bytes:
    payload = {**payload, "sequence_number": sequence_number}
    return f"event: {payload['type']}\n".encode() + sse(payload)
