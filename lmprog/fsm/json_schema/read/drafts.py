"""Draft-03 schemas, read as the later drafts write the same constraints.

A document whose ``$schema`` names draft-03 is rewritten before it is compiled (``required:
true``, schemas in ``type``, ``disallow``, ``extends``, ``divisibleBy``, string
``dependencies``, the old format names), keeping its shape where ``$ref`` pointers reach.
Under other drafts these keywords are unknown, hence annotations. Design:
docs/design/json-schema.md.
"""

from __future__ import annotations

import re
from typing import Any

_DRAFT3 = re.compile(r"json-schema\.org/draft-03/schema")
_ONE = {"additionalProperties", "additionalItems", "not"}  # keywords holding one schema
_MAPS = {"properties", "patternProperties", "definitions"}
_FORMATS = {"ip-address": "ipv4", "host-name": "hostname"}


def upgrade(document: Any) -> Any:
    """The document as draft-04 reads it, if its ``$schema`` is draft-03; else itself."""
    if isinstance(document, dict) and _DRAFT3.search(str(document.get("$schema", ""))):
        return _schema(document)
    return document


def _schema(s: Any) -> Any:
    if not isinstance(s, dict):
        return s
    out: dict[str, Any] = {}
    parts: list[Any] = []
    for key, value in s.items():
        if key in _ONE:
            out[key] = _schema(value)
        elif key == "items":
            out[key] = [_schema(v) for v in value] if isinstance(value, list) else _schema(value)
        elif key in _MAPS and isinstance(value, dict):
            out[key] = {k: _schema(v) for k, v in value.items()}
        elif key == "dependencies" and isinstance(value, dict):
            out[key] = {k: [v] if isinstance(v, str) else _schema(v) for k, v in value.items()}
        elif key == "required" and isinstance(value, bool):
            continue  # read by the object holding this schema
        elif key == "type":
            union = _union(value)
            if isinstance(union, dict):
                parts.append(union)
            elif union is not None:
                out[key] = union
        elif key == "disallow":
            union = _union(value)
            out["not"] = (
                True if union is None else union if isinstance(union, dict) else {"type": union}
            )
        elif key == "extends":
            parts += [_schema(v) for v in (value if isinstance(value, list) else [value])]
        elif key == "divisibleBy":
            out["multipleOf"] = value
        elif key == "format" and value in _FORMATS:
            out[key] = _FORMATS[value]
        else:
            out[key] = value
    required = [
        k
        for k, v in (s.get("properties") or {}).items()
        if isinstance(v, dict) and v.get("required") is True
    ]
    if required and isinstance(s.get("properties"), dict):
        out["required"] = required
    if parts:
        out["allOf"] = parts
    return out


def _union(spec: Any) -> Any:
    """A draft-03 type or disallow value: None (any value), a type name or list of names, or a
    schema (``anyOf`` of the schemas and names it lists)."""
    items = spec if isinstance(spec, list) else [spec]
    if "any" in items:
        return None
    if all(isinstance(t, str) for t in items):
        return spec
    return {"anyOf": [{"type": t} if isinstance(t, str) else _schema(t) for t in items]}
