"""JSON from clients, parsed within limits: a request body (`parse_body`), or a tool call's
arguments.

Every way it can fail is an APIError (400: invalid_json, json_too_deep, integer_too_long),
never a 500. Unknown fields are dropped with a warning, or a 400 `unknown_parameter` with
`strict_requests`. Design: docs/design/server.md#request-bodies-json-within-limits.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any, Protocol, TypeVar

import numpy as np
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from .errors import APIError, ClientGone, validation_error
from .limits import ServerLimits

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger("lmprog.serve")
MAX_LOGGED_NAMES = 256  # distinct names warned about; then one last note (clients choose names)
_ROUNDS = 8  # an unknown field inside a union branch can hide another until the first goes

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


class BodyContext(Protocol):
    """What `parse_body` reads of the server's context (a ServeContext)."""

    @property
    def limits(self) -> ServerLimits: ...

    @property
    def unknown_fields(self) -> UnknownFields: ...


async def parse_body(
    request: Request, model: type[M], ctx: BodyContext, *, strict: bool | None = None
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


class UnknownFields:
    """The unknown field names already warned about (one server's; event loop only)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def warn(self, name: str) -> None:
        if name in self.seen or len(self.seen) > MAX_LOGGED_NAMES:
            return
        self.seen.add(name)
        if len(self.seen) > MAX_LOGGED_NAMES:
            log.warning(
                "more than %d distinct unknown request fields: no more are logged",
                MAX_LOGGED_NAMES,
            )
            return
        log.warning(
            "ignored the unknown request field %s (logged once per name; "
            "lmprog serve --strict-requests answers such requests with a 400)",
            name,
        )


def validate(model: type[M], data: dict[str, Any], *, strict: bool, fields: UnknownFields) -> M:
    """`model` validated from `data`; unknown fields dropped (and warned about) unless
    `strict`; any other mistake is the APIError of `errors.validation_error`."""
    for _ in range(_ROUNDS):
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            errors = exc.errors()
        extra = [e for e in errors if e.get("type") == "extra_forbidden"]
        if strict or not extra:
            raise validation_error(errors) from None
        names = [_drop(data, error["loc"]) for error in extra]
        if all(name is None for name in names):  # nothing to drop: cannot get further
            raise validation_error(errors) from None
        for name in names:
            if name is not None:
                fields.warn(name)
    raise validation_error(errors) from None


def _drop(data: Any, loc: tuple[Any, ...]) -> str | None:
    """Delete the key at pydantic's `loc` from `data` (union branch tags in `loc`, which name
    no key, are skipped); returns the field's name with list indices left out
    (`messages[].id`), or None when `loc` leads nowhere."""
    node, name = data, ""
    for part in loc[:-1]:
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
            name += f".{part}" if name else part
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            name += "[]"
        # else: a union branch tag ("NamedToolChoice"), not a key of the body
    key = loc[-1] if loc else None
    if not isinstance(node, dict) or key not in node:
        return None
    del node[key]
    return f"{name}.{key}" if name else str(key)


class _NotJSON(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJSON(name)


def _invalid(message: str, param: str | None) -> APIError:
    return APIError(400, message, param=param, code="invalid_json")


def _max_digits() -> int:
    return getattr(sys, "get_int_max_str_digits", lambda: 4300)()
