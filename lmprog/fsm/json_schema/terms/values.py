"""Checks of single decoded values against term facets (used to filter finite sets: enum/const
values, property names) and JSON Schema equality of values."""

from __future__ import annotations

from collections.abc import Hashable
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Any, Protocol

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.terms.formats import format_pattern
from lmprog.fsm.json_schema.terms.nodes import (
    ArrT,
    BoolT,
    Node,
    NullT,
    NumT,
    ObjT,
    StrT,
    Term,
    is_full,
)
from lmprog.fsm.regex import parse_regex, value_matcher
from lmprog.fsm.regex.backrefs import has_backreference
from lmprog.fsm.regex.lookahead import split_lookaheads


@lru_cache(maxsize=4096)
def pattern_matcher(source: str) -> Matcher:
    """``fullmatch`` of the returned pattern = JSON Schema ``pattern`` (search) semantics
    (lookaheads as ``split_lookaheads`` reads them)."""
    if has_backreference(source):
        return _Searched(source)
    must, must_not = split_lookaheads(source)
    if must == (source,) and not must_not:
        return value_matcher(parse_regex(source, "ecma"))
    return _Lookaheads(
        tuple(value_matcher(parse_regex(p, "ecma")) for p in must),
        tuple(value_matcher(parse_regex(p, "ecma")) for p in must_not),
    )


class Matcher(Protocol):
    """What tests a string against a pattern: a ``re.Pattern``, or ``_Lookaheads``."""

    def fullmatch(self, s: str, /) -> object: ...


class _Lookaheads:
    """A pattern with lookaheads: patterns a string must match and patterns it must not."""

    def __init__(self, must: tuple[Matcher, ...], must_not: tuple[Matcher, ...]) -> None:
        self.must, self.must_not = must, must_not

    def fullmatch(self, s: str) -> bool:
        return all(p.fullmatch(s) for p in self.must) and not any(
            p.fullmatch(s) for p in self.must_not
        )


class _Searched:
    """A pattern with backreferences, matched exactly (``matched.search``)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fullmatch(self, s: str) -> bool:
        from lmprog.fsm.json_schema.terms.matched import search

        return search(self.source, s)


@lru_cache(maxsize=64)
def format_matcher(name: str) -> Matcher:
    pattern = format_pattern(name)
    if pattern is None:
        raise ConstraintError(f"unsupported format {name!r}")
    return pattern_matcher(pattern)


def str_ok(t: StrT, s: str) -> bool:
    """Whether string ``s`` satisfies every facet of ``t``."""
    return (
        t.min_len <= len(s)
        and (t.max_len is None or len(s) <= t.max_len)
        and all(pattern_matcher(p).fullmatch(s) for p in t.patterns)
        and all(format_matcher(f).fullmatch(s) for f in t.formats)
        and not any(_matches_either(p, s) for p in t.not_patterns)
        and (t.values is None or s in t.values)
        and s not in t.excluded
    )


def _matches_either(source: str, s: str) -> bool:
    """Whether ``s`` holds a match of a pattern it must not match (with backreferences: by
    either engine, ``matched.search``)."""
    if has_backreference(source):
        from lmprog.fsm.json_schema.terms.matched import search

        return search(source, s, either=True)
    return bool(pattern_matcher(source).fullmatch(s))


def is_multiple(d: Decimal, m: Decimal) -> bool:
    return (Fraction(d) / Fraction(m)).denominator == 1


def num_ok(t: NumT, d: Decimal) -> bool:
    """Whether number ``d`` satisfies every facet of ``t``."""
    integral = d == d.to_integral_value()
    return (
        (t.integer is None or t.integer == integral)
        and (t.lo is None or d > t.lo or (d == t.lo and not t.lo_excl))
        and (t.hi is None or d < t.hi or (d == t.hi and not t.hi_excl))
        and (t.multiple_of is None or is_multiple(d, t.multiple_of))
        and not any(is_multiple(d, m) for m in t.not_multiples)
        and (t.values is None or d in t.values)
        and d not in t.excluded
    )


def to_decimal(x: Decimal | float | int | str) -> Decimal:
    """A JSON number as an exact Decimal (floats through their shortest repr)."""
    if isinstance(x, Decimal):
        return x
    if isinstance(x, float):
        if x != x or x in (float("inf"), float("-inf")):
            raise ConstraintError(f"non-finite number {x!r} in schema")
        return Decimal(repr(x))
    return Decimal(x)


def value_key(v: Any) -> Hashable:
    """A hashable key under JSON Schema equality (1 == 1.0, true != 1, key order ignored)."""
    if v is None or isinstance(v, bool):
        return ("c", v)
    if isinstance(v, (int, float, Decimal)):
        return ("n", to_decimal(v))
    if isinstance(v, str):
        return ("s", v)
    if isinstance(v, list):
        return ("a", tuple(value_key(x) for x in v))
    return ("o", frozenset((k, value_key(x)) for k, x in v.items()))


def plain_object(t: ObjT) -> bool:
    """Whether an object's membership in ``t`` follows from its members' values alone, each
    told by ``in_object``: named properties (required or not) whose values are scalars or
    any array or object, and nothing else (no other keys' rules, propertyNames, counts)."""
    return (
        not t.rules
        and t.names.top
        and not t.min_props
        and t.max_props is None
        and not (t.some or t.some_values or t.one_of)
        and all(_plain(v) for _, v in t.props)
    )


def _plain(node: Node) -> bool:
    return node.top or all(
        isinstance(x, (NullT, BoolT, NumT, StrT)) or isinstance(x, (ArrT, ObjT)) and is_full(x)
        for x in node.terms
    )


def in_object(t: ObjT, v: dict[str, Any]) -> bool:
    """Whether the object ``v`` (numbers as Decimal) is in the ``plain_object`` ``t``."""
    return all(k in v for k in t.required) and all(
        k not in v or in_node(node, v[k]) for k, node in t.props
    )


def in_node(node: Node, v: Any) -> bool:
    """Whether the value ``v`` is in a node of ``plain_object``'s values."""
    return node.top or any(_in_term(x, v) for x in node.terms)


def _in_term(t: Term, v: Any) -> bool:
    if v is None:
        return isinstance(t, NullT)
    if isinstance(v, bool):
        return isinstance(t, BoolT) and v in t.values
    if isinstance(v, (int, Decimal)):
        return isinstance(t, NumT) and num_ok(t, to_decimal(v))
    if isinstance(v, str):
        return isinstance(t, StrT) and str_ok(t, v)
    return isinstance(t, ArrT if isinstance(v, list) else ObjT)  # (full: _plain)
