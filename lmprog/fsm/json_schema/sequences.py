"""Separated sequences: items in a fixed order of slots, joined by a separator.

A slot is an item (a grammar fragment) with a count range. The text of a sequence puts the separator between
consecutive items, never before the first. With ``F(i)`` = "slots i.. with nothing written yet" and
``T(i)`` = "slots i.. after something was written" (each item preceded by the separator)::

    T(i) = (sep item_i){lo_i,hi_i} T(i+1)
    F(i) = item_i (sep item_i){lo_i-1,hi_i-1} T(i+1)            if lo_i >= 1
         | item_i (sep item_i){0,hi_i-1} T(i+1)  |  F(i+1)      otherwise

written as one union over the slots that may come first. The tails T(i) are shared fragments,
so the sequence is O(n) fragments for n slots.
"""

from __future__ import annotations

from typing import NamedTuple

from lmprog.fsm.json_schema.lark import Frag, alt, cat, rep


class Slot(NamedTuple):
    item: Frag | None
    lo: int
    hi: int | None


def separated(slots: list[Slot], sep: Frag | None) -> tuple[Frag | None, bool]:
    """(regex of the non-empty sequences, whether the empty sequence is allowed)."""
    live = []
    for s in slots:
        if s.item is None or s.hi == 0:
            if s.lo > 0:
                return None, False
            continue
        live.append(s)
    empty_ok = all(s.lo == 0 for s in live)
    tails = [None] * (len(live) + 1)
    tails[len(live)] = cat()
    for i in range(len(live) - 1, -1, -1):
        s = live[i]
        tails[i] = cat(rep(cat(sep, s.item), s.lo, s.hi), tails[i + 1])
    # F(0) as one union: for each slot i up to the first required one, "slot i is the first
    # written" (a flat union over shared tails, not a nest of n unions)
    firsts = []
    for i, s in enumerate(live):
        more = rep(cat(sep, s.item), max(s.lo - 1, 0), None if s.hi is None else s.hi - 1)
        firsts.append(cat(s.item, more, tails[i + 1]))
        if s.lo >= 1:
            break
    return alt(*firsts), empty_ok
