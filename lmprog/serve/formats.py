"""What a choice's text must match: `response_format` (json_object, json_schema) or the
`regex` extension, compiled into an lmprog Constraint.

json_object mode: an object whose values may hold containers one level deep
(`{"type": "object"}` under lmprog's default `any_depth=1`, e.g. {"a": [1, 2], "b": {"c": 3}},
not {"a": [{"b": 1}]}). Its token index is built on the first use (then cached in memory and
on disk); any_depth=2 takes several times longer to build, and deeper bounds grow quickly
(docs/benchmarks.md), so the bound stays at 1. A schema with nested open objects can still
ask for more (see docs/serving.md).
"""

from __future__ import annotations

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint

from .errors import APIError
from .schemas import ResponseFormat

JSON_OBJECT_SCHEMA = {"type": "object"}


def json_object_constraint() -> Constraint:
    return Constraint.from_json_schema(JSON_OBJECT_SCHEMA)


def output_constraint(fmt: ResponseFormat | None, regex: str | None) -> Constraint | None:
    """The constraint of `response_format` / `regex` (None: free text); 400 if invalid."""
    json_mode = fmt is not None and fmt.type != "text"
    if json_mode and regex is not None:
        raise APIError(400, "give either response_format or regex, not both", param="regex")
    try:
        if regex is not None:
            return Constraint.from_regex(regex)
        if not json_mode:
            return None
        if fmt.type == "json_object":
            return json_object_constraint()
        schema = fmt.json_schema.schema_
        return Constraint.from_json_schema({} if schema is None else schema)
    except ConstraintError as exc:
        param = "regex" if regex is not None else "response_format.json_schema.schema"
        raise APIError(
            400,
            f"invalid {param.split('.')[0]}: {exc}",
            param=param,
            code="invalid_schema" if regex is None else "invalid_regex",
        ) from None
