"""OpenAI-style errors: `APIError` and the handlers that turn every failure into an error body.

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

A 4xx status for the client's mistakes, 500 for the server's own; the same errors in
Anthropic's shape for /v1/messages (`anthropic_error`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from lmprog.core.errors import BackendError, ConstraintError, ContextLengthError

log = logging.getLogger("lmprog.serve")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """A failed request: HTTP status plus the OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


class ClientGone(Exception):
    """The client disconnected before its response was ready (answered with 499, unseen)."""


def from_exception(exc: BaseException, param: str | None = None) -> APIError:
    """The APIError for an exception raised while serving a request; `param`: the field a
    client error is blamed on unless its message names another (e.g. "stop_token_ids: ...")."""
    if isinstance(exc, APIError):
        return exc
    named = re.match(r"(stop_token_ids|max_tokens|min_tokens|regex|seed)\b", str(exc))
    param = named.group(1) if named else param
    if isinstance(exc, ContextLengthError):
        return APIError(400, context_message(exc), param=param, code="context_length_exceeded")
    if isinstance(exc, ConstraintError):
        return APIError(400, str(exc), param=param, code="invalid_constraint")
    if isinstance(exc, (ValueError, TypeError)):
        return APIError(400, str(exc), param=param)
    if isinstance(exc, BackendError):
        return APIError(500, f"the model backend failed: {exc}", code="backend_error")
    log.error("unexpected error while serving a request", exc_info=exc)
    return APIError(500, "internal server error", code="internal_error")


# the lmprog serve flag behind each backend setting a ContextLengthError names
_CONTEXT_FLAGS = {"n_ctx": "--max-total-tokens", "max_total_tokens": "--max-total-tokens"}


def context_message(exc: ContextLengthError) -> str:
    """A too-long prompt, told to an HTTP client: the server's flag, not the backend's Python
    keyword (`LlamaCpp(n_ctx=...)`), sets the context."""
    if exc.prompt_tokens is None or exc.limit is None:
        return str(exc)
    told = f"the prompt has {exc.prompt_tokens} tokens"
    flag = _CONTEXT_FLAGS.get(exc.setting or "")
    if flag is None:
        return (
            f"{told} and the model's context length is {exc.limit} (at least one more is "
            "needed to generate): shorten the prompt"
        )
    return (
        f"{told} and this server's context holds {exc.limit} (at least one more is needed to "
        f"generate): shorten the prompt, or start the server with a larger {flag}"
    )


def validation_error(errors: Sequence[Any]) -> APIError:
    """Unknown fields, missing fields, wrong types: 400 naming the first offending field."""
    first = errors[0] if errors else {}
    kind = first.get("type", "")
    param = _param(first.get("loc", ()))
    if kind == "extra_forbidden":
        return APIError(
            400,
            f"Unrecognized request argument supplied: {param}",
            param=param,
            code="unknown_parameter",
        )
    message = first.get("msg", "invalid request")
    return APIError(
        400, f"{param}: {message}" if param else message, param=param, code="invalid_value"
    )


def _param(loc: Sequence[Any]) -> str | None:
    """("messages", 0, "content", "str") -> "messages[0].content" (union branch tags dropped)."""
    out = ""
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).isidentifier() and part not in _TYPE_TAGS:
            out += f".{part}" if out else str(part)
        else:
            break
    return out or None


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def anthropic_error(exc: APIError) -> JSONResponse:
    """`exc` in Anthropic's error shape (the field it names first in its message)."""
    return JSONResponse(anthropic_error_body(exc), status_code=exc.status)


def anthropic_error_body(exc: APIError) -> dict[str, Any]:
    message = exc.message
    if exc.param and not message.startswith(exc.param):
        message = f"{exc.param}: {message}"
    kind = _ANTHROPIC_TYPES.get(exc.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def install_handlers(app: FastAPI) -> None:
    """Route every error the app can raise to an OpenAI-style body."""

    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:  # the client's choice
        log.info(
            "client disconnected before its response (%s); request cancelled", request.url.path
        )
        request.app.state.ctx.metrics.on_client_abort()
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(
            exc.status_code
        )
        return APIError(exc.status_code, str(exc.detail), code=code).response()

    @app.exception_handler(Exception)
    async def _other(_: Request, exc: Exception) -> JSONResponse:  # a bug of the server's own
        log.error("unexpected error while serving a request", exc_info=exc)
        return APIError(500, "internal server error", code="internal_error").response()
