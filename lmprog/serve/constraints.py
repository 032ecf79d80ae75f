"""What a choice's text must match, compiled into an lmprog Constraint.

OpenAI's `response_format`, SGLang's `regex` / `json_schema` / `ebnf` or vLLM's `guided_*`
fields, at most one per request (a 400 naming the second otherwise); schemas compile for strict
generation unless `response_format.json_schema.strict` is false.
Design: docs/design/server.md#sampling-and-constraints.
"""

from __future__ import annotations

from typing import Any

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.regex import compile_user_regex

from .errors import APIError
from .schemas.completions import ResponseFormat, SamplingFields

JSON_OBJECT_SCHEMA = {"type": "object"}

# the request fields that constrain the output, in the order conflicts are reported
CONSTRAINT_FIELDS = (
    "response_format",
    "regex",
    "json_schema",
    "ebnf",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)
_JSON_FIELDS = frozenset({"response_format", "json_schema", "guided_json"})
ERROR_CODES = {  # a constraint field's error code
    "response_format": "invalid_schema",
    "json_schema": "invalid_schema",
    "guided_json": "invalid_schema",
    "regex": "invalid_regex",
    "guided_regex": "invalid_regex",
    "ebnf": "invalid_grammar",
    "guided_grammar": "invalid_grammar",
    "guided_choice": "invalid_value",
}


def json_object_constraint(whitespace: str | None = None) -> Constraint:
    return Constraint.from_json_schema(JSON_OBJECT_SCHEMA, whitespace=whitespace)


def constraint_field(body: SamplingFields) -> str | None:
    """The one field of `body` that constrains its output (None: free text); a 400 naming
    the fields when more than one is set."""
    return _one_of({name: getattr(body, name) for name in CONSTRAINT_FIELDS})


def body_constraint(body: SamplingFields) -> Constraint | None:
    """The constraint of `body`'s constraint fields (None: free text); 400 if invalid."""
    return output_constraint(
        **{name: getattr(body, name) for name in CONSTRAINT_FIELDS},
        guided_whitespace_pattern=body.guided_whitespace_pattern,
    )


def output_constraint(
    response_format: ResponseFormat | None = None,
    regex: str | None = None,
    *,
    json_schema: str | dict[str, Any] | None = None,
    ebnf: str | None = None,
    guided_json: str | dict[str, Any] | None = None,
    guided_regex: str | None = None,
    guided_choice: list[str] | None = None,
    guided_grammar: str | None = None,
    guided_whitespace_pattern: str | None = None,
) -> Constraint | None:
    """The constraint of the given fields (at most one set; None: free text); 400 if invalid."""
    values = {
        "response_format": response_format,
        "regex": regex,
        "json_schema": json_schema,
        "ebnf": ebnf,
        "guided_json": guided_json,
        "guided_regex": guided_regex,
        "guided_choice": guided_choice,
        "guided_grammar": guided_grammar,
    }
    name = _one_of(values)
    whitespace = _whitespace(guided_whitespace_pattern, name)
    if name is None:
        return None
    try:
        return _build(name, values[name], whitespace)
    except ConstraintError as exc:
        param = "response_format.json_schema.schema" if name == "response_format" else name
        raise APIError(400, f"invalid {name}: {exc}", param=param, code=ERROR_CODES[name]) from None


def _one_of(values: dict[str, Any]) -> str | None:
    given = [name for name in CONSTRAINT_FIELDS if _is_set(name, values[name])]
    if len(given) > 1:
        raise APIError(
            400,
            f"give at most one constraint per request ({', '.join(CONSTRAINT_FIELDS)}); "
            f"got {' and '.join(given)}",
            param=given[1],
            code="conflicting_constraints",
        )
    return given[0] if given else None


def _is_set(name: str, value: Any) -> bool:
    if name == "response_format":
        return value is not None and value.type != "text"
    return value is not None


def _whitespace(pattern: str | None, field: str | None) -> str | None:
    if pattern is None:
        return None
    if field not in _JSON_FIELDS:
        raise APIError(
            400,
            "guided_whitespace_pattern applies to JSON output only: give it with guided_json, "
            "json_schema or a JSON response_format",
            param="guided_whitespace_pattern",
        )
    try:
        compile_user_regex(pattern)
    except ConstraintError as exc:
        raise APIError(
            400,
            f"invalid guided_whitespace_pattern: {exc}",
            param="guided_whitespace_pattern",
            code="invalid_regex",
        ) from None
    return pattern


def _build(name: str, value: Any, whitespace: str | None) -> Constraint:
    if name in ("regex", "guided_regex"):
        return Constraint.from_regex(value)
    if name in ("ebnf", "guided_grammar"):
        return Constraint.from_ebnf(value)
    if name == "guided_choice":
        return Constraint.from_choices(value)
    if name == "response_format":
        if value.type == "json_object":
            return json_object_constraint(whitespace)
        schema = value.json_schema.schema_
        return Constraint.from_json_schema(
            {} if schema is None else schema,
            whitespace=whitespace,
            strict=value.json_schema.strict is not False,
        )
    return Constraint.from_json_schema(value, whitespace=whitespace)  # json_schema, guided_json
