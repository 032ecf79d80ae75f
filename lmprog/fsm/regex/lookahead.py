"""Lookaheads in JSON Schema ``pattern``s, read as an intersection of lookahead-free patterns.

``^(?!aws:).+$`` matches the strings that match ``^.+$`` and do not match ``^aws:``: where a
lookahead stands after a part of fixed length from an anchored start, the pattern is its
lookahead-free part intersected with each positive lookahead and the complement of each
negative one (``regex.dfa``, else llguidance's ``~``). Elsewhere the pattern goes through its
automaton (``assertions.py``), or ``ConstraintError`` names why. Design:
docs/design/constraints.md.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TypeAlias, overload

from lmprog.core.errors import ConstraintError
from lmprog.fsm.regex.anchors import Anchored
from lmprog.fsm.regex.dfa import complement
from lmprog.fsm.regex.parser import Anchor, Look, _has_anchor, _Parser, parse_regex
from lmprog.fsm.regex.syntax import Alternation, Chars, Concat, Node, Repeat, emit, node_lengths

# A part of a parsed pattern: the parser leaves lookaheads (Look) and anchors in its tree.
Part: TypeAlias = "Node | Look | Anchor"

NOTHING = r"[^\s\S]"


@lru_cache(maxsize=1024)
def complement_source(source: str) -> str | None:
    """An ECMA source, anchored at both ends, of the strings in which ECMA ``source`` finds no
    match; None where its automaton is too large to write out (the caller keeps a ``~``)."""
    try:
        r = complement(parse_regex(source, "ecma"))
    except OverflowError:
        return None
    return r"[^\s\S]" if r is None else f"^(?:{r.text})$"


@lru_cache(maxsize=1024)
def split_lookaheads(source: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(ECMA sources a string must match, sources it must not) equal to ``source`` under
    JSON Schema's search semantics; ``((source,), ())`` where it has no lookahead."""
    parser = _Parser(source, "ecma", lookahead=True)
    node = parser.alternation()
    if parser.i < len(source):
        raise parser.fail("unbalanced ')'")
    if not _has_look(node):
        return (source,), ()
    try:
        return _split(source, node, parser)
    except ConstraintError as refused:
        try:  # lookaheads from a moving position: through the automaton (regex.assertions)
            parse_regex(source, "ecma")
        except ConstraintError:
            raise refused from None
        return (source,), ()


def _split(source: str, node: Node, parser: _Parser) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if parser.asserts or parser.multiline:
        at = (parser.asserts or parser.anchors)[0]
        raise parser.fail("a lookahead beside a word boundary, lookbehind or (?m) anchor", at)
    parts = _flatten(node)
    for part in parts:
        inner = part.node if isinstance(part, Look) else _tempered(part) or part
        if isinstance(inner, Look):
            inner = inner.node
        if _has_look(inner):
            raise parser.fail(
                "a lookahead inside an alternative, a repeated group or a lookahead",
                _first_look(inner),
            )
    plain = [_plain(p) for p in parts if not isinstance(p, Look)]
    base = parser.split_anchors(Concat(tuple(plain)))  # type: ignore[arg-type]  # a parse-time tree: split_anchors takes out its anchors
    if not base:
        return (NOTHING,), ()
    if not any(start for start, _, _ in base) and _looks_at_the_start(parts, parser):
        return _searched(source, parts, base, parser)
    must, must_not = [_source(base)], []
    for i, part in enumerate(parts):
        tempered = _tempered(part)
        look = tempered if tempered is not None else part if isinstance(part, Look) else None
        if look is None:
            continue
        at = look.at
        if not all(start for start, _, _ in base):
            raise parser.fail("a lookahead in a pattern not anchored at its start ('^')", at)
        lo = _offset(parts[:i], parser, at)
        if tempered is not None:  # ((?!X).)*: X matches at no position from lo to the end
            must_not.append(_tempered_source(parts[i + 1 :], tempered, lo, base, parser))
            continue
        shift = f"[\\s\\S]{{{lo}}}" if lo else ""
        branches = [
            (b, end) for start, b, end in parser.split_anchors(look.node) if lo == 0 or not start
        ]
        if not branches:  # ``^`` inside a lookahead that looks from past the start
            if not look.negative:
                must.append(NOTHING)
            continue
        text = "|".join(f"^{shift}{_body(b)}{'$' if end else ''}" for b, end in branches)
        (must_not if look.negative else must).append(text)
    for text in list(must_not):  # a small "must not" is a positive pattern (regex.dfa)
        positive = complement_source(text)
        if positive is not None:
            must_not.remove(text)
            must.append(positive)
    return tuple(dict.fromkeys(must)), tuple(dict.fromkeys(must_not))


def _looks_at_the_start(parts: list[Part], parser: _Parser) -> bool:
    """Whether the lookaheads lead the pattern and each looks only from the string's start
    (``(?!^[0-9]+$)...``: every branch of its body begins with ``^``)."""
    leading = 0
    while leading < len(parts) and isinstance(parts[leading], Look):
        leading += 1
    return not any(_has_look(p) or _tempered(p) for p in parts[leading:]) and all(
        all(start for start, _, _ in parser.split_anchors(look.node))
        for look in parts[:leading]
        if isinstance(look, Look)  # (all of them)
    )


def _searched(
    source: str, parts: list[Part], base: list[Anchored], parser: _Parser
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A pattern not anchored at its start whose lookaheads look only from the string's start:
    a match at position 0 is the pattern anchored there; a match further on finds its negative
    lookaheads true (``^`` fails there) and its positive ones false. The union of the two is
    written into each pattern a string must match, so every "must not" has to have become a
    pattern (regex.dfa)."""
    must, must_not = split_lookaheads("^" + source)
    looks = [p for p in parts if isinstance(p, Look)]
    if not all(look.negative for look in looks):
        return must, must_not
    if must_not:
        raise parser.fail(
            "a lookahead in a pattern not anchored at its start ('^') whose complement has "
            "too large an automaton",
            looks[0].at,
        )
    later = "|".join(f"^[\\s\\S]+{_body(b)}{'$' if end else ''}" for _, b, end in base)
    return tuple(f"{m}|{later}" for m in must), ()


def _offset(before: list[Part], parser: _Parser, at: int) -> int:
    """The fixed length of the parts before a lookahead (a leading ``^`` aside)."""
    before = [_plain(p) for p in before if not isinstance(p, Look)]
    while before and isinstance(before[0], Anchor) and before[0].start:
        before.pop(0)
    plain = [p for p in before if not isinstance(p, (Look, Anchor))]  # (all, when not anchored)
    lo, hi = node_lengths(Concat(tuple(plain))) if not _anchored(before) else (0, None)
    if lo != hi:
        raise parser.fail("a lookahead after a part of variable length", at)
    return lo


def _tempered(part: Part) -> Look | None:
    """The lookahead of a tempered token ``((?!X).)*`` (one character checked at each step)."""
    if isinstance(part, Repeat) and isinstance(part.node, Concat) and len(part.node.parts) == 2:
        look, chars = part.node.parts
        if isinstance(look, Look) and look.negative and isinstance(chars, Chars):
            return look
    return None


@overload
def _plain(part: Node) -> Node: ...
@overload
def _plain(part: Part) -> Part: ...
def _plain(part: Part) -> Part:
    """A part with a tempered token's lookahead dropped (its characters stay)."""
    if _tempered(part) is not None and isinstance(part, Repeat) and isinstance(part.node, Concat):
        return Repeat(part.node.parts[1], part.lo, part.hi)
    return part


def _tempered_source(
    after: list[Part], look: Look, lo: int, base: list[Anchored], parser: _Parser
) -> str:
    """The strings where ``look``'s body matches at some position from ``lo`` on, for a
    tempered token that runs to the end of a pattern anchored at its end."""
    rest = []
    for p in after:
        if isinstance(p, Anchor) and not p.start:
            break
        rest.append(p)
    if not all(end for _, _, end in base) or any(
        isinstance(p, (Look, Anchor)) or _anchored([p]) or node_lengths(_plain(p)) != (0, 0)
        for p in rest
    ):
        raise parser.fail("a tempered lookahead ((?!...).)* that does not run to the end", look.at)
    branches = parser.split_anchors(look.node)
    if any(node_lengths(b)[0] == 0 for _, b, _ in branches):
        raise parser.fail("a tempered lookahead ((?!...).)* whose body matches ''", look.at)
    shift = f"^[\\s\\S]{{{lo},}}" if lo else ""
    out = [
        f"{'^' if start else shift}{_body(b)}{'$' if end else ''}"
        for start, b, end in branches
        if not start or lo == 0
    ]
    return "|".join(out) if out else NOTHING


def _has_look(node: Part) -> bool:
    return _first_look(node) is not None


def _first_look(node: Part) -> int | None:
    if isinstance(node, Look):
        return node.at
    if not isinstance(node, (Concat, Alternation, Repeat)):
        return None
    children = (
        node.parts
        if isinstance(node, Concat)
        else node.options
        if isinstance(node, Alternation)
        else (node.node,)
    )
    for child in children:
        at = _first_look(child)
        if at is not None:
            return at
    return None


def _flatten(node: Part) -> list[Part]:
    """The parts of a concatenation, groups (nested concatenations) opened."""
    if isinstance(node, Concat):
        return [q for p in node.parts for q in _flatten(p)]
    return [node]


def _anchored(parts: list[Part]) -> bool:
    return any(_has_anchor(p) for p in parts)


def _body(node: Node) -> str:
    r = emit(node)
    return NOTHING if r is None else f"(?:{r.text})"


def _source(branches: list[Anchored]) -> str:
    """Anchored alternatives (start?, body, end?) as one ECMA source."""
    if not branches:
        return NOTHING
    return "|".join(
        f"{'^' if start else ''}{_body(b)}{'$' if end else ''}" for start, b, end in branches
    )
