"""Anchors while parsing, and how two anchored alternatives concatenate.

``split_anchors`` (the parser) reads a pattern as alternatives (anchored at the start?, body,
anchored at the end?): an anchor may stand anywhere a regex engine allows it, and is satisfiable
only where the text on its far side can be empty. Under ``(?m)`` an anchor also holds next to a
line break, which the match may include (``line_edges``), where that can be decided from the
bodies alone.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from lmprog.fsm.regex.charset import CharSet
from lmprog.fsm.regex.syntax import EMPTY, Branch, Chars, Concat, Node, node_lengths, nullable


class Anchor:
    """`^` (start) or `$` (end) while parsing; `split_anchors` removes every one. Under the
    ``(?m)`` flag (``multiline``) they hold at a line's start or end too, as in Python's ``re``:
    ``^`` after a ``\\n``, ``$`` before one."""

    __slots__ = ("start", "multiline")

    def __init__(self, start: bool, multiline: bool = False) -> None:
        self.start, self.multiline = start, multiline


# An alternative's side: anchored (True), under (?m) at a line's edge ("m"), or not (False).
Side: TypeAlias = "bool | Literal['m']"
# An anchored alternative: (start, body, end).
Anchored: TypeAlias = "tuple[Side, Node, Side]"

ANCHOR_ESCAPES = {"A": Anchor(True), "Z": Anchor(False), "z": Anchor(False)}


class Unsure(Exception):
    """A multiline anchor next to text that may or may not hold the line break it needs."""


def join_anchored(left: Anchored, right: Anchored) -> Anchored | None:
    """Concatenate two anchored alternatives (start, body, end: False, True, or "m" for a
    multiline anchor); None where no text satisfies both."""
    s1, b1, e1 = left
    s2, b2, e2 = right
    if "m" in (e1, s2):
        return _join_multiline(left, right)
    if e1 and not nullable(b2):  # text after the end
        return None
    if s2 and not nullable(b1):  # text before the start
        return None
    if e1:  # b2 matches ""; with a start anchor here too, b1 must as well
        return s1 or s2, EMPTY if s2 else b1, True
    if s2:
        return True, b2, e2
    return s1, concat_nodes(b1, b2), e2


def _join_multiline(left: Anchored, right: Anchored) -> Anchored:
    """`join_anchored` where a multiline anchor stands between the two bodies: exact where the
    text beside it is empty, or may be empty and has no anchor of its own (a match of it ending
    or starting with the line break leaves a shorter match with it empty); else Unsure."""
    s1, b1, e1 = left
    s2, b2, e2 = right
    if _empty(b1) and _empty(b2):
        return _both(s1, s2), EMPTY, _both(e1, e2)
    if e1 and not s2:
        if _empty(b2):
            return s1, b1, _both(e1, e2)
        if e1 == "m" and nullable(b2) and not e2:
            return s1, b1, "m"
    if s2 and not e1:
        if _empty(b1):
            return _both(s1, s2), b2, e2
        if s2 == "m" and nullable(b1) and not s1:
            return "m", b2, e2
    raise Unsure


def _both(a: Side, b: Side) -> Side:
    """Two anchors at one position: a plain one is the stronger."""
    return True if True in (a, b) else "m" if "m" in (a, b) else False


def _empty(node: Node) -> bool:
    return node_lengths(node) == (0, 0)


def line_edges(start: Side, body: Node, end: Side, search: bool) -> list[Branch]:
    """A branch with multiline anchors as plain branches: ``^`` holds at the start or after a
    line break, which a match searched for may as well include (and ``$`` likewise before
    one); a match of the whole string (not ``search``) holds them at its edges."""
    line = Chars(CharSet.of("\n"))
    heads = [(True, ())] + ([(False, (line,))] if start == "m" and search else [])
    tails = [(True, ())] + ([(False, (line,))] if end == "m" and search else [])
    return [
        Branch(
            concat_nodes(concat_nodes(Concat(head), body), Concat(tail)) if head or tail else body,
            bool(start) and s,
            bool(end) and e,
        )
        for s, head in heads
        for e, tail in tails
    ]


def concat_nodes(a: Node, b: Node) -> Node:
    parts = [
        *(a.parts if isinstance(a, Concat) else (a,)),
        *(b.parts if isinstance(b, Concat) else (b,)),
    ]
    return Concat(tuple(parts))
