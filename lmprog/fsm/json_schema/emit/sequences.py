"""Separated sequences: items in a fixed order of slots, joined by a separator.

A slot is an item (a grammar fragment) with a count range; the separator goes between
consecutive items, never before the first. The tails are the subtrees of a balanced tree, so
rules nest O(log n) deep (``lmprog.fsm.grammar_depth``) and n slots take O(n log n) fragments.
Design: docs/design/json-schema.md.
"""

from __future__ import annotations

from typing import NamedTuple

from lmprog.fsm.json_schema.emit.lark import Frag, choice, rep, seq


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
    tails = _Tails([rep(seq(sep, s.item), s.lo, s.hi) for s in live])
    # F(0) as one union: for each slot i up to the first required one, "slot i is the first
    # written" (a flat union over shared tails, not a nest of n unions)
    firsts = []
    for i, s in enumerate(live):
        more = rep(seq(sep, s.item), max(s.lo - 1, 0), None if s.hi is None else s.hi - 1)
        firsts.append(seq(s.item, more, tails.suffix(i + 1)))
        if s.lo >= 1:
            break
    return choice(*firsts), empty_ok


class _Tails:
    """The suffixes of a sequence of pieces, over a balanced tree of shared subtrees."""

    def __init__(self, pieces: list[Frag | None]) -> None:
        self.pieces = pieces
        self.nodes: dict[tuple[int, int], Frag | None] = {}

    def suffix(self, i: int) -> Frag | None:
        """pieces[i:] in sequence (the empty sequence for i == len)."""
        parts: list[Frag | None] = []
        if i < len(self.pieces):
            self._cover(0, len(self.pieces), i, parts)
        return seq(*parts)

    def _cover(self, lo: int, hi: int, start: int, out: list[Frag | None]) -> None:
        """The subtrees of node [lo, hi) that cover [start, hi), left to right."""
        if start <= lo:
            out.append(self._node(lo, hi))
            return
        mid = (lo + hi) // 2
        if start < mid:
            self._cover(lo, mid, start, out)
            out.append(self._node(mid, hi))
        else:
            self._cover(mid, hi, start, out)

    def _node(self, lo: int, hi: int) -> Frag | None:
        if hi - lo == 1:
            return self.pieces[lo]
        if (lo, hi) not in self.nodes:
            mid = (lo + hi) // 2
            self.nodes[lo, hi] = seq(self._node(lo, mid), self._node(mid, hi))
        return self.nodes[lo, hi]
