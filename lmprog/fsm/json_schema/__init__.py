"""JSON Schema to regex: lmprog's own compiler.

``build_regex(schema)`` returns a regex (in the syntax of ``lmprog.fsm.regex``) whose matches are
JSON texts of instances valid against ``schema``. The rule: a text the regex accepts is always a
valid instance; a valid instance is accepted in lmprog's canonical shape, and a schema whose valid
set cannot be written exactly raises ``ConstraintError`` (naming the keyword, and the JSON path for
keywords and invalid values). The canonical shape:

* whitespace: ``whitespace`` (a regex; default ``[ ]?``, at most one space) may appear after
  ``{``/``[``/``,``/``:`` and before ``,``/``:``/``}``/``]``, never around the top-level value;
  bounded whitespace keeps a model from looping on newlines;
* objects: named properties in declaration order (``properties`` first, then other ``required``
  keys), any optional one left out, then other keys (``objects``); a key is written once;
* numbers: integers without fraction or exponent; bounded numbers without exponent (``numbers``);
* strings: every JSON escape, counted per character for min/maxLength; canonical spelling under
  ``pattern``/``format`` or excluded values (``strings``); formats as listed in ``formats``;
* ``$ref`` recursion unrolled ``max_recursion_depth`` times (default 3); values under an
  unconstrained schema (``{}``, a missing ``items``, default ``additionalProperties``) nest
  containers at most ``any_depth`` levels (default 1: ``{"a": [1, {"b": 2}]}`` is not generated,
  ``{"a": [1, 2]}`` is).

Keywords: type (unions, null), enum/const (any JSON value; objects in any key order up to 4 keys),
properties/required/additionalProperties (default true)/patternProperties/propertyNames/
min-maxProperties/dependentRequired/dependentSchemas, prefixItems/items/min-maxItems/contains/
min-maxContains/uniqueItems (finite item sets only), min-maxLength/pattern/format,
minimum/maximum/exclusive*/multipleOf, allOf/anyOf/oneOf/not/if-then-else (complements when each
facet has an exact one), $ref/$defs/definitions/$id/$anchor (same document),
unevaluatedProperties/unevaluatedItems (from the evaluated keys each branch certainly has).
Annotations (title, description, default, examples, $comment, content*, ...) are ignored; any
other keyword (``$dynamicRef``, unknown names) raises ConstraintError.
"""

from __future__ import annotations

import json

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.builder import Builder
from lmprog.fsm.json_schema.emit import Emitter
from lmprog.fsm.regex import R, compile_user_regex, raw

DEFAULT_WHITESPACE = r"[ ]?"
DEFAULT_RECURSION_DEPTH = 3
DEFAULT_ANY_DEPTH = 1

__all__ = [
    "build_regex",
    "load_schema",
    "DEFAULT_WHITESPACE",
    "DEFAULT_RECURSION_DEPTH",
    "DEFAULT_ANY_DEPTH",
]


def load_schema(schema):
    """A schema document (dict or bool) from a dict, a JSON string or a pydantic model class."""
    if isinstance(schema, (dict, bool)):
        return schema
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"json_schema string is not valid JSON: {e}") from None
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    raise TypeError(
        "json_schema must be a dict, a JSON string or a pydantic model class, "
        f"got {type(schema).__name__}"
    )


def build_regex(
    schema,
    *,
    whitespace: str | None = None,
    max_recursion_depth: int = DEFAULT_RECURSION_DEPTH,
    any_depth: int = DEFAULT_ANY_DEPTH,
) -> str:
    """The regex of a JSON schema document; ConstraintError if it has none that is exact."""
    if not isinstance(max_recursion_depth, int) or max_recursion_depth < 0:
        raise ValueError("max_recursion_depth must be a non-negative int")
    if not isinstance(any_depth, int) or any_depth < 0:
        raise ValueError("any_depth must be a non-negative int")
    ws = (
        raw(DEFAULT_WHITESPACE)
        if whitespace is None
        else R(compile_user_regex(whitespace), False, True)
    )
    document = load_schema(schema)
    node = Builder(document, max_recursion_depth).build(document)
    out = Emitter(ws, any_depth).node(node)
    if out is None:
        raise ConstraintError("the schema accepts no JSON value")
    return out.text
