"""Complements (``not``, the else side of ``if``) and exactly-one (``oneOf``).

``neg`` applies De Morgan over a term's facets: not (integer and >= 2) = non-integer or < 2; each
facet's complement must be exact (a bound flips, an enum becomes an exclusion, a required key
becomes an absent one, a pattern a negated pattern...), and facets without one (``multipleOf``,
``uniqueItems``, ``patternProperties``...) raise ConstraintError.
"""

from __future__ import annotations

from functools import lru_cache

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.algebra import conj, conj_all, normalize_arr, normalize_obj
from lmprog.fsm.json_schema.formats import format_pattern
from lmprog.fsm.json_schema.terms import (
    FULL_TERMS,
    NEVER,
    TOP,
    ArrT,
    BoolT,
    Contains,
    Node,
    NullT,
    NumT,
    ObjT,
    RefT,
    StrT,
    Unroll,
    expand,
    make_node,
)


@lru_cache(maxsize=16384)
def neg(node: Node) -> Node:
    """The values not in ``node``; ConstraintError if a facet has no exact complement."""
    if node.top:
        return NEVER
    out = TOP
    for t in node.terms:
        out = conj(out, _neg_term(t))
    return out


def _neg_term(t) -> Node:
    if isinstance(t, RefT):
        raise Unroll
    others = [f for f in FULL_TERMS if type(f) is not type(t)]
    return make_node(others + list(_NEGATIONS[type(t)](t)))


def _neg_null(t: NullT):
    return []


def _neg_bool(t: BoolT):
    rest = frozenset({True, False}) - t.values
    return [BoolT(rest)] if rest else []


def _neg_num(t: NumT):
    if t.multiple_of is not None:
        raise ConstraintError("'not' over multipleOf has no exact regex")
    out = []
    if t.integer is not None:
        out.append(NumT(integer=not t.integer))
    if t.lo is not None:
        out.append(NumT(hi=t.lo, hi_excl=not t.lo_excl))
    if t.hi is not None:
        out.append(NumT(lo=t.hi, lo_excl=not t.hi_excl))
    if t.values is not None:
        out.append(NumT(excluded=t.values))
    if t.excluded:
        out.append(NumT(values=t.excluded))
    return out


def _neg_str(t: StrT):
    out = [StrT(not_patterns=(p,)) for p in t.patterns]
    out += [StrT(not_patterns=(format_pattern(f),)) for f in t.formats]
    out += [StrT(patterns=(p,)) for p in t.not_patterns]
    if t.min_len > 0:
        out.append(StrT(max_len=t.min_len - 1))
    if t.max_len is not None:
        out.append(StrT(min_len=t.max_len + 1))
    if t.values is not None:
        out.append(StrT(excluded=t.values))
    if t.excluded:
        out.append(StrT(values=t.excluded))
    return out


def _neg_arr(t: ArrT):
    if t.unique:
        raise ConstraintError("'not' over uniqueItems has no exact regex")
    out = []
    if t.min_items > 0:
        out.append(ArrT(max_items=t.min_items - 1))
    if t.max_items is not None:
        out.append(ArrT(min_items=t.max_items + 1))
    for i, item in enumerate(t.prefix):
        if not item.top:
            out.append(ArrT(prefix=(TOP,) * i + (neg(item),), min_items=i + 1))
    if not t.rest.top and not t.rest.never:  # rest NEVER is the max_items cap, negated above
        if t.prefix:
            raise ConstraintError("'not' over items after prefixItems has no exact regex")
        out.append(ArrT(contains=(Contains(neg(t.rest)),)))
    for c in t.contains:
        if c.lo > 0:
            out.append(ArrT(contains=(Contains(c.node, 0, c.lo - 1),)))
        if c.hi is not None:
            out.append(ArrT(contains=(Contains(c.node, c.hi + 1, None),)))
    return [a for a in (normalize_arr(x) for x in out) if a is not None]


def _neg_obj(t: ObjT):
    """not (every facet) = some facet broken: a named value in its complement, a required key
    missing, a key beyond a closed object's properties or outside propertyNames (``some``
    facets), a count out of range, every key outside a ``some`` set. ``additionalProperties``
    other than false, and ``patternProperties``, would need some member's value broken, which
    a key written twice can hide (the last one counts): refused."""
    if any(r.patterns or not r.additional.never for r in t.rules):
        raise ConstraintError(
            "'not' over additionalProperties (other than false)/patternProperties has no exact "
            "grammar"
        )
    out = []
    for k, v in t.props:
        if not v.top:
            out.append(ObjT(props=((k, neg(v)),), required=(k,)))
    for k in t.required:
        out.append(ObjT(props=((k, NEVER),)))
    if t.rules:  # closed: a key other than the named ones
        others = StrT(excluded=frozenset(k for k, _ in t.props))
        out.append(ObjT(some=(make_node((others,)),)))
    if not t.names.top:
        outside = _strings(neg(t.names))
        if not outside.never:
            out.append(ObjT(some=(outside,)))
    for keys in t.some:
        out.append(ObjT(names=_strings(neg(keys))))
    if t.min_props > 0:
        out.append(ObjT(max_props=t.min_props - 1))
    if t.max_props is not None:
        out.append(ObjT(min_props=t.max_props + 1))
    return [o for o in (normalize_obj(x) for x in out) if o is not None]


def _strings(node: Node) -> Node:
    """The string terms of a node (a set of keys)."""
    return make_node(tuple(t for t in expand(node) if isinstance(t, StrT)))


_NEGATIONS = {
    NullT: _neg_null,
    BoolT: _neg_bool,
    NumT: _neg_num,
    StrT: _neg_str,
    ArrT: _neg_arr,
    ObjT: _neg_obj,
}


def disjoint(a: Node, b: Node) -> bool:
    """True only when no value is in both (a sound, incomplete test)."""
    return conj(a, b).never


def one_of(branches: list[Node]) -> Node:
    """Values in exactly one branch: a plain union when the branches are pairwise disjoint,
    else each branch minus the union of the others (needs exact complements)."""
    if all(disjoint(a, b) for i, a in enumerate(branches) for b in branches[i + 1 :]):
        return make_node(tuple(t for n in branches for t in expand(n)))
    out = []
    for i, b in enumerate(branches):
        others = [o for j, o in enumerate(branches) if j != i]
        out.append(conj_all([b] + [neg(o) for o in others]))
    return make_node(tuple(t for n in out for t in expand(n)))
