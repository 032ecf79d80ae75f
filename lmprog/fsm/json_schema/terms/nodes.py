"""The intermediate form of a schema: a union of single-type terms.

A schema compiles to a ``Node``: the set of JSON values it accepts, written as a union (DNF) of
*terms*. Each term holds one JSON type and a conjunction of that type's facets (bounds, lengths,
properties, ...). ``allOf`` becomes a cross product of meets, ``anyOf`` a union, ``not`` a
complement by De Morgan over facets; emission then turns each term into a regex. The form is
immutable and hashable, so equal sub-schemas compile once.

Annotations that only ``unevaluatedProperties``/``unevaluatedItems`` read (``eval_*`` fields)
travel with the terms but do not change the set of values a term accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import Any, TypeAlias

from lmprog.core.errors import ConstraintError
from lmprog.fsm.deadline import tick


def _cache_hash(cls: Any) -> Any:  # (a class decorator: the class keeps its type)
    """Frozen dataclasses hash their whole subtree on every call; cache it per object."""
    generated = cls.__hash__

    def __hash__(self: Any) -> int:
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = generated(self)
            object.__setattr__(self, "_hash", cached)
        return cached

    cls.__hash__ = __hash__
    return cls


@_cache_hash
@dataclass(frozen=True)
class Node:
    """A set of JSON values: the union of ``terms``; ``top`` = every value."""

    terms: tuple[Term, ...] = ()
    top: bool = False

    @property
    def never(self) -> bool:
        return not self.top and not self.terms


TOP = Node(top=True)
NEVER = Node()


@_cache_hash
@dataclass(frozen=True)
class NullT:
    pass


@_cache_hash
@dataclass(frozen=True)
class BoolT:
    values: frozenset[bool] = frozenset({True, False})


@_cache_hash
@dataclass(frozen=True)
class NumT:
    """A number; ``integer`` True = integers only, False = non-integers only;
    ``not_multiples``: steps it must not be a multiple of (``not`` over ``multipleOf``)."""

    integer: bool | None = None
    lo: Decimal | None = None
    lo_excl: bool = False
    hi: Decimal | None = None
    hi_excl: bool = False
    multiple_of: Decimal | None = None
    values: frozenset[Decimal] | None = None  # finite set of allowed values (enum/const)
    excluded: frozenset[Decimal] = frozenset()
    not_multiples: frozenset[Decimal] = frozenset()


@_cache_hash
@dataclass(frozen=True)
class StrT:
    """A string; lengths count code points; ``patterns`` are ECMA sources (search semantics)
    it must match, ``not_patterns`` ones (formats as their patterns) it must not."""

    min_len: int = 0
    max_len: int | None = None
    patterns: tuple[str, ...] = ()
    formats: tuple[str, ...] = ()
    values: frozenset[str] | None = None
    excluded: frozenset[str] = frozenset()
    not_patterns: tuple[str, ...] = ()


@_cache_hash
@dataclass(frozen=True)
class Contains:
    """Between ``lo`` and ``hi`` items of the array are in ``node``."""

    node: Node
    lo: int = 1
    hi: int | None = None


@_cache_hash
@dataclass(frozen=True)
class ArrT:
    prefix: tuple[Node, ...] = ()  # Nodes for the first items
    rest: Node = TOP  # every later item
    min_items: int = 0
    max_items: int | None = None
    contains: tuple[Contains, ...] = ()  # Contains, all of which hold
    unique: bool = False
    repeats: bool = False  # some two items are equal (``not`` over uniqueItems)
    eval_prefix: int = 0
    eval_all: bool = False


@_cache_hash
@dataclass(frozen=True)
class KeyRule:
    """What one schema says about keys its ``properties`` do not name: a key matching some
    ``patterns`` takes all their schemas, any other key takes ``additional``."""

    patterns: tuple[tuple[str, Node], ...] = ()  # (ECMA source, Node)
    additional: Node = TOP


@_cache_hash
@dataclass(frozen=True)
class ObjT:
    """An object. Every required key is in ``props``; a named key's node already includes what
    the ``rules`` say about it, so rules only govern keys that ``props`` does not name."""

    props: tuple[tuple[str, Node], ...] = ()  # (key, Node) in canonical (declaration) order
    required: tuple[str, ...] = ()
    rules: tuple[KeyRule, ...] = ()  # KeyRule, all of which hold
    names: Node = TOP  # propertyNames
    min_props: int = 0
    max_props: int | None = None
    any_order: bool = False  # emit every key order (small const objects)
    some: tuple[Node, ...] = ()  # Nodes (sets of keys): for each, a key of the object is in it
    # (keys StrT, value Node) pairs: for each, a member whose key is in keys has its value in
    # value (``not`` over additionalProperties/patternProperties; keys distinct, checked as
    # decoded, so that no later member with the same key replaces it)
    some_values: tuple[tuple[StrT, Node], ...] = ()
    eval_names: frozenset[str] = frozenset()
    eval_patterns: frozenset[str] = frozenset()
    eval_all: bool = False
    # the schema lists the object's keys (``properties`` or ``required``, even empty): strict
    # generation writes no other key unless a keyword governs them (``strict``)
    listed: bool = False
    # keys of ``props`` that no ``properties`` declared (only ``required`` or a dependency
    # names them): where terms meet, declared keys come first, in the order they are declared
    # (``algebra._meet_obj``), as llguidance orders them
    undeclared: frozenset[str] = frozenset()
    # sets of branches (plain objects: ``values.plain_object``) of which the object is in
    # exactly one: ``oneOf`` whose complements would multiply (``complement.one_of``), checked
    # as decoded (lmprog.fsm.checks), the grammar writing the branch alone
    one_of: tuple[tuple[ObjT, ...], ...] = ()

    def prop(self, key: str) -> Node | None:
        for k, v in self.props:
            if k == key:
                return v
        return None


def counts_additional_keys(t: ObjT) -> bool:
    """Whether ``minProperties`` may need two or more keys that ``props`` does not name (when
    only the required keys are written): the grammar then counts every additional member
    toward it, and the guide checks as it decodes that the object's keys are distinct
    (lmprog.fsm.checks). One such key needs no check: a repeat of it still leaves a key the
    schema does not name."""
    return t.min_props - len(t.required) >= 2


@_cache_hash
@dataclass(frozen=True)
class RefT:
    """The values of a schema reached again while it is being built (a recursive ``$ref``):
    a named rule of the grammar whose body is the node built for that schema. Opaque to the
    algebra: an intersection or complement that would look inside raises ``Unroll`` (the
    compiler then unrolls the recursion to a bounded depth instead)."""

    key: tuple[Any, ...]  # (compile serial, id of the target schema, its base URI)


# A term: the values of one JSON type the schema allows (or a reference to a schema's rule).
Term: TypeAlias = "NullT | BoolT | NumT | StrT | ArrT | ObjT | RefT"


# RefT key -> the node of its schema (``read.builder.Builder.bodies``)
Bodies: TypeAlias = "dict[tuple[Any, ...], Node]"


class Unroll(Exception):
    """An operation needed the values behind a RefT."""


# ---- the work one compile may do ---------------------------------------------------------
# Counted in units (a schema object built, a pair of terms met), so that a schema whose
# compilation would blow up (references expanded inside references, normal forms multiplying)
# is refused after a bounded, machine-independent amount of work.
_WORK: ContextVar[list[int] | None] = ContextVar("lmprog_schema_work", default=None)


@contextmanager
def work_limit(units: int) -> Iterator[None]:
    token = _WORK.set([units, units])
    try:
        yield
    finally:
        _WORK.reset(token)


@contextmanager
def trial() -> Iterator[None]:
    """A first way of compiling something: the work it spent is given back if it raises
    ConstraintError, for the way tried next."""
    budget = _WORK.get()
    left = None if budget is None else budget[0]
    try:
        yield
    except ConstraintError:
        if budget is not None and left is not None:
            budget[0] = left
        raise


def charge(units: int = 1) -> None:
    """Spend work units; ConstraintError past the limit of the compile in progress."""
    tick()
    budget = _WORK.get()
    if budget is not None:
        budget[0] -= units
        if budget[0] < 0:
            raise ConstraintError(
                f"schema too complex: compiling it takes more than max_work={budget[1]:,} "
                "steps (references expanded within references, or unions and intersections "
                "multiplying); simplify the schema or raise max_work"
            )


TERM_TYPES = (NullT, BoolT, NumT, StrT, ArrT, ObjT)
FULL_TERMS = tuple(t() for t in TERM_TYPES)
TYPE_NAMES = {
    "null": NullT,
    "boolean": BoolT,
    "number": NumT,
    "integer": NumT,
    "string": StrT,
    "array": ArrT,
    "object": ObjT,
}
_ANNOTATIONS = {"eval_prefix", "eval_all", "eval_names", "eval_patterns"}


def _split_fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    names = [f.name for f in fields(cls)]
    return tuple(n for n in names if n not in _ANNOTATIONS), tuple(
        n for n in names if n in _ANNOTATIONS
    )


_FIELDS = {cls: _split_fields(cls) for cls in TERM_TYPES}
_FULL = dict(zip(TERM_TYPES, FULL_TERMS))


def has_annotations(term: Term) -> bool:
    if isinstance(term, RefT):
        return False
    full = _FULL[type(term)]
    return any(getattr(term, n) != getattr(full, n) for n in _FIELDS[type(term)][1])


def is_full(term: Term) -> bool:
    """Whether the term accepts every value of its type (annotations aside)."""
    if isinstance(term, RefT):
        return False
    full = _FULL[type(term)]
    return all(getattr(term, n) == getattr(full, n) for n in _FIELDS[type(term)][0])


def full_node(*types: type) -> Node:
    return make_node(tuple(t() for t in types))


def make_node(terms: Iterable[Term | None], limit: int = 512) -> Node:
    """A normalized union: duplicates dropped, value-only terms merged, terms subsumed by an
    unannotated full term of their type dropped, and all-full unions turned into ``TOP``."""
    tick()
    out = list(dict.fromkeys(t for t in terms if t is not None))
    if len(out) > 1:
        out = _merge_value_terms(out)
    # an unannotated full term subsumes the other terms of its type, unless they carry
    # annotations that unevaluated* keywords may still read
    kept = [(t, is_full(t) or has_annotations(t)) for t in out]
    full = {type(t) for t, keep in kept if keep and not has_annotations(t)}
    out = [t for t, keep in kept if keep or type(t) not in full]
    if len(full) == len(TERM_TYPES) and len(out) == len(TERM_TYPES):
        return TOP
    if len(out) > limit:
        raise ConstraintError(f"schema too complex: its normal form has over {limit} branches")
    return Node(tuple(out))


def _merge_value_terms(terms: list[Term]) -> list[Term]:
    """``enum``-style terms of one type (only ``values`` set) merge into one term, at the place
    of the first (their values joined once: an enum of 100,000 strings is 100,000 terms)."""
    place: dict[Callable[..., Term], int] = {}  # by the term's class
    values: dict[Callable[..., Term], list[frozenset[Any]]] = {}
    out: list[Term] = []
    for t in terms:
        kind: Callable[..., Term] = type(t)
        if (
            isinstance(t, (BoolT, NumT, StrT))
            and t.values is not None
            and t == kind(values=t.values)
        ):
            if kind in place:
                values[kind].append(t.values)
                continue
            place[kind], values[kind] = len(out), [t.values]
        out.append(t)
    for kind, i in place.items():
        if len(values[kind]) > 1:
            out[i] = kind(values=frozenset().union(*values[kind]))
    return out


def union(*nodes: Node) -> Node:
    """Values in any node (annotated terms survive next to ``TOP`` for unevaluated*)."""
    return make_node(tuple(t for n in nodes for t in expand(n)))


def expand(node: Node) -> tuple[Term, ...]:
    """The terms of a node, with ``TOP`` spelled out as one full term per type."""
    return FULL_TERMS if node.top else node.terms
