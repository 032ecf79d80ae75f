"""JSON from clients, parsed within limits: a request body (`parse_body`: read, parsed and
validated as its request type), or the JSON text of a tool call's arguments. Every way it can
fail is an APIError (400), never a 500:

    invalid_json      not JSON (NaN and Infinity are not JSON either)
    json_too_deep     arrays and objects nested deeper than the server's max_json_depth
                      (checked on the text before parsing, so parsing never recurses deeply)
    integer_too_long  an integer with more digits than Python converts
                      (sys.get_int_max_str_digits(), 4300 by default)
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, TypeVar

import numpy as np
from fastapi import Request
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from .context import ServeContext
from .errors import APIError, ClientGone
from .unknown_fields import validate

M = TypeVar("M", bound=BaseModel)

# a string (closed, or running to the end of the text: never a failed match, so one linear
# pass), or a run of anything that is neither a string nor a bracket
_NOT_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)|[^"\[\]{}]+', re.S)
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON text (brackets inside strings not counted;
    for text that is not JSON, a bound that parsing it would reach)."""
    brackets = _NOT_BRACKETS.sub("", text)
    if not brackets:
        return 0
    steps = np.frombuffer(brackets.encode("ascii").translate(_STEPS), dtype=np.int8)
    return int(np.cumsum(steps, dtype=np.int32).max())


def loads(data: bytes | str, *, max_depth: int, what: str, param: str | None = None) -> Any:
    """The JSON value of `data` (`what`: how messages name it, e.g. "the request body")."""
    try:
        text = data if isinstance(data, str) else data.decode(json.detect_encoding(data))
    except UnicodeDecodeError as exc:
        raise _invalid(f"{what} is not valid JSON ({exc})", param) from None
    depth = nesting_depth(text) if text.count("[") + text.count("{") > max_depth else 0
    if depth > max_depth:
        raise APIError(
            400,
            f"{what} nests arrays and objects {depth} deep; this server allows at most "
            f"{max_depth} (max_json_depth)",
            param=param,
            code="json_too_deep",
        )
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise _invalid(f"{what} is not valid JSON ({exc})", param) from None
    except _NotJSON as exc:
        raise _invalid(f"{what} is not valid JSON ({exc} is not a JSON value)", param) from None
    except ValueError:  # Python's int-string conversion limit
        raise APIError(
            400,
            f"{what} has an integer of more than {_max_digits()} digits, "
            "the most this server reads",
            param=param,
            code="integer_too_long",
        ) from None
    except RecursionError:  # deeper than the interpreter allows, though max_json_depth is not
        raise APIError(
            400, f"{what} nests arrays and objects too deep", param=param, code="json_too_deep"
        ) from None


async def parse_body(
    request: Request, model: type[M], ctx: ServeContext, *, strict: bool | None = None
) -> M:
    """The body as `model`: unknown fields dropped with a warning in the log, or a 400 when
    `strict` (default: the server's `strict_requests`); every other mistake a 400 naming the
    field."""
    try:
        raw = await request.body()
    except ClientDisconnect:  # gone before its body arrived: nobody to answer
        raise ClientGone from None
    data = loads(raw, max_depth=ctx.limits.max_json_depth, what="the request body")
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    strict = ctx.limits.strict_requests if strict is None else strict
    return validate(model, data, strict=strict, fields=ctx.unknown_fields)


class _NotJSON(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJSON(name)


def _invalid(message: str, param: str | None) -> APIError:
    return APIError(400, message, param=param, code="invalid_json")


def _max_digits() -> int:
    return getattr(sys, "get_int_max_str_digits", lambda: 4300)()
