"""Patterns with one-character assertions (word boundaries, lookarounds of one character class,
anchors anywhere) as assertion-free patterns, through the string's automaton.

The automaton's states pair a derivative of the whole-string pattern with what the last
character read was (as far as the assertions care); it is minimized and written back as a
regex (``dfa.written``). Past ``max_states`` states or ``limit`` characters, OverflowError
(the parser refuses the pattern, naming the assertion). Design: docs/design/constraints.md.
"""

from __future__ import annotations

from typing import TypeAlias

from lmprog.fsm.regex.anchors import Anchor
from lmprog.fsm.regex.charset import ANY_CHAR, CharSet, cs
from lmprog.fsm.regex.dfa import EPS, NOTHING, _Derivatives, written
from lmprog.fsm.regex.fragments import R
from lmprog.fsm.regex.syntax import EMPTY, Alternation, Chars, Concat, Node, Repeat

WORD = cs("a-zA-Z0-9_")
LINE = CharSet.of("\n")


class Assert:
    """A one-character assertion while parsing: ``kind`` "boundary" (``\\b``; ``negative``:
    ``\\B``), "behind" (``(?<=chars)``; ``negative``: ``(?<!chars)``), "ahead"
    (``(?=chars)``, ``(?!chars)``) or "lookahead" (``(?=body)``, ``(?!body)``, a longer one)."""

    __slots__ = ("kind", "chars", "negative", "at", "body")

    def __init__(
        self, kind: str, chars: CharSet, negative: bool, at: int, body: Node = EMPTY
    ) -> None:
        # chars: the class a lookaround tests (empty for a "lookahead"); body: a lookahead's
        self.kind, self.chars, self.negative, self.at = kind, chars, negative, at
        self.body = body


def without_assertions(
    node: Node, max_states: int = 120, limit: int = 20_000
) -> list[tuple[bool, R, bool]]:
    """The branches (start anchored?, full-match regex, end anchored?) of the strings in which
    ``node`` (holding ``Assert`` nodes and the parser's anchors) finds a match: a match at the
    string's start, or after a character the assertions look at (the branch's first); ending
    at the string's end, or before a character they look at (its last). OverflowError past the
    bounds."""
    d = _InContext(node)
    if d.aheads:  # a lookahead may look past the match: the match runs on to the string's end
        d = _InContext(Concat((node, Repeat(Chars(ANY_CHAR), 0, None))))
    out = []
    for at_start in (True, False):
        for at_end in (True,) if d.aheads else (True, False):
            r = _written(d, at_start, at_end, max_states, limit)
            if r is not None:
                out.append((at_start, r, at_end))
    return out


_BEFORE, _AFTER = "before", "after"  # reading the character before a match; the one after it
# What the previous character was, for each class the assertions test (None: no character).
Seen: TypeAlias = "tuple[bool, ...] | None"
# A state of the string's automaton: (derivative, what the last character was), _BEFORE,
# _AFTER, or NOTHING.
_State: TypeAlias = "tuple[int, Seen] | str | int"


def _written(d: _InContext, at_start: bool, at_end: bool, max_states: int, limit: int) -> R | None:
    first: _State = (d.states[0], None) if at_start else _BEFORE
    index: dict[_State, int] = {first: 0}
    pending: list[_State] = [first]
    moves: list[list[int]] = []
    accepting: list[bool] = []
    while len(moves) < len(pending):
        state = pending[len(moves)]
        if state == _AFTER:
            accepting.append(True)
            moves.append([index.setdefault(NOTHING, len(pending))] * len(d.blocks))
            if len(pending) == index[NOTHING]:
                pending.append(NOTHING)
            continue
        if state == NOTHING:
            accepting.append(False)
            moves.append([index[NOTHING]] * len(d.blocks))
            continue
        n, prev = state if isinstance(state, tuple) else (None, None)  # (None: _BEFORE)
        accepting.append(n is not None and at_end and d.nullable_at(n, prev, None))
        row = []
        for b in range(len(d.blocks)):
            nxt: _State
            if n is None:  # the character before the match
                nxt = (d.states[0], d.seen[b])
            elif not at_end and d.nullable_at(n, prev, d.seen[b]):
                nxt = _AFTER
            else:
                nxt = (d.derive_at(n, prev, b), d.seen[b])
                if nxt[0] == NOTHING:
                    nxt = NOTHING
            if nxt not in index:
                if len(pending) >= max_states:
                    raise OverflowError(f"the automaton has over {max_states} states")
                index[nxt] = len(pending)
                pending.append(nxt)
            row.append(index[nxt])
        moves.append(row)
    return written(moves, d.blocks, accepting, limit)


class _InContext(_Derivatives):
    """Derivatives taken beside what the previous character was (``prev``: for each class the
    assertions test, whether the character was in it; None at the string's start).

    A lookahead of more than one character, ``("ahead", body, negative)``, asks something of
    the whole rest of the string: where one heads a concatenation, the rest of the pattern is
    pushed into it (into each alternative, into a repetition unrolled once), and its
    derivative is the intersection (``("and", ids)``) of the body's, followed by anything, with
    the rest's (the complement, ``("not", id)``, for a negative one). An iteration matching ""
    that leads back to the derivative being taken adds nothing (the least fixed point)."""

    def __init__(self, node: Node) -> None:
        self.tests: list[Assert | Anchor] = []  # the one-character assertions read
        self.aheads = 0
        self._busy: list[tuple[int, Seen, int]] = []  # the derivatives being taken, outermost first
        self._cut: int | None = None  # the outermost of them a cycle reached
        self._ahead_in: dict[int, bool] = {}
        self._at: dict[tuple[int, Seen, Seen], bool] = {}
        self.sets = list(dict.fromkeys([WORD, LINE, *_sets(node)]))
        super().__init__(node, {*self.sets, *_classes(node)})
        self.seen = [tuple(not (b & s).is_empty() for s in self.sets) for b in self.blocks]

    def read(self, node: Node) -> int:
        if isinstance(node, (Chars, Concat, Alternation, Repeat)):
            return super().read(node)
        if isinstance(node, Assert) and node.kind == "lookahead":
            self.aheads += 1
            return self._intern(("ahead", self.read(node.body), node.negative))
        self.tests.append(node)
        return self._intern(("look", len(self.tests) - 1))

    def holds(self, look: int, prev: Seen, nxt: Seen) -> bool:
        """Whether assertion ``look`` holds between ``prev`` and ``nxt`` (None: an edge)."""
        node = self.tests[look]

        def has(seen: Seen, chars: CharSet) -> bool:
            return seen is not None and seen[self.sets.index(chars)]

        if isinstance(node, Assert) and node.kind in ("behind", "ahead"):
            seen = prev if node.kind == "behind" else nxt
            return has(seen, node.chars) != node.negative
        if isinstance(node, Assert):  # \b, \B
            return (has(prev, WORD) != has(nxt, WORD)) != node.negative
        seen = prev if node.start else nxt  # an anchor
        return seen is None or (node.multiline and has(seen, LINE))

    def nullable_at(self, n: int, prev: Seen, nxt: Seen) -> bool:
        key = (n, prev, nxt)
        if key not in self._at:
            kind, *args = self.nodes[n]
            if kind == "look":
                out = self.holds(args[0], prev, nxt)
            elif kind == "ahead":  # at the string's end: the body must match ""
                out = self.nullable_at(args[0], prev, nxt) != args[1]
            elif kind == "not":
                out = not self.nullable_at(args[0], prev, nxt)
            elif kind == "and":
                out = all(self.nullable_at(o, prev, nxt) for o in args[0])
            elif kind == "chars":
                out = False
            elif kind == "alt":
                out = any(self.nullable_at(o, prev, nxt) for o in args[0])
            elif kind == "rep":
                out = args[1] == 0 or self.nullable_at(args[0], prev, nxt)
            else:
                out = all(self.nullable_at(a, prev, nxt) for a in args)
            self._at[key] = out
        return self._at[key]

    def derive_at(self, n: int, prev: Seen, block: int) -> int:
        """``derive`` where the previous character was ``prev`` and the next is of ``block``:
        an assertion before the block's character is "" where it holds, else nothing."""
        key = (n, prev, block)
        if key in self._busy:  # back to itself through iterations matching ""
            depth = self._busy.index(key)
            self._cut = depth if self._cut is None else min(self._cut, depth)
            return NOTHING
        if key not in self._derived:
            self._busy.append(key)
            out = self._derive(n, prev, block)
            depth = len(self._busy) - 1
            self._busy.pop()
            if self._cut is not None and self._cut < depth:
                return out  # exact only within the derivative the cycle returns to
            if self._cut == depth:
                self._cut = None
            self._derived[key] = out
        return self._derived[key]

    def _derive(self, n: int, prev: Seen, block: int) -> int:
        kind, *args = self.nodes[n]
        nxt = self.seen[block]
        if kind == "and":
            return self.conj([self.derive_at(o, prev, block) for o in args[0]])
        if kind == "not":
            return self.neg(self.derive_at(args[0], prev, block))
        if kind in ("ahead", "rep") and self.ahead_in(n):
            return self.derive_ahead(n, EPS, prev, block)
        if kind == "cat" and args and self.ahead_in(args[0]):
            return self.derive_ahead(args[0], args[1], prev, block)
        if kind == "look" or (kind == "cat" and not args):
            return NOTHING
        if kind == "chars":
            return EPS if args[0] >> block & 1 else NOTHING
        if kind == "alt":
            return self.alt([self.derive_at(o, prev, block) for o in args[0]])
        if kind == "rep":
            a, lo, hi = args
            rest = self.rep(a, max(lo - 1, 0), None if hi is None else hi - 1)
            out = self.cat(self.derive_at(a, prev, block), rest)
            if lo > 1 and self.nullable_at(a, prev, nxt):  # an iteration matching "" here
                out = self.alt([out, self.derive_at(rest, prev, block)])
            return out
        a, b = args
        out = self.cat(self.derive_at(a, prev, block), b)
        if self.nullable_at(a, prev, nxt):
            out = self.alt([out, self.derive_at(b, prev, block)])
        return out

    def derive_ahead(self, a: int, rest: int, prev: Seen, block: int) -> int:
        """The derivative of ``a`` followed by ``rest`` (the rest of the string's pattern),
        where ``a`` holds a lookahead."""
        kind, *args = self.nodes[a]
        if kind == "ahead":
            body, negative = args
            anything = self.rep(self._intern(("chars", (1 << len(self.blocks)) - 1)), 0, None)
            look = self.derive_at(self.cat(body, anything), prev, block)
            return self.conj(
                [self.neg(look) if negative else look, self.derive_at(rest, prev, block)]
            )
        if kind == "alt":
            return self.derive_at(self.alt([self.cat(o, rest) for o in args[0]]), prev, block)
        if kind == "rep":
            x, lo, hi = args
            more = self.cat(
                x, self.cat(self.rep(x, max(lo - 1, 0), None if hi is None else hi - 1), rest)
            )
            if lo > 0:
                return self.derive_at(more, prev, block)
            return self.alt([self.derive_at(rest, prev, block), self.derive_at(more, prev, block)])
        raise AssertionError(kind)  # a concatenation never heads one (``cat``)

    def ahead_in(self, n: int) -> bool:
        """Whether node ``n`` holds a lookahead of more than one character."""
        if n not in self._ahead_in:
            kind, *args = self.nodes[n]
            if kind == "ahead":
                out = True
            elif kind == "alt":
                out = any(map(self.ahead_in, args[0]))
            elif kind == "rep":
                out = self.ahead_in(args[0])
            elif kind == "cat":
                out = any(map(self.ahead_in, args))
            else:
                out = False
            self._ahead_in[n] = out
        return self._ahead_in[n]

    def conj(self, options: list[int]) -> int:
        flat: set[int] = set()
        for o in options:
            kind, *args = self.nodes[o]
            flat.update(args[0] if kind == "and" else (o,))
        if NOTHING in flat:
            return NOTHING
        if len(flat) == 1:
            return flat.pop()
        return self._intern(("and", tuple(sorted(flat))))

    def neg(self, n: int) -> int:
        kind, *args = self.nodes[n]
        return args[0] if kind == "not" else self._intern(("not", n))


def _sets(node: Node) -> list[CharSet]:
    """The classes the one-character lookarounds of ``node`` test."""
    if isinstance(node, Assert) and node.kind == "lookahead":
        return _sets(node.body)
    if isinstance(node, Assert):
        return [node.chars] if node.kind != "boundary" else []
    if isinstance(node, Chars) or not isinstance(node, (Concat, Alternation, Repeat)):
        return []
    children = (node.node,) if isinstance(node, Repeat) else _children(node)
    return [s for c in children for s in _sets(c)]


def _classes(node: Node) -> set[CharSet]:
    if isinstance(node, Chars):
        return {node.chars}
    if isinstance(node, Assert) and node.kind == "lookahead":
        return _classes(node.body)
    if not isinstance(node, (Concat, Alternation, Repeat)):
        return set()
    children = (node.node,) if isinstance(node, Repeat) else _children(node)
    return set().union(*map(_classes, children)) if children else set()


def _children(node: Concat | Alternation) -> tuple[Node, ...]:
    return node.parts if isinstance(node, Concat) else node.options
