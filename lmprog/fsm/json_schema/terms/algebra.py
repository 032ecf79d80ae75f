"""Intersection of nodes (``allOf``, ``$ref`` next to keywords, ``if`` and ``then``...).

Soundness rule: a meet returns ``None`` (empty) only when the facets certainly contradict, so
emptiness found here is real; ``normalize_*`` drop facets that others already decide. The
complement lives in ``complement``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache
from typing import Any, overload

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.terms.nodes import (
    NEVER,
    TOP,
    ArrT,
    BoolT,
    KeyRule,
    Node,
    NullT,
    NumT,
    ObjT,
    RefT,
    StrT,
    Term,
    Unroll,
    charge,
    make_node,
)
from lmprog.fsm.json_schema.terms.values import is_multiple, num_ok, pattern_matcher, str_ok

# ----------------------------------------------------------------------------- intersection

_MAX_PAIRS = 20000  # term pairs one intersection may meet (the normal form can explode)


@lru_cache(maxsize=65536)
def conj(a: Node, b: Node) -> Node:
    """The values in both ``a`` and ``b``."""
    if a.top or b.never:
        return b
    if b.top or a.never or a == b:
        return a
    if any(isinstance(t, RefT) for t in a.terms + b.terms):
        raise Unroll  # the values behind a recursive reference are needed
    if len(a.terms) * len(b.terms) > _MAX_PAIRS:
        raise ConstraintError(
            f"schema too complex: an intersection of {len(a.terms)} x {len(b.terms)} branches"
        )
    charge(len(a.terms) * len(b.terms))
    terms = [meet(x, y) for x in a.terms for y in b.terms if type(x) is type(y)]
    return make_node(terms)


def conj_all(nodes: Iterable[Node]) -> Node:
    out = TOP
    for n in nodes:
        out = conj(out, n)
    return out


MAX_SUBSUMED = 256  # terms of a node whose subsumed terms are looked for (pairs: its square)


def without_subsumed(node: Node) -> Node:
    """The node without the terms another of its terms contains (``meet(x, y) == x``: x is in
    y, the meet being exact or narrower; annotations equal, so that unevaluated* reads the
    same), the first of two equal sets kept. The same values: an intersection of unions
    (``neg`` over several terms) stays as small as its result instead of multiplying
    (``dynamic evaluation inside nested refs``: 16 terms at most, was over 16,384). Nodes of
    over MAX_SUBSUMED terms are left as they are."""
    terms = node.terms
    if not 2 < len(terms) <= MAX_SUBSUMED or any(isinstance(t, RefT) for t in terms):
        return node
    dropped: set[int] = set()
    for i, x in enumerate(terms):
        for j, y in enumerate(terms):
            if i == j or j in dropped or type(x) is not type(y) or _notes(x) != _notes(y):
                continue
            charge()
            if meet(x, y) == x:
                dropped.add(i)
                break
    if not dropped:
        return node
    return Node(tuple(t for i, t in enumerate(terms) if i not in dropped))


def _notes(t: Term) -> tuple[Any, ...]:
    """The annotations a term carries for unevaluated* (``eval_*``)."""
    return tuple(getattr(t, n, None) for n in _ANNOTATED)


_ANNOTATED = ("eval_prefix", "eval_all", "eval_names", "eval_patterns")


@overload
def meet(x: StrT, y: StrT) -> StrT | None: ...
@overload
def meet(x: Term, y: Term) -> Term | None: ...
def meet(x: Term, y: Term) -> Term | None:
    """The intersection of two terms of one type, or None when certainly empty."""
    return _MEETS[type(x)](x, y)


def _meet_null(x: NullT, y: NullT) -> NullT:
    return x


def _meet_bool(x: BoolT, y: BoolT) -> BoolT | None:
    values = x.values & y.values
    return BoolT(values) if values else None


def _tighter(
    a: Decimal | None,
    a_excl: bool,
    b: Decimal | None,
    b_excl: bool,
    pick: Callable[[Decimal, Decimal], Decimal],
) -> tuple[Decimal | None, bool]:
    if a is None:
        return b, b_excl
    if b is None or a != b:
        return (a, a_excl) if b is None or pick(a, b) == a else (b, b_excl)
    return a, a_excl or b_excl


def _lcm(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    if a is None or b is None:
        return a if b is None else b
    fa, fb = Fraction(a), Fraction(b)
    f = Fraction(math.lcm(fa.numerator, fb.numerator), math.gcd(fa.denominator, fb.denominator))
    with localcontext() as ctx:
        ctx.prec = 200
        return Decimal(f.numerator) / Decimal(f.denominator)


def _meet_num(x: NumT, y: NumT) -> NumT | None:
    if x.integer is not None and y.integer is not None and x.integer != y.integer:
        return None
    lo, lo_excl = _tighter(x.lo, x.lo_excl, y.lo, y.lo_excl, max)
    hi, hi_excl = _tighter(x.hi, x.hi_excl, y.hi, y.hi_excl, min)
    values = x.values if y.values is None else y.values if x.values is None else x.values & y.values
    return normalize_num(
        NumT(
            integer=x.integer if x.integer is not None else y.integer,
            lo=lo,
            lo_excl=lo_excl,
            hi=hi,
            hi_excl=hi_excl,
            multiple_of=_lcm(x.multiple_of, y.multiple_of),
            values=values,
            excluded=x.excluded | y.excluded,
            not_multiples=x.not_multiples | y.not_multiples,
        )
    )


def normalize_num(t: NumT) -> NumT | None:
    """Drop what other facets already decide; None when certainly empty."""
    if t.values is not None:
        free = replace(t, values=None)
        kept = frozenset(v for v in t.values if num_ok(free, v))
        return NumT(values=kept) if kept else None
    if t.not_multiples:
        kept_steps = _normalize_not_multiples(t)
        if kept_steps is None:
            return None
        t = kept_steps
    if t.lo is not None and t.hi is not None:
        if t.lo > t.hi or (t.lo == t.hi and (t.lo_excl or t.hi_excl)):
            return None
        if t.integer:
            lo, hi = integer_bounds(t)
            if lo is not None and hi is not None and lo > hi:
                return None
    free = replace(t, excluded=frozenset())
    excluded = frozenset(v for v in t.excluded if num_ok(free, v))
    return replace(t, excluded=excluded)


def _normalize_not_multiples(t: NumT) -> NumT | None:
    """Excluded steps: None where every value is a multiple of one (the step divides the
    ``multipleOf``, or 1 for integers); a single value is checked as it is."""
    steps = t.not_multiples
    if t.multiple_of is not None and any(is_multiple(t.multiple_of, m) for m in steps):
        return None
    if t.integer and any(is_multiple(Decimal(1), m) for m in steps):
        return None
    if t.lo is not None and t.lo == t.hi and not (t.lo_excl or t.hi_excl):
        return NumT(values=frozenset({t.lo})) if num_ok(t, t.lo) else None
    return t


def integer_bounds(t: NumT) -> tuple[int | None, int | None]:
    """The smallest and largest integers within the bounds of ``t`` (None = unbounded)."""
    lo = hi = None
    if t.lo is not None:
        lo = int(t.lo) if (t.lo == int(t.lo) and not t.lo_excl) else math.floor(t.lo) + 1
    if t.hi is not None:
        hi = int(t.hi) if (t.hi == int(t.hi) and not t.hi_excl) else math.ceil(t.hi) - 1
    return lo, hi


def _meet_str(x: StrT, y: StrT) -> StrT | None:
    values = x.values if y.values is None else y.values if x.values is None else x.values & y.values
    return normalize_str(
        StrT(
            min_len=max(x.min_len, y.min_len),
            max_len=y.max_len
            if x.max_len is None
            else x.max_len
            if y.max_len is None
            else min(x.max_len, y.max_len),
            patterns=x.patterns + tuple(p for p in y.patterns if p not in x.patterns),
            formats=x.formats + tuple(f for f in y.formats if f not in x.formats),
            values=values,
            excluded=x.excluded | y.excluded,
            not_patterns=x.not_patterns
            + tuple(p for p in y.not_patterns if p not in x.not_patterns),
        )
    )


def normalize_str(t: StrT) -> StrT | None:
    if t.values is not None:
        free = replace(t, values=None)
        kept = frozenset(v for v in t.values if str_ok(free, v))
        return StrT(values=kept) if kept else None
    if t.max_len is not None and t.min_len > t.max_len:
        return None
    if not (t.patterns or t.formats or t.not_patterns or t.min_len or t.max_len is not None):
        return t  # every excluded string is one of t's
    free = replace(t, excluded=frozenset())
    excluded = frozenset(v for v in t.excluded if str_ok(free, v))
    return t if excluded == t.excluded else replace(t, excluded=excluded)


def _meet_arr(x: ArrT, y: ArrT) -> ArrT | None:
    n = max(len(x.prefix), len(y.prefix))
    prefix = tuple(conj(_item(x, i), _item(y, i)) for i in range(n))
    return normalize_arr(
        ArrT(
            prefix=prefix,
            rest=conj(x.rest, y.rest),
            min_items=max(x.min_items, y.min_items),
            max_items=y.max_items
            if x.max_items is None
            else x.max_items
            if y.max_items is None
            else min(x.max_items, y.max_items),
            contains=x.contains + tuple(c for c in y.contains if c not in x.contains),
            unique=x.unique or y.unique,
            repeats=x.repeats or y.repeats,
            eval_prefix=max(x.eval_prefix, y.eval_prefix),
            eval_all=x.eval_all or y.eval_all,
        )
    )


def _item(t: ArrT, i: int) -> Node:
    return t.prefix[i] if i < len(t.prefix) else t.rest


def normalize_arr(t: ArrT) -> ArrT | None:
    cap = t.max_items
    for i, node in enumerate(t.prefix):
        if node.never:
            cap = i if cap is None else min(cap, i)
            break
    if t.rest.never:
        cap = len(t.prefix) if cap is None else min(cap, len(t.prefix))
    if cap is not None and t.min_items > cap:
        return None
    contains = []
    for c in t.contains:
        if c.node.never and c.lo > 0:
            return None
        if c.hi is not None and c.lo > c.hi:
            return None
        if not (c.lo == 0 and c.hi is None) and not c.node.never:
            contains.append(c)
    prefix = t.prefix if cap is None else t.prefix[:cap]
    unique = t.unique and (cap is None or cap > 1)
    if t.repeats and (unique or (cap is not None and cap < 2)):
        return None  # two equal items among distinct ones, or in fewer than two
    lo = max(t.min_items, 2) if t.repeats else t.min_items
    return replace(
        t, prefix=prefix, min_items=lo, max_items=cap, contains=tuple(contains), unique=unique
    )


def _meet_obj(x: ObjT, y: ObjT) -> ObjT | None:
    keys = _key_order(x, y)
    props = tuple((k, conj(key_node(x, k), key_node(y, k))) for k in keys)
    return normalize_obj(
        ObjT(
            props=props,
            required=x.required + tuple(k for k in y.required if k not in x.required),
            rules=x.rules + y.rules,
            names=conj(x.names, y.names),
            min_props=max(x.min_props, y.min_props),
            max_props=y.max_props
            if x.max_props is None
            else x.max_props
            if y.max_props is None
            else min(x.max_props, y.max_props),
            any_order=x.any_order and y.any_order,
            some=x.some + tuple(k for k in y.some if k not in x.some),
            some_values=x.some_values + tuple(f for f in y.some_values if f not in x.some_values),
            eval_names=x.eval_names | y.eval_names,
            eval_patterns=x.eval_patterns | y.eval_patterns,
            eval_all=x.eval_all or y.eval_all,
            listed=x.listed or y.listed,
            undeclared=(x.undeclared | y.undeclared) - _declared(x) - _declared(y),
            one_of=x.one_of + tuple(g for g in y.one_of if g not in x.one_of),
        )
    )


def _key_order(x: ObjT, y: ObjT) -> list[str]:
    """The named keys of a meet in canonical order: those declared by ``properties`` (``x``'s,
    then ``y``'s), then those only required (or named by a dependency)."""
    declared = [k for k, _ in x.props if k not in x.undeclared]
    declared += [k for k, _ in y.props if k not in y.undeclared]
    rest = [k for k, _ in x.props + y.props]
    return list(dict.fromkeys(declared + rest))


def _declared(t: ObjT) -> frozenset[str]:
    return frozenset(k for k, _ in t.props) - t.undeclared


def key_allowed(names: Node, key: str) -> bool:
    return names.top or any(isinstance(t, StrT) and str_ok(t, key) for t in names.terms)


def rule_node(rule: KeyRule, key: str) -> Node:
    """What one rule requires of the value of an unnamed ``key``."""
    matched = [node for src, node in rule.patterns if pattern_matcher(src).fullmatch(key)]
    return conj_all(matched) if matched else rule.additional


def key_node(t: ObjT, key: str) -> Node:
    """What ``t`` requires of the value at ``key`` (NEVER = the key must be absent)."""
    named = t.prop(key)
    if named is not None:
        return named
    if not key_allowed(t.names, key):
        return NEVER
    return conj_all(rule_node(r, key) for r in t.rules)


def normalize_obj(t: ObjT) -> ObjT | None:
    props = tuple((k, v if key_allowed(t.names, k) else NEVER) for k, v in t.props)
    if any(v.never for k, v in props if k in t.required):
        return None
    if t.max_props is not None and max(t.min_props, len(t.required)) > t.max_props:
        return None
    rules = _merge_rules(t.rules)
    closed = any(not r.patterns and r.additional.never for r in rules)
    if closed and sum(not v.never for _, v in props) < t.min_props:
        return None  # fewer keys may be written than minProperties asks
    if any(v.never for _, v in t.some_values):
        return None
    some = []
    for keys in t.some:  # facets a required key meets go; one nothing can meet empties t
        if any(k in t.required and key_allowed(keys, k) for k, _ in props):
            continue
        if closed and not any(key_allowed(keys, k) and not v.never for k, v in props):
            return None
        some.append(keys)
    return replace(t, props=props, rules=rules, some=tuple(some))


def _merge_rules(rules: tuple[KeyRule, ...]) -> tuple[KeyRule, ...]:
    """Rules without patterns are plain ``additionalProperties``: they meet into one."""
    plain = [r.additional for r in rules if not r.patterns]
    out = [r for r in rules if r.patterns and not _trivial(r)]
    if plain:
        merged = conj_all(plain)
        if not merged.top:
            out.insert(0, KeyRule((), merged))
    return tuple(dict.fromkeys(out))


def _trivial(rule: KeyRule) -> bool:
    return rule.additional.top and all(n.top for _, n in rule.patterns)


_MEETS: dict[type, Callable[[Any, Any], Term | None]] = {
    NullT: _meet_null,
    BoolT: _meet_bool,
    NumT: _meet_num,
    StrT: _meet_str,
    ArrT: _meet_arr,
    ObjT: _meet_obj,
}
