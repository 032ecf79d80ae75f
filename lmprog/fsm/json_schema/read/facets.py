"""A schema object's type-specific keywords as one term per JSON type.

``{"minimum": 2, "maxLength": 3}`` constrains numbers and strings and leaves the other types
free: it becomes ``null | boolean | number>=2 | string{0,3} | array | object``. ``type`` picks
which of those terms remain. Sub-schemas (``items``, ``properties``...) are built through the
``sub`` callback, which knows the path and the reference stack.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from typing import Any, TypeAlias, overload

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.terms.algebra import (
    conj_all,
    key_node,
    normalize_arr,
    normalize_num,
    normalize_obj,
    normalize_str,
)
from lmprog.fsm.json_schema.terms.formats import format_pattern
from lmprog.fsm.json_schema.terms.matched import PatternMatch
from lmprog.fsm.json_schema.terms.nodes import (
    NEVER,
    TOP,
    TYPE_NAMES,
    ArrT,
    BoolT,
    Contains,
    KeyRule,
    Node,
    NullT,
    NumT,
    ObjT,
    StrT,
    Term,
    make_node,
)
from lmprog.fsm.json_schema.terms.values import pattern_matcher, to_decimal
from lmprog.fsm.regex import parse_regex
from lmprog.fsm.regex.backrefs import has_backreference
from lmprog.fsm.regex.lookahead import split_lookaheads

Sub = Callable[[object, str], Node]  # (sub-schema, path suffix) -> Node
# A schema object (a JSON object; a schema may also be a boolean), as json.loads reads it.
SchemaDict: TypeAlias = "dict[str, Any]"

_log = logging.getLogger("lmprog.fsm")


def typed_terms(schema: SchemaDict, path: str, sub: Sub) -> Node:
    """The union of one term per allowed type, each carrying that type's keywords."""
    types = _types(schema, path)
    builders: dict[type, Callable[[], Term | None]] = {
        NullT: lambda: NullT(),
        BoolT: lambda: BoolT(),
        NumT: lambda: _number(schema, path),
        StrT: lambda: _string(schema, path),
        ArrT: lambda: _array(schema, path, sub),
        ObjT: lambda: _object(schema, path, sub),
    }
    return make_node(tuple(builders[t]() for t in builders if t in types))


def _types(schema: SchemaDict, path: str) -> set[type]:
    spec = schema.get("type")
    if spec is None:
        return set(TYPE_NAMES.values())
    names = [spec] if isinstance(spec, str) else spec
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConstraintError(
            f"invalid schema: 'type' must be a string or a list of strings at {path}"
        )
    unknown = [n for n in names if n not in TYPE_NAMES]
    if unknown:
        raise ConstraintError(f"invalid schema: unknown type {unknown[0]!r} at {path}/type")
    return {TYPE_NAMES[n] for n in names}


@overload
def _count(schema: SchemaDict, key: str, path: str) -> int | None: ...
@overload
def _count(schema: SchemaDict, key: str, path: str, default: int) -> int: ...
def _count(schema: SchemaDict, key: str, path: str, default: int | None = None) -> int | None:
    """A non-negative integer keyword (``2.0`` counts as 2)."""
    value = schema.get(key, default)
    if value is default:
        return value
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, Decimal))
        or value < 0
        or value != int(value)
    ):
        raise ConstraintError(
            f"invalid schema: {key} must be a non-negative integer at {path}/{key}"
        )
    return int(value)


def _number_kw(schema: SchemaDict, key: str, path: str) -> Decimal | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise ConstraintError(f"invalid schema: {key} must be a number at {path}/{key}")
    return to_decimal(value)


def _bounds(
    schema: SchemaDict, plain: str, exclusive: str, path: str
) -> tuple[Decimal | None, Decimal | None]:
    """(inclusive bound, exclusive bound) of one side. Draft-04 wrote `exclusive` as a bool
    that makes `plain` exclusive (false: inclusive); later drafts, as a number of its own."""
    flag = schema.get(exclusive)
    if isinstance(flag, bool):
        bound = _number_kw(schema, plain, path)
        return (None, bound) if flag else (bound, None)
    return _number_kw(schema, plain, path), _number_kw(schema, exclusive, path)


def _number(schema: SchemaDict, path: str) -> NumT | None:
    lo, xlo = _bounds(schema, "minimum", "exclusiveMinimum", path)
    hi, xhi = _bounds(schema, "maximum", "exclusiveMaximum", path)
    mult = _number_kw(schema, "multipleOf", path)
    if mult is not None and mult <= 0:
        raise ConstraintError(f"invalid schema: multipleOf must be > 0 at {path}/multipleOf")
    spec = schema.get("type")
    names = [spec] if isinstance(spec, str) else spec or []
    t = NumT(
        integer=True if "integer" in names and "number" not in names else None,
        lo=lo,
        hi=hi,
        multiple_of=mult,
    )
    if xlo is not None and (lo is None or xlo >= lo):
        t = replace(t, lo=xlo, lo_excl=True)
    if xhi is not None and (hi is None or xhi <= hi):
        t = replace(t, hi=xhi, hi_excl=True)
    return normalize_num(t)


def _string(schema: SchemaDict, path: str) -> StrT | None:
    patterns: tuple[str, ...] = ()
    not_patterns: tuple[str, ...] = ()
    if "pattern" in schema:
        src = schema["pattern"]
        if not isinstance(src, str):
            raise ConstraintError(f"invalid schema: pattern must be a string at {path}/pattern")
        # lookaheads become patterns the string must (not) match; ConstraintError names a
        # construct that has no exact reading. A pattern with backreferences stays whole:
        # the check matches it (terms.matched), its widened form is read here
        if has_backreference(src):
            PatternMatch(StrT(patterns=(src,)))
            patterns = (src,)
        else:
            patterns, not_patterns = split_lookaheads(src)
        for part in patterns + not_patterns:
            if not has_backreference(part):
                parse_regex(part, "ecma")
    formats: tuple[str, ...] = ()
    if "format" in schema:
        name = schema["format"]
        if not isinstance(name, str):
            raise ConstraintError(f"invalid schema: format must be a string at {path}/format")
        if format_pattern(name) is None:
            # An unknown format is an annotation (JSON Schema: implementations that do not
            # know a format ignore it), so any string is allowed.
            _log.debug("ignoring the unknown format %r at %s/format", name, path)
        else:
            formats = (name,)
    return normalize_str(
        StrT(
            min_len=_count(schema, "minLength", path, 0),
            max_len=_count(schema, "maxLength", path),
            patterns=patterns,
            formats=formats,
            not_patterns=not_patterns,
        )
    )


def _array(schema: SchemaDict, path: str, sub: Sub) -> ArrT | None:
    items = schema.get("items")
    prefix_src = schema.get("prefixItems", items if isinstance(items, list) else [])
    if not isinstance(prefix_src, list):
        raise ConstraintError(f"invalid schema: prefixItems must be a list at {path}/prefixItems")
    key = "prefixItems" if "prefixItems" in schema else "items"
    prefix = tuple(sub(s, f"/{key}/{i}") for i, s in enumerate(prefix_src))
    rest, evaluated = TOP, False
    if "items" in schema and not isinstance(items, list):
        rest, evaluated = sub(items, "/items"), True
    elif isinstance(items, list) and "additionalItems" in schema:
        rest, evaluated = sub(schema["additionalItems"], "/additionalItems"), True
    contains: tuple[Contains, ...] = ()
    if "contains" in schema:
        lo = _count(schema, "minContains", path, 1)
        contains = (
            Contains(sub(schema["contains"], "/contains"), lo, _count(schema, "maxContains", path)),
        )
    unique = schema.get("uniqueItems", False)
    if not isinstance(unique, bool):
        raise ConstraintError(
            f"invalid schema: uniqueItems must be a boolean at {path}/uniqueItems"
        )
    return normalize_arr(
        ArrT(
            prefix=prefix,
            rest=rest,
            min_items=_count(schema, "minItems", path, 0),
            max_items=_count(schema, "maxItems", path),
            contains=contains,
            unique=unique,
            eval_prefix=len(prefix),
            eval_all=evaluated,
        )
    )


def _object(schema: SchemaDict, path: str, sub: Sub) -> ObjT | None:
    props = _schema_map(schema, "properties", path, sub)
    patterns = _schema_map(schema, "patternProperties", path, sub)
    for src, _ in patterns:
        for part in sum(split_lookaheads(src), ()):
            parse_regex(part, "ecma")
    has_additional = "additionalProperties" in schema
    additional = (
        sub(schema["additionalProperties"], "/additionalProperties") if has_additional else TOP
    )
    rules = (KeyRule(tuple(patterns), additional),) if patterns or has_additional else ()
    names = sub(schema["propertyNames"], "/propertyNames") if "propertyNames" in schema else TOP
    # a named key also takes the schemas of the patterns it matches
    props = [
        (k, conj_all([v] + [n for src, n in patterns if pattern_matcher(src).fullmatch(k)]))
        for k, v in props
    ]
    required = _required(schema, path)
    n_declared = len(props)
    probe = ObjT(props=tuple(props), rules=rules, names=names)
    props += [(k, key_node(probe, k)) for k in required if probe.prop(k) is None]
    return normalize_obj(
        ObjT(
            props=tuple(props),
            required=required,
            rules=rules,
            names=names,
            min_props=_count(schema, "minProperties", path, 0),
            max_props=_count(schema, "maxProperties", path),
            eval_names=frozenset(k for k in schema.get("properties", {})),
            eval_patterns=frozenset(src for src, _ in patterns),
            eval_all=has_additional,
            listed="properties" in schema or "required" in schema,
            undeclared=frozenset(k for k in required if k not in dict(props[:n_declared])),
        )
    )


def _schema_map(schema: SchemaDict, key: str, path: str, sub: Sub) -> list[tuple[str, Node]]:
    value = schema.get(key, {})
    if not isinstance(value, dict):
        raise ConstraintError(f"invalid schema: {key} must be an object at {path}/{key}")
    return [(k, sub(v, f"/{key}/{_escape(k)}")) for k, v in value.items()]


def _required(schema: SchemaDict, path: str) -> tuple[str, ...]:
    value = schema.get("required", [])
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise ConstraintError(
            f"invalid schema: required must be a list of strings at {path}/required"
        )
    return tuple(dict.fromkeys(value))


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def value_node(v: Any) -> Node:
    """The node of exactly one JSON value (``const``)."""
    if v is None:
        return make_node((NullT(),))
    if isinstance(v, bool):
        return make_node((BoolT(frozenset({v})),))
    if isinstance(v, (int, float, Decimal)):
        return make_node((NumT(values=frozenset({to_decimal(v)})),))
    if isinstance(v, str):
        return make_node((StrT(values=frozenset({v})),))
    if isinstance(v, list):
        items = tuple(value_node(x) for x in v)
        return make_node((ArrT(prefix=items, rest=NEVER, min_items=len(items)),))
    if isinstance(v, dict):
        props = tuple((k, value_node(x)) for k, x in v.items())
        return make_node(
            (ObjT(props=props, required=tuple(v), rules=(KeyRule((), NEVER),), any_order=True),)
        )
    raise ConstraintError(f"invalid schema: {v!r} is not a JSON value")
