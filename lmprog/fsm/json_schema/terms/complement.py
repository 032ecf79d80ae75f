"""Complements (``not``, the else side of ``if``) and exactly-one (``oneOf``).

``neg`` applies De Morgan over a term's facets: not (integer and >= 2) = non-integer or < 2; each
facet's complement must be exact (a bound flips, an enum becomes an exclusion, a required key
becomes an absent one, a pattern a negated pattern, a ``multipleOf`` a step to avoid...), and
facets without one raise ConstraintError. Two complements need a condition that the token
engine checks as it decodes (``lmprog.fsm.checks``): not ``uniqueItems`` is an array with two
equal items (``repeats``), and not ``additionalProperties``/``patternProperties`` an object
with a member whose value breaks them (``some_values``), its keys then checked distinct.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.terms.algebra import (
    conj,
    conj_all,
    key_node,
    meet,
    normalize_arr,
    normalize_obj,
    without_subsumed,
)
from lmprog.fsm.json_schema.terms.formats import format_source
from lmprog.fsm.json_schema.terms.nodes import (
    FULL_TERMS,
    NEVER,
    TOP,
    ArrT,
    BoolT,
    Contains,
    KeyRule,
    Node,
    NullT,
    NumT,
    ObjT,
    RefT,
    StrT,
    Term,
    Unroll,
    expand,
    make_node,
    trial,
    union,
)
from lmprog.fsm.json_schema.terms.values import plain_object


@lru_cache(maxsize=16384)
def neg(node: Node, within: Node | None = None) -> Node:
    """The values not in ``node``; ConstraintError if a facet has no exact complement. With
    ``within``, only its values matter: the result agrees with the complement on them, and
    leaves out ways of breaking ``node`` that none of them has (a property ``within``'s objects
    never hold), which need not be built (``oneOf`` over closed objects)."""
    if node.top:
        return NEVER
    if within is not None and (within.top or any(isinstance(t, RefT) for t in within.terms)):
        within = None
    out = TOP
    for t in node.terms:  # (terms another holds dropped as it goes: the product stays small)
        out = without_subsumed(conj(out, _neg_term(t, within)))
    return out


def _neg_term(t: Term, within: Node | None) -> Node:
    if isinstance(t, RefT):
        raise Unroll
    others: list[Term] = [f for f in FULL_TERMS if type(f) is not type(t)]
    if isinstance(t, ObjT):
        return make_node(others + _neg_obj(t, within))
    return make_node(others + list(_NEGATIONS[type(t)](t)))


def _neg_null(t: NullT) -> list[NullT]:
    return []


def _neg_bool(t: BoolT) -> list[BoolT]:
    rest = frozenset({True, False}) - t.values
    return [BoolT(rest)] if rest else []


def _neg_num(t: NumT) -> list[NumT]:
    out = []
    if t.multiple_of is not None:  # written as numbers minus the multiples (emit.numbers)
        out.append(NumT(not_multiples=frozenset({t.multiple_of})))
    out += [NumT(multiple_of=m) for m in sorted(t.not_multiples)]
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


def _neg_str(t: StrT) -> list[StrT]:
    out = [StrT(not_patterns=(p,)) for p in t.patterns]
    out += [StrT(not_patterns=(format_source(f),)) for f in t.formats]
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


def _neg_arr(t: ArrT) -> list[ArrT]:
    out = []
    if t.unique:  # two equal items (checked as decoded, lmprog.fsm.checks)
        out.append(ArrT(repeats=True))
    if t.repeats:
        out.append(ArrT(unique=True))
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


def _neg_obj(t: ObjT, within: Node | None = None) -> list[Term]:
    """not (every facet) = some facet broken: a named value in its complement, a required key
    missing (one term where a key is both: absent, or present with a value outside its
    schema, so that ``oneOf`` over n objects with a typed required key each stays n terms
    instead of 2**n), a key beyond a closed object's properties or outside propertyNames (``some``
    facets), a count out of range, every key outside a ``some`` set, a member the rules do not
    name with its value outside what they require (``some_values``: a key matching a pattern
    with a value outside its schema, a key matching none with one outside
    additionalProperties; its key is then checked distinct as decoded, since a later member
    with the same key would replace it), every such member's value outside a ``some_values``
    set. With ``within``, a named value is negated only within what its objects allow there,
    and not at all where they never hold that key."""
    if t.one_of:
        raise ConstraintError(
            "'not' (or 'oneOf' around it) over a 'oneOf' of objects checked as decoded has no "
            "exact grammar"
        )
    contexts = None if within is None else [x for x in within.terms if isinstance(x, ObjT)]
    if contexts == []:
        return []
    named = frozenset(k for k, _ in t.props)
    required = frozenset(t.required)
    out = []
    merged = set()  # required keys whose absence the value's term already says
    for k, v in t.props:
        if v.top:
            continue
        inner = None if contexts is None else union(*(key_node(x, k) for x in contexts))
        if inner is None or not inner.never:
            if k in required:  # absent, or present with another value: one term, not two
                out.append(ObjT(props=((k, neg(v, inner)),)))
                merged.add(k)
            else:
                out.append(ObjT(props=((k, neg(v, inner)),), required=(k,)))
    for k in t.required:
        if k not in merged:
            out.append(ObjT(props=((k, NEVER),)))
    for r in t.rules:
        sources = tuple(src for src, _ in r.patterns)
        for src, node in r.patterns:
            if not node.top:
                keys = StrT(patterns=(src,), excluded=named)
                out.append(ObjT(some_values=((keys, neg(node)),)))
        others = StrT(not_patterns=sources, excluded=named)
        if r.additional.never:  # closed: a key other than the named ones and the patterns'
            out.append(ObjT(some=(make_node((others,)),)))
        elif not r.additional.top:
            out.append(ObjT(some_values=((others, neg(r.additional)),)))
    if not t.names.top:
        outside = _strings(neg(t.names))
        if not outside.never:
            out.append(ObjT(some=(outside,)))
    for some in t.some:
        out.append(ObjT(names=_strings(neg(some))))
    for keys, value in t.some_values:
        out.append(_every(keys, neg(value)))
    if t.min_props > 0:
        out.append(ObjT(max_props=t.min_props - 1))
    if t.max_props is not None:
        out.append(ObjT(min_props=t.max_props + 1))
    return [o for o in (normalize_obj(x) for x in out) if o is not None]


def _within(x: ObjT, y: ObjT) -> bool:
    """Whether every object of the plain object term ``x`` is in ``y`` (a sound test)."""
    m = meet(x, y)
    return isinstance(m, ObjT) and (sorted(m.props, key=repr), sorted(m.required)) == (
        sorted(x.props, key=repr),
        sorted(x.required),
    )


def _every(keys: StrT, value: Node) -> ObjT:
    """Objects whose members with a key in ``keys`` (a ``some_values`` key set: the keys
    matching a pattern, or matching none of some patterns, less some names) all have their
    value in ``value``."""
    free = tuple((k, TOP) for k in sorted(keys.excluded))  # named: the rule does not apply
    if len(keys.patterns) == 1 and not keys.not_patterns:
        rule = KeyRule(((keys.patterns[0], value),), TOP)
    elif not keys.patterns:
        rule = KeyRule(tuple((p, TOP) for p in keys.not_patterns), value)
    else:
        raise ConstraintError("'not' over this set of keys has no exact grammar")
    return ObjT(props=free, rules=(rule,))


def _strings(node: Node) -> Node:
    """The string terms of a node (a set of keys)."""
    return make_node(tuple(t for t in expand(node) if isinstance(t, StrT)))


_NEGATIONS: dict[type, Callable[[Any], Sequence[Term]]] = {
    NullT: _neg_null,
    BoolT: _neg_bool,
    NumT: _neg_num,
    StrT: _neg_str,
    ArrT: _neg_arr,
}


def disjoint(a: Node, b: Node) -> bool:
    """True only when no value is in both (a sound, incomplete test)."""
    return conj(a, b).never


def one_of(branches: list[Node]) -> Node:
    """Values in exactly one branch: a plain union when the branches are pairwise disjoint,
    else each branch minus the union of the others it meets (needs exact complements)."""
    apart = {
        (i, j): disjoint(a, b)
        for i, a in enumerate(branches)
        for j, b in enumerate(branches[i + 1 :], i + 1)
    }
    if all(apart.values()):
        return make_node(tuple(t for n in branches for t in expand(n)))
    checked = _checked_one_of(branches)
    try:
        with trial():
            out = []
            for i, b in enumerate(branches):
                others = [
                    o for j, o in enumerate(branches) if j != i and not apart[min(i, j), max(i, j)]
                ]
                out.append(conj_all([b] + [neg(o, b) for o in others]))
            return make_node(tuple(t for n in out for t in expand(n)))
    except ConstraintError:
        if checked is None:
            raise
        return checked()


def _checked_one_of(branches: list[Node]) -> Callable[[], Node] | None:
    """Where each branch holds at most one object term, a plain one (``values.plain_object``):
    a way to build ``oneOf`` without the complements of the objects, whose intersections
    multiply (n branches each requiring k typed keys: k**(n - 1) terms a branch). Values of
    other types are in exactly one branch as the algebra has it; an object, as each branch
    has it, with ``one_of`` naming the object branches, which the check counts as decoded
    (the grammar writes each branch alone). None where a branch does not fit."""
    objects: list[ObjT | None] = []
    for b in branches:
        found = [t for t in expand(b) if isinstance(t, ObjT)]
        if len(found) > 1 or found and not plain_object(found[0]) or b.top:
            return None
        objects.append(found[0] if found else None)
    group = tuple(t for t in objects if t is not None)

    def build() -> Node:
        others = [make_node(t for t in b.terms if not isinstance(t, ObjT)) for b in branches]
        rest = one_of(others) if len(others) > 1 else others[0]
        marked = (group,) if len(group) > 1 else ()
        # a branch within another is in two wherever it holds: never written (a text along
        # it could not end)
        written = [
            t
            for i, t in enumerate(group)
            if not any(_within(t, u) for u in group[:i] + group[i + 1 :])
        ]
        return union(rest, make_node(replace(t, one_of=marked) for t in written))

    return build
