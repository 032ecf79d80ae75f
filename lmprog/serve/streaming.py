"""Server-sent events in the OpenAI layout: `data: {chunk}` per event, `data: [DONE]` last.

`EventStream` runs a cleanup callback however the stream ends (finished, failed, or the
client went away), so a disconnected client's request is always aborted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

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
