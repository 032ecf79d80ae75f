"""The ASGI gate in front of the routes: API key (401), body size limit (413), request metrics,
one access line per request.

The access line goes to the `lmprog.serve.access` logger (info): client, method, path, status,
duration, prompt tokens (and those served from the prefix cache), completion tokens.
Design: docs/design/server.md#the-access-gate.
"""

from __future__ import annotations

import hmac
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import APIError, anthropic_error
from .metrics import REQUEST_TOKENS, ServerMetrics

access_log = logging.getLogger("lmprog.serve.access")

OPEN_PATHS = frozenset({"/health"})
ARRIVAL = "lmprog_arrival"  # the scope state key of a request's time.perf_counter() arrival
KNOWN_PATHS = frozenset(
    {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/models"}
    | {"/v1/messages", "/v1/messages/count_tokens"}  # Anthropic's Messages API
    | {"/tokenize", "/detokenize", "/version"}
    | {"/health", "/metrics"}
    | {"/generate", "/get_model_info", "/flush_cache", "/health_generate"}  # SGLang's native API
    | {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"}  # LoRA adapters (vLLM's, SGLang's)
)


class Gate:
    def __init__(
        self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int, metrics: ServerMetrics
    ) -> None:
        self.app = app
        self._key = api_key.encode() if api_key else None
        self._max = max_body_bytes
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = path_label(scope["path"])
        started, status = time.perf_counter(), [0]
        scope.setdefault("state", {})[ARRIVAL] = started  # request.state: TTFT, e2e latency

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        tokens = [0, 0, 0]
        REQUEST_TOKENS.set(tokens)  # this request's own context (ASGI runs each in a task)
        self._metrics.in_flight.inc()
        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                if scope["path"].startswith("/v1/messages"):
                    response = anthropic_error(refusal)
                else:
                    response = refusal.response()
                await response(scope, receive, counted_send)
            else:
                await self.app(scope, self._limited(receive), counted_send)
        finally:
            self._metrics.in_flight.dec()
            seconds = time.perf_counter() - started
            self._metrics.on_response(path, status[0], seconds)
            if access_log.isEnabledFor(logging.INFO):
                client = scope.get("client")
                access_log.info(
                    '%s "%s %s" %s %.3fs prompt_tokens=%d cached_tokens=%d completion_tokens=%d',
                    f"{client[0]}:{client[1]}" if client else "-",
                    scope.get("method", "-"),
                    scope.get("path", "-"),
                    status[0] or "-",
                    seconds,
                    tokens[0],
                    tokens[2],
                    tokens[1],
                )

    def _refusal(self, scope: Scope) -> APIError | None:
        headers = dict(scope["headers"])
        if self._key is not None and scope["path"] not in OPEN_PATHS:
            given = _bearer_token(headers.get(b"authorization", b""))
            given = given or headers.get(b"x-api-key", b"").strip()
            if not hmac.compare_digest(given, self._key):
                return APIError(
                    401,
                    "missing or invalid API key: send 'Authorization: Bearer KEY' (or "
                    "'x-api-key: KEY')",
                    code="invalid_api_key",
                )
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self._max):
            return _too_large(self._max)
        return None

    def _limited(self, receive: Receive) -> Receive:
        seen = [0]

        async def limited() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > self._max:
                    raise _too_large(self._max)
            return message

        return limited


def path_label(path: str) -> str:
    """The `path` label of a request's metrics: the route it reached (a route with a path
    parameter under its template, so labels stay few), else "other"."""
    if path in KNOWN_PATHS:
        return path
    if path.startswith("/v1/models/"):  # a model name may hold slashes (org/name)
        return "/v1/models/{model}"
    if path.startswith("/v1/responses/") and "/" not in path[len("/v1/responses/") :]:
        return "/v1/responses/{response_id}"
    return "other"


def _bearer_token(header: bytes) -> bytes:
    """The token of `Bearer TOKEN` (any case of the scheme, spaces between), else b""."""
    scheme, _, token = header.strip().partition(b" ")
    return token.lstrip(b" ") if scheme.lower() == b"bearer" else b""


def _too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"the request body is larger than this server's limit of {limit} bytes",
        code="request_too_large",
    )
