"""From a request's running choices to its HTTP response: the JSON body, or server-sent events
in the OpenAI layout.

Events are `data: {chunk}`, then `data: [DONE]`. A client that disconnects cancels its
choices. Design: docs/design/server.md#responding-a-json-body-or-server-sent-events.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from lmprog.core.protocol import GenerateResult

from .access import ARRIVAL
from .context import ServeContext
from .errors import ClientGone, from_exception
from .generations import Generations

T = TypeVar("T")
POLL_S = 0.25
DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return (
        b"data: "
        + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        + b"\n\n"
    )


class EventStream(StreamingResponse):
    """`on_close` runs however the stream ends; `on_abort` too when the client left first."""

    def __init__(
        self,
        events: AsyncIterator[bytes],
        on_close: Callable[[], None],
        on_abort: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close
        self._on_abort = on_abort
        self._sent_all = False

    async def stream_response(self, send: Send) -> None:
        await super().stream_response(send)
        self._sent_all = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:  # ASGI 2.4 servers: a send failed
            pass
        finally:
            self._on_close()
        if not self._sent_all and self._on_abort is not None:  # the client went away
            self._on_abort()


def payloads(chunk: bytes) -> list[dict[str, Any]]:
    """The JSON events of SSE chunks `sse` wrote (`[DONE]` left out): a reply built over the
    chat reply's chunks reads them back."""
    out = []
    for event in chunk.split(b"\n\n"):
        if event.startswith(b"data: ") and event != b"data: [DONE]":
            out.append(json.loads(event[len(b"data: ") :]))
    return out


async def watched(request: Request, group: Generations, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`, cancelling `group` if the client goes away first (ClientGone)."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone
    finally:
        if not task.done():
            task.cancel()
            group.cancel()


async def respond(
    request: Request, group: Generations, reply: Any, *, stream: bool, param: str
) -> Response:
    """The HTTP response for a request's running choices: an SSE stream of `reply.stream(group)`
    (once every choice started without an error) or the JSON `reply.response_body(results)`.
    Any failure cancels the choices and becomes an OpenAI error blamed on `param`."""
    try:
        if stream:
            await watched(request, group, group.wait_started())
            return EventStream(
                reply.stream(group), group.cancel, on_abort=reply.ctx.metrics.on_client_abort
            )
        results = await watched(request, group, group.results())
    except ClientGone:  # not an error: answered with 499 and counted as a client abort
        group.cancel()
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to an HTTP error
        group.cancel()
        raise from_exception(exc, param=param) from None
    return JSONResponse(reply.response_body(results))


class ReplyBase:
    """What every response of one request shares: its id, creation time, and the shape of
    its SSE stream (`stream`). Subclasses set `body` (the request, with `stream_options`) and build
    the chunks: `_opening`, `_piece`, `_closing`, `_usage_chunk`, and `_usage`."""

    def __init__(self, ctx: ServeContext, id_prefix: str) -> None:
        self.ctx = ctx
        self.id = f"{id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    async def stream(self, group: Generations) -> AsyncIterator[bytes]:
        """The SSE stream: opening chunks, a chunk per text piece and per finished choice,
        an error event if a choice fails once the stream began, the usage chunk when
        stream_options.include_usage asks for it, then [DONE]."""
        results: dict[int, GenerateResult] = {}
        for chunk in self._opening(group.size):
            yield chunk
        try:
            async for index, event in group.events():
                if isinstance(event, str):
                    chunk = self._piece(index, event)
                    if chunk is not None:
                        yield chunk
                else:
                    results[index] = event
                    yield self._closing(index, event)
        except Exception as exc:  # noqa: BLE001 - a choice failed after the stream began
            yield sse(from_exception(exc).body())
            yield DONE
            return
        u = self._usage([results[i] for i in range(group.size)])
        if self.body.stream_options and self.body.stream_options.include_usage:
            yield self._usage_chunk(u)
        yield DONE


def arrival(request: Request) -> float | None:
    """When the gate received `request` (time.perf_counter()), None if it did not."""
    return request.scope.get("state", {}).get(ARRIVAL)


def finish_reason(result: GenerateResult) -> str:
    """OpenAI's finish reasons: a stop string, stop token or EOS -> "stop"; max_tokens or a
    full context -> "length"."""
    return "length" if result.finish_reason == "length" else "stop"


def usage(prompt_tokens: int, results: list[GenerateResult], cached: int) -> dict[str, Any]:
    completion = sum(r.completion_tokens for r in results)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
