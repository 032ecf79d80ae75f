"""Arrays: prefix items, the items after them, item counts, ``contains`` and ``uniqueItems``.

Items are written ``[ws item (ws , ws item)* ws]``; ``contains`` as runs around the matching
items, or position by position with the matches counted (``_Counted``). ``uniqueItems`` is exact
over small finite item sets; over other items the guide checks it as the text is decoded
(``lmprog.fsm.checks``). Design: docs/design/json-schema.md.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace
from typing import Any

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.emit.lark import EPS, Frag, choice, opt, rep, seq, unique
from lmprog.fsm.json_schema.emit.sequences import Slot, separated
from lmprog.fsm.json_schema.emit.writer import Writer
from lmprog.fsm.json_schema.terms.algebra import conj
from lmprog.fsm.json_schema.terms.complement import neg
from lmprog.fsm.json_schema.terms.nodes import ArrT, Contains, Node
from lmprog.fsm.json_schema.terms.values import value_key


def array_regex(t: ArrT, em: Writer) -> Frag | None:
    if t.unique:
        return _unique_arrays(t, em)
    if t.repeats:  # two equal items: checked as the text is decoded (lmprog.fsm.checks)
        em.check(t)
        return array_regex(replace(t, repeats=False), em)
    if t.contains:
        return em.container("[", *_contains_items(t, em), "]")
    prefix = [em.node(n) for n in t.prefix]
    rest = em.node(t.rest)
    return em.container("[", *_items(prefix, rest, t.min_items, t.max_items, em.sep), "]")


def _items(
    prefix: list[Frag | None], rest: Frag | None, lo: int, hi: int | None, sep: Frag | None
) -> tuple[Frag | None, bool]:
    """(non-empty item sequences, empty allowed) for prefix items then ``rest`` items."""
    n = len(prefix)
    if n == 0:
        return separated([Slot(rest, lo, hi)], sep)
    tail = rep(seq(sep, rest), max(0, lo - n), None if hi is None else hi - n)
    for i in range(n - 1, 0, -1):
        step = seq(sep, prefix[i], tail)
        tail = step if i < lo else opt(step)
    return seq(prefix[0], tail), lo == 0


def _contains_items(t: ArrT, em: Writer) -> tuple[Frag | None, bool]:
    if len(t.contains) > 1:
        return _Several(t, em).items(), False
    c = t.contains[0]
    if t.prefix or t.max_items is not None or t.min_items > c.lo:
        return _Counted(t, em).items()
    return _contains_run(t.rest, c, 0, em)


def _contains_run(item: Node, c: Contains, hits: int, em: Writer) -> tuple[Frag | None, bool]:
    """Any number of ``item``s of which c.lo - hits to c.hi - hits are in ``c.node``: "any
    item" runs around the required matching items (with ``maxContains``, runs of items
    outside ``c.node``, which needs its complement)."""
    hit = em.derived(item, c.node)
    filler = em.node(item) if c.hi is None else em.derived(item, neg(c.node))
    slots = [Slot(filler, 0, None)]
    for _ in range(max(0, c.lo - hits)):
        slots += [Slot(hit, 1, 1), Slot(filler, 0, None)]
    if c.hi is not None:
        for _ in range(c.hi - max(c.lo, hits)):
            slots += [Slot(hit, 0, 1), Slot(filler, 0, None)]
    return separated(slots, em.sep)


class _Counted:
    """``contains`` beside prefix items, ``maxItems`` or a ``minItems`` above ``minContains``:
    the items position by position, counting those in the ``contains`` schema, as rules
    R(i, h) = "the items from position i on, h of those before it matching" (shared where
    they meet); past the prefix and ``minItems`` with no ``maxItems``, the rest is a
    ``_contains_run``. Each item either matches or, where nothing more is to count, is any
    item; with ``maxContains`` it matches or is outside the ``contains`` schema (its
    complement)."""

    def __init__(self, t: ArrT, em: Writer) -> None:
        self.t, self.em, self.c = t, em, t.contains[0]
        self.end = t.max_items if t.max_items is not None else max(len(t.prefix), t.min_items)
        top = self.c.lo if self.c.hi is None else self.c.hi
        if self.end * (top + 1) > _MAX_COUNTED:
            raise ConstraintError(
                f"contains with {self.end} counted positions and up to {top} matches needs "
                f"more than {_MAX_COUNTED} grammar states"
            )
        self.memo: dict[tuple[int, int], Frag | None] = {}

    def items(self) -> tuple[Frag | None, bool]:
        """(the non-empty item sequences, whether the empty one is allowed)."""
        return self._next(0, 0), self._done(0, 0)

    def _done(self, i: int, h: int) -> bool:
        return i >= self.t.min_items and h >= self.c.lo

    def rest(self, i: int, h: int) -> Frag | None:
        """The items after i of them, h matching, each after a separator."""
        key = (i, h)
        if key not in self.memo:
            tail = self._next(i, h)
            self.memo[key] = choice(EPS if self._done(i, h) else None, seq(self.em.sep, tail))
        return self.memo[key]

    def _next(self, i: int, h: int) -> Frag | None:
        """Item i (the next one) and those after it."""
        if i == self.end:  # past maxItems, or unbounded: a run of rest items
            return None if self.t.max_items is not None else self._run(h)
        item = self.t.prefix[i] if i < len(self.t.prefix) else self.t.rest
        c = self.c
        if c.hi is None and h >= c.lo:  # enough matches: any item
            return seq(self.em.node(item), self.rest(i + 1, h))
        other = self.em.node(item) if c.hi is None else self.em.derived(item, neg(c.node))
        options = [seq(other, self.rest(i + 1, h))]
        if c.hi is None or h < c.hi:
            options.append(seq(self.em.derived(item, c.node), self.rest(i + 1, h + 1)))
        return choice(*options)

    def _run(self, h: int) -> Frag | None:
        return _contains_run(self.t.rest, self.c, h, self.em)[0]


_MAX_COUNTED = 2048  # (position, matches) states of one contains array


class _Several:
    """Two or more ``contains`` (``allOf`` of them) without prefix items, ``maxItems`` or
    ``maxContains``: the state is how many items matched each, up to its ``minContains``; an
    item may match several at once (it is written narrowed by each of their schemas), items
    matching none may come anywhere, and once every count is reached any items follow. A DAG:
    each match raises a count."""

    def __init__(self, t: ArrT, em: Writer) -> None:
        self.cs, self.item, self.em = t.contains, t.rest, em
        states = 1
        for c in self.cs:
            states *= c.lo + 1
        if (
            t.prefix
            or t.max_items is not None
            or any(c.hi is not None for c in self.cs)
            or t.min_items > max(c.lo for c in self.cs)
            or states > _MAX_SEVERAL
        ):
            raise ConstraintError(
                "two 'contains' on one array have an exact grammar only without prefixItems, "
                f"maxItems and maxContains, and with at most {_MAX_SEVERAL} counts to keep"
            )
        self.any = em.node(t.rest)
        self.memo: dict[tuple[tuple[int, ...], bool], Frag | None] = {}

    def items(self) -> Frag | None:
        """The non-empty item sequences (some item must match)."""
        return self._from(tuple(0 for _ in self.cs), True)

    def _from(self, counts: tuple[int, ...], first: bool) -> Frag | None:
        key = (counts, first)
        if key in self.memo:
            return self.memo[key]
        lacking = [i for i, c in enumerate(self.cs) if counts[i] < c.lo]
        if not lacking:  # (first is False here: some item matched)
            out = rep(seq(self.em.sep, self.any), 0, None)
        else:
            options = []
            for n in range(1, 1 << len(lacking)):
                hits = [lacking[b] for b in range(len(lacking)) if n >> b & 1]
                node = self.cs[hits[0]].node
                for i in hits[1:]:
                    node = conj(node, self.cs[i].node)
                hit = self.em.derived(self.item, node)
                after = tuple(k + (i in hits) for i, k in enumerate(counts))
                rest = self._from(after, False)
                if hit is None or rest is None:
                    continue
                options.append(seq(hit if first else seq(self.em.sep, hit), rest))
                if self.any is not None:
                    lead = seq(self.any, rep(seq(self.em.sep, self.any), 0, None))
                    lead = lead if first else rep(seq(self.em.sep, self.any), 1, None)
                    options.append(seq(lead, self.em.sep, hit, rest))
            out = choice(*options)
        self.memo[key] = out
        return out


_MAX_SEVERAL = 256  # the counts kept for several contains (the product of minContains + 1)


def _unique_arrays(t: ArrT, em: Writer) -> Frag | None:
    if t.max_items is not None and t.max_items <= 1:
        return array_regex(replace(t, unique=False), em)
    values = _distinct_values(t, em)
    if values is not None:  # items from one finite set: a list of distinct ones
        hi = len(values) if t.max_items is None else t.max_items
        body = unique([em.value(v) for v in values], t.min_items, hi, em.sep)
        return em.container("[", body, t.min_items == 0, "]")
    arrays = _distinct_arrays(t, em)
    if arrays is not None:
        return choice(*(em.value(a) for a in arrays))
    em.check(t)  # distinct items: checked as the text is decoded (lmprog.fsm.checks)
    return array_regex(replace(t, unique=False), em)


_LIMIT = 256
_UNIQUE_ITEMS = 64  # distinct values of a parametric unique list (bits of its parameter)


def _distinct_values(t: ArrT, em: Writer) -> list[Any] | None:
    """The distinct values (JSON equality) every item of ``t`` comes from, when there is no
    prefix and at most _UNIQUE_ITEMS of them; else None."""
    if t.prefix or t.contains or t.rest.never:
        return None
    values = em.finite_values(t.rest)
    if values is None:
        return None
    distinct = list({value_key(v): v for v in values}.values())
    return distinct if len(distinct) <= _UNIQUE_ITEMS else None


def _distinct_arrays(t: ArrT, em: Writer) -> list[list[Any]] | None:
    """Every array of ``t`` with pairwise distinct items, when items come from finite sets and
    there are at most ``_LIMIT`` of them; else None."""
    if t.contains:
        return None
    finite = [em.finite_values(n) for n in t.prefix]
    rest = [] if t.rest.never else em.finite_values(t.rest)
    choices = [c for c in finite if c is not None]
    if rest is None or len(choices) < len(finite):
        return None
    top = len(choices) + len(rest) if t.max_items is None else t.max_items
    out: list[list[Any]] = []

    def extend(items: list[Any], keys: set[Hashable]) -> bool:
        if t.min_items <= len(items):
            out.append(list(items))
            if len(out) > _LIMIT:
                return False
        if len(items) >= top:
            return True
        pool = choices[len(items)] if len(items) < len(choices) else rest
        for v in pool:
            k = value_key(v)
            if k not in keys and not extend(items + [v], keys | {k}):
                return False
        return True

    return out if extend([], set()) else None
