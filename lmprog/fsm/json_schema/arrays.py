"""Arrays: prefix items, the items after them, item counts, ``contains`` and ``uniqueItems``.

Items are written ``[ws item (ws , ws item)* ws]``. An array shorter than its prefix stops after
any prefix item at or past ``minItems``, so the prefix is a nest of optional groups.
``contains`` is exact when there is no prefix and no ``maxItems``: the items are a sequence of
"any item" runs around the required matching items (and, with ``maxContains``, runs of
non-matching items, which needs the complement of the ``contains`` schema). ``uniqueItems`` is
exact when the items come from one finite set of at most 64 values (``enum``, booleans,
``const``...: a parametric rule with a bit per value, each used once), when there are at most
256 distinct-item arrays (prefix items from finite sets: enumerated), or when arrays hold at
most one item; over other items (strings, numbers, objects...) the grammar writes the array
without the condition and the guide checks it as the text is decoded (``lmprog.fsm.checks``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.algebra import conj
from lmprog.fsm.json_schema.complement import neg
from lmprog.fsm.json_schema.lark import Frag, alt, cat, opt, rep, unique
from lmprog.fsm.json_schema.sequences import Slot, separated
from lmprog.fsm.json_schema.terms import ArrT

if TYPE_CHECKING:
    from lmprog.fsm.json_schema.emit import Emitter


def array_regex(t: ArrT, em: Emitter) -> Frag | None:
    if t.unique:
        return _unique_arrays(t, em)
    if t.contains:
        return em.container("[", *_contains_items(t, em), "]")
    prefix = [em.node(n) for n in t.prefix]
    rest = em.node(t.rest)
    return em.container("[", *_items(prefix, rest, t.min_items, t.max_items, em.sep), "]")


def _items(
    prefix: list, rest: Frag | None, lo: int, hi: int | None, sep: Frag | None
) -> tuple[Frag | None, bool]:
    """(non-empty item sequences, empty allowed) for prefix items then ``rest`` items."""
    n = len(prefix)
    if n == 0:
        return separated([Slot(rest, lo, hi)], sep)
    tail = rep(cat(sep, rest), max(0, lo - n), None if hi is None else hi - n)
    for i in range(n - 1, 0, -1):
        step = cat(sep, prefix[i], tail)
        tail = step if i < lo else opt(step)
    return cat(prefix[0], tail), lo == 0


def _contains_items(t: ArrT, em: Emitter) -> tuple[Frag | None, bool]:
    if len(t.contains) > 1 or t.prefix or t.max_items is not None or t.min_items > t.contains[0].lo:
        raise ConstraintError(
            "contains together with prefixItems, maxItems, a larger minItems or "
            "another contains has no exact regex"
        )
    c = t.contains[0]
    hit = em.node(conj(t.rest, c.node))
    filler = em.node(t.rest if c.hi is None else conj(t.rest, neg(c.node)))
    slots = [Slot(filler, 0, None)]
    for _ in range(c.lo):
        slots += [Slot(hit, 1, 1), Slot(filler, 0, None)]
    if c.hi is not None:
        for _ in range(c.hi - c.lo):
            slots += [Slot(hit, 0, 1), Slot(filler, 0, None)]
    return separated(slots, em.sep)


def _unique_arrays(t: ArrT, em: Emitter) -> Frag | None:
    if t.max_items is not None and t.max_items <= 1:
        from dataclasses import replace

        return array_regex(replace(t, unique=False), em)
    values = _distinct_values(t, em)
    if values is not None:  # items from one finite set: a list of distinct ones
        hi = len(values) if t.max_items is None else t.max_items
        body = unique([em.value(v) for v in values], t.min_items, hi, em.sep)
        return em.container("[", body, t.min_items == 0, "]")
    arrays = _distinct_arrays(t, em)
    if arrays is not None:
        return alt(*(em.value(a) for a in arrays))
    from dataclasses import replace

    em.checked.add(t)  # distinct items: checked as the text is decoded (lmprog.fsm.checks)
    return array_regex(replace(t, unique=False), em)


_LIMIT = 256
_UNIQUE_ITEMS = 64  # distinct values of a parametric unique list (bits of its parameter)


def _distinct_values(t: ArrT, em: Emitter) -> list | None:
    """The distinct values (JSON equality) every item of ``t`` comes from, when there is no
    prefix and at most _UNIQUE_ITEMS of them; else None."""
    from lmprog.fsm.json_schema.emit import value_key

    if t.prefix or t.contains or t.rest.never:
        return None
    values = em.finite_values(t.rest)
    if values is None:
        return None
    distinct = list({value_key(v): v for v in values}.values())
    return distinct if len(distinct) <= _UNIQUE_ITEMS else None


def _distinct_arrays(t: ArrT, em: Emitter) -> list | None:
    """Every array of ``t`` with pairwise distinct items, when items come from finite sets and
    there are at most ``_LIMIT`` of them; else None."""
    from lmprog.fsm.json_schema.emit import value_key

    if t.contains:
        return None
    choices = [em.finite_values(n) for n in t.prefix]
    rest = [] if t.rest.never else em.finite_values(t.rest)
    if rest is None or any(c is None for c in choices):
        return None
    top = len(choices) + len(rest) if t.max_items is None else t.max_items
    out: list = []

    def extend(items: list, keys: set) -> bool:
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
