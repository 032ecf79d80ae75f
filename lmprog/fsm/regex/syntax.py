"""The regex AST (characters, concatenation, alternation, repetition) and its emission."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lmprog.fsm.regex.charset import CharSet
from lmprog.fsm.regex.fragments import R, alt, cat, charset_regex, rep


@dataclass(frozen=True)
class Chars:
    chars: CharSet


@dataclass(frozen=True)
class Concat:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Alternation:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    node: Node
    lo: int
    hi: int | None


Node = Chars | Concat | Alternation | Repeat
EMPTY = Concat(())


@dataclass(frozen=True)
class Branch:
    """One top-level alternative and whether it was anchored with ``^`` / ``$``."""

    node: Node
    start: bool
    end: bool


@dataclass(frozen=True)
class ParsedRegex:
    source: str
    dialect: str
    branches: tuple[Branch, ...]

    def whole(self) -> Node:
        """The pattern with its anchors dropped (full-match semantics)."""
        return Alternation(tuple(b.node for b in self.branches))

    def length_range(self) -> tuple[int, int | None]:
        ranges = [node_lengths(b.node) for b in self.branches]
        lo = min(r[0] for r in ranges)
        his = [r[1] for r in ranges if r[1] is not None]
        return lo, None if len(his) < len(ranges) else max(his)


def node_lengths(node: Node) -> tuple[int, int | None]:
    """Minimum and maximum number of characters a node matches (None = unbounded)."""
    if isinstance(node, Chars):
        return 1, 1
    if isinstance(node, Repeat):
        lo, hi = node_lengths(node.node)
        top = None if hi is None or node.hi is None else hi * node.hi
        return lo * node.lo, top
    subs = [node_lengths(p) for p in (node.parts if isinstance(node, Concat) else node.options)]
    if isinstance(node, Concat):
        his = [h for _, h in subs if h is not None]
        return sum(lo for lo, _ in subs), None if len(his) < len(subs) else sum(his)
    if not subs:
        return 0, 0
    his = [h for _, h in subs if h is not None]
    return min(lo for lo, _ in subs), None if len(his) < len(subs) else max(his)


def nullable(node: Node) -> bool:
    """Whether the node matches the empty string."""
    return node_lengths(node)[0] == 0


def nonempty(node: Node) -> Node | None:
    """A node matching the non-empty strings of `node` (None: it matches only the empty
    string, or nothing). For an automaton that cannot start in an accepting state."""
    if isinstance(node, Chars):
        return node
    if isinstance(node, Alternation):
        options = tuple(n for n in map(nonempty, node.options) if n is not None)
        return Alternation(options) if options else None
    if isinstance(node, Concat):
        if not node.parts:
            return None
        head, rest = node.parts[0], node.parts[1:]
        pieces: list[Node] = []  # AB minus "" = (A minus "") B | B minus "" where A matches ""
        first = nonempty(head)
        if first is not None:
            pieces.append(Concat((first, *rest)))
        if nullable(head) and rest:
            tail = nonempty(Concat(rest))
            if tail is not None:
                pieces.append(tail)
        return pieces[0] if len(pieces) == 1 else Alternation(tuple(pieces)) if pieces else None
    inner = nonempty(node.node)
    if inner is None or node.hi == 0:
        return None
    if node.lo >= 1 and not nullable(node.node):
        return node
    # X{lo,hi} minus "": the first non-empty piece, then at least lo - 1 more (X matches "")
    hi = None if node.hi is None else node.hi - 1
    return Concat((inner, Repeat(node.node, max(node.lo - 1, 0), hi)))


def emit(node: Node, chars: Callable[[CharSet], R | None] = charset_regex) -> R | None:
    """The regex of an AST; ``chars`` maps one character set to the fragment matching it."""
    if isinstance(node, Chars):
        return chars(node.chars)
    if isinstance(node, Concat):
        return cat(*(emit(p, chars) for p in node.parts))
    if isinstance(node, Alternation):
        return alt(*(emit(o, chars) for o in node.options))
    return rep(emit(node.node, chars), node.lo, node.hi)
