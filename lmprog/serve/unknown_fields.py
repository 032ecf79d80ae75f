"""Request fields this server does not know: dropped with a warning in the log (once per
field name), as vLLM does, or a 400 `unknown_parameter` in strict mode (OpenAI's behaviour:
`lmprog serve --strict-requests`, `Server(..., strict_requests=True)`).

    body = validate(ChatCompletionRequest, data, strict=False, fields=ctx.unknown_fields)

Only unknown *names* are forgiven: a known field of the wrong type or range stays a 400
(`"max_tokens": "5"`), and so does an unknown field in strict mode.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import validation_error

log = logging.getLogger("lmprog.serve")
M = TypeVar("M", bound=BaseModel)

MAX_LOGGED_NAMES = 256  # distinct names warned about; then one last note (clients choose names)
_ROUNDS = 8  # an unknown field inside a union branch can hide another until the first goes


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
