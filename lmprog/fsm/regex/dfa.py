"""The complement of a small pattern as a pattern, through its automaton.

    complement(parsed, max_states, limit) -> R | None   the strings it finds no match in

Written as a positive pattern, a negative lookahead costs llguidance's lexer nothing, where
its own ``~`` beside a ``maxLength`` could spend the lexer's fuel mid-decode. The automaton is
built by derivatives, minimized, complemented and written back by state elimination.
Design: docs/design/constraints.md.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, TypeAlias

from lmprog.fsm.regex.automata import to_regex
from lmprog.fsm.regex.charset import ANY_CHAR, CharSet
from lmprog.fsm.regex.fragments import R, charset_regex
from lmprog.fsm.regex.syntax import Alternation, Chars, Concat, Node, ParsedRegex, Repeat

NOTHING, EPS = 0, 1  # the ids of the empty language and of the empty string
# An interned derivative: ("chars", mask), ("cat", a, b), ("alt", ids), ("rep", a, lo, hi),
# (and _InContext's "look", "ahead", "and", "not"); read as (kind, *args).
Interned: TypeAlias = tuple[Any, ...]


def complement(parsed: ParsedRegex, max_states: int = 100, limit: int = 20_000) -> R | None:
    """A regex (full-match) of the strings in which ``parsed`` finds no match (search
    semantics: an unanchored side matches any text); None if it finds one in every string.
    OverflowError past ``max_states`` automaton states or ``limit`` characters."""
    moves, blocks, accepting = search_automaton(parsed, max_states)
    return written(moves, blocks, [not a for a in accepting], limit)


def search_automaton(
    parsed: ParsedRegex, max_states: int
) -> tuple[list[list[int]], list[CharSet], list[bool]]:
    """The automaton of the strings in which ``parsed`` finds a match (search semantics: an
    unanchored side matches any text): each state's successor by block (state 0 the start),
    the blocks (a partition of all characters), and which states accept. OverflowError past
    ``max_states`` states."""
    anything = Repeat(Chars(ANY_CHAR), 0, None)
    whole = Alternation(
        tuple(
            Concat((*(() if b.start else (anything,)), b.node, *(() if b.end else (anything,))))
            for b in parsed.branches
        )
    )
    d = _Derivatives(whole)
    moves = d.automaton(max_states)
    return moves, d.blocks, [d.nullable(s) for s in d.states]


def written(
    moves: list[list[int]], blocks: list[CharSet], accepting: list[bool], limit: int
) -> R | None:
    """The regex (full-match) of an automaton (state 0 the start; each state's successor by
    block), minimized first; None where it accepts nothing. OverflowError past ``limit``."""
    group = _minimized(moves, accepting)
    edges: dict[tuple[int, int], CharSet] = {}
    for p, row in enumerate(moves):
        for block, q in zip(blocks, row):
            key = (group[p], group[q])
            edges[key] = edges.get(key, CharSet()) | block
    labels = {k: charset_regex(v) for k, v in edges.items()}
    finals = {group[s] for s in range(len(moves)) if accepting[s]}
    return to_regex({k: v for k, v in labels.items() if v is not None}, group[0], finals, limit)


def _minimized(moves: list[list[int]], final: list[bool]) -> list[int]:
    """Each state's class of equivalent states (Moore's refinement); state 0's class is 0."""
    group = [int(f) for f in final]
    while True:
        keys: dict[tuple[int, ...], int] = {}
        new = [
            keys.setdefault((group[s], *(group[q] for q in row)), len(keys))
            for s, row in enumerate(moves)
        ]
        if len(keys) == len(set(group)):
            break
        group = new
    order: dict[int, int] = {}
    return [order.setdefault(g, len(order)) for g in group]


class _Derivatives:
    """A pattern's derivatives as interned nodes (ids): ``("chars", mask)`` (the blocks it
    holds, as bits), ``("cat", a, b)``, ``("alt", ids)`` (sorted, flat, no NOTHING) and
    ``("rep", a, lo, hi)``; equal derivatives get one id, so the automaton stays finite."""

    def __init__(self, node: Node, classes: set[CharSet] | None = None) -> None:
        """classes: what the blocks partition (default: the node's own classes)."""
        self.blocks = _blocks(_classes(node) if classes is None else classes)
        self.nodes: list[Interned] = [("alt", ()), ("cat",)]  # NOTHING, EPS
        self.ids: dict[Interned, int] = {n: i for i, n in enumerate(self.nodes)}
        self._nullable: dict[int, bool] = {NOTHING: False, EPS: True}
        # (id, block) -> id; a subclass keys more context in: (id, ..., block)
        self._derived: dict[tuple[Hashable, ...], int] = {}
        self.states = [self.read(node)]

    def automaton(self, max_states: int) -> list[list[int]]:
        """Each state's successor by block; ``self.states`` lists them (state 0: the start)."""
        index: dict[int, int] = {self.states[0]: 0}
        moves: list[list[int]] = []
        while len(moves) < len(self.states):
            row: list[int] = []
            for b in range(len(self.blocks)):
                nxt = self.derive(self.states[len(moves)], b)
                if nxt not in index:
                    if len(self.states) >= max_states:
                        raise OverflowError(f"the automaton has over {max_states} states")
                    index[nxt] = len(self.states)
                    self.states.append(nxt)
                row.append(index[nxt])
            moves.append(row)
        return moves

    def read(self, node: Node) -> int:
        """The id of a parsed node."""
        if isinstance(node, Chars):
            mask = sum(1 << i for i, b in enumerate(self.blocks) if not (b & node.chars).is_empty())
            return self._intern(("chars", mask)) if mask else NOTHING
        if isinstance(node, Repeat):
            return self.rep(self.read(node.node), node.lo, node.hi)
        if isinstance(node, Alternation):
            return self.alt([self.read(o) for o in node.options])
        out = EPS
        for part in reversed(node.parts):
            out = self.cat(self.read(part), out)
        return out

    def nullable(self, n: int) -> bool:
        if n not in self._nullable:
            kind, *args = self.nodes[n]
            self._nullable[n] = (
                kind == "rep"
                and (args[1] == 0 or self.nullable(args[0]))
                or kind == "cat"
                and self.nullable(args[0])
                and self.nullable(args[1])
                or kind == "alt"
                and any(map(self.nullable, args[0]))
            )
        return self._nullable[n]

    def derive(self, n: int, block: int) -> int:
        """The id of the strings s such that (a character of the block) + s is in ``n``."""
        key = (n, block)
        if key not in self._derived:
            kind, *args = self.nodes[n]
            if kind == "chars":
                out = EPS if args[0] >> block & 1 else NOTHING
            elif kind == "alt":
                out = self.alt([self.derive(o, block) for o in args[0]])
            elif kind == "rep":
                a, lo, hi = args
                rest = self.rep(a, max(lo - 1, 0), None if hi is None else hi - 1)
                out = self.cat(self.derive(a, block), rest)
            elif not args:  # EPS
                out = NOTHING
            else:
                a, b = args
                out = self.cat(self.derive(a, block), b)
                if self.nullable(a):
                    out = self.alt([out, self.derive(b, block)])
            self._derived[key] = out
        return self._derived[key]

    def alt(self, options: list[int]) -> int:
        flat: set[int] = set()
        for o in options:
            kind, *args = self.nodes[o]
            flat.update(args[0] if kind == "alt" else (o,))
        flat.discard(NOTHING)
        if len(flat) == 1:
            return flat.pop()
        return self._intern(("alt", tuple(sorted(flat))))

    def cat(self, a: int, b: int) -> int:
        if NOTHING in (a, b):
            return NOTHING
        if a == EPS or b == EPS:
            return b if a == EPS else a
        if self.nodes[a][0] == "cat":  # (x y) z = x (y z): one spelling of each concatenation
            return self.cat(self.nodes[a][1], self.cat(self.nodes[a][2], b))
        return self._intern(("cat", a, b))

    def rep(self, a: int, lo: int, hi: int | None) -> int:
        if hi == 0 or a == EPS:
            return EPS
        if a == NOTHING:
            return EPS if lo == 0 else NOTHING
        if lo == hi == 1:
            return a
        return self._intern(("rep", a, lo, hi))

    def _intern(self, node: Interned) -> int:
        if node not in self.ids:
            self.ids[node] = len(self.nodes)
            self.nodes.append(node)
        return self.ids[node]


def _blocks(classes: set[CharSet]) -> list[CharSet]:
    """The coarsest partition of all characters that each of ``classes`` is a union of."""
    blocks = [ANY_CHAR]
    for chars in sorted(classes, key=lambda c: c.ranges):
        blocks = [part for b in blocks for part in (b & chars, b - chars) if not part.is_empty()]
    return blocks


def _classes(node: Node) -> set[CharSet]:
    if isinstance(node, Chars):
        return {node.chars}
    if isinstance(node, Repeat):
        return _classes(node.node)
    children = node.parts if isinstance(node, Concat) else node.options
    return set().union(*map(_classes, children)) if children else set()
