"""Backreferences in JSON Schema ``pattern``s: a widened pattern for the grammar, the exact one
for a decode-time check.

No regular language holds ``^(\\w+)-\\1$``. The grammar gets the pattern with each
backreference replaced by what its group can match, or nothing (``(?:\\w+)?``: a superset,
since a group that took no part matches empty in ECMA-262); inside a negative lookaround,
where a superset of the body is a subset of the pattern, by a class no character is in
(``[^\\s\\S]``: a subset of the body). The exact pattern is left to the guide's check, which
tests the decoded string with the ``regex`` package (``json_schema.terms.matched``). Which
shapes are read: docs/design/json-schema.md.

    found = backreferences(r"^(?<q>['\"]).*\\k<q>$")
    found.widened   # ^(?<q>['"]).*(?:(?:['"])?)$   (ECMA, no backreference: the parser reads it)
    found.python    # ^(?P<q>['"]).*(?P=q)$     (what ``re``/``regex`` compile)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from lmprog.core.errors import ConstraintError

NOTHING = r"[^\s\S]"
MAX_WIDENED = 4_096  # characters a widened pattern may grow to (groups copied into groups)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Backrefs:
    """A pattern with backreferences: ``widened`` (ECMA, without them: a superset of the
    strings the pattern finds a match in) and ``python`` (the same pattern in Python's syntax:
    ``(?P<name>``, ``(?P=name)``)."""

    source: str
    widened: str
    python: str


@dataclass(frozen=True)
class _Group:
    number: int
    lo: int  # its content: source[lo:hi]
    hi: int


@dataclass(frozen=True)
class _Ref:
    lo: int  # the reference's text: source[lo:hi]
    hi: int
    group: int
    negatives: tuple[int, ...]  # where the negative lookarounds around it open


def has_backreference(source: str) -> bool:
    """Whether the ECMA ``source`` holds a backreference (``\\1``, ``\\k<name>``) outside a
    character class."""
    return bool(_scan(source)[1])


@lru_cache(maxsize=1024)
def backreferences(source: str) -> Backrefs | None:
    """The pattern's widened and Python forms; None if it has no backreference.
    ConstraintError where it cannot be read this way (a reference to a group not closed
    before it, or to none; inline flags; a widened pattern past MAX_WIDENED characters)."""
    groups, refs, flags = _scan(source)
    if not refs:
        return None
    if flags is not None:
        raise _fail(source, "a backreference beside inline flags '(?'", flags)
    by_number = {g.number: g for g in groups}
    for ref in refs:
        g = by_number.get(ref.group)
        if g is None:
            raise _fail(source, f"a backreference to group {ref.group}, which it has not", ref.lo)
        if g.hi > ref.lo:
            raise _fail(source, "a backreference to a group not closed before it", ref.lo)
    widened = _render(source, 0, len(source), 0, by_number, refs)
    return Backrefs(source, widened, _python(source, refs))


def _render(
    source: str, lo: int, hi: int, base: int, groups: dict[int, _Group], refs: list[_Ref]
) -> str:
    """source[lo:hi] with its references replaced: where an even number of negative
    lookarounds (counted from `lo`, plus `base`) stand around one, by its group widened
    (``(?:(?:...)?)``: a quantifier after the reference still has one atom), else by
    NOTHING."""
    out, at = [], lo
    for ref in refs:
        if not lo <= ref.lo < hi:
            continue
        out.append(source[at : ref.lo])
        parity = base + sum(1 for n in ref.negatives if n >= lo)
        if parity % 2:
            out.append(NOTHING)
        else:
            g = groups[ref.group]
            out.append(f"(?:(?:{_render(source, g.lo, g.hi, 0, groups, refs)})?)")
        at = ref.hi
        if sum(map(len, out)) > MAX_WIDENED:
            raise _fail(
                source,
                f"backreferences whose widened pattern passes {MAX_WIDENED:,} characters",
                ref.lo,
            )
    out.append(source[at:hi])
    return "".join(out)


def _python(source: str, refs: list[_Ref]) -> str:
    """The pattern in Python's syntax: named groups ``(?P<name>``, references ``(?P=...)``
    or ``(?:\\N)`` (never read together with a digit after them)."""
    out, at = [], 0
    for ref in refs:
        out.append(_python_groups(source[at : ref.lo]))
        out.append(f"(?:\\{ref.group})")
        at = ref.hi
    out.append(_python_groups(source[at:]))
    return "".join(out)


def _python_groups(text: str) -> str:
    return re.sub(r"(?<!\\)\(\?<([A-Za-z_])", r"(?P<\1", text)


def _scan(source: str) -> tuple[list[_Group], list[_Ref], int | None]:
    """(capturing groups, references, where inline flags stand or None) of an ECMA source.
    Escapes and character classes are skipped (a class holds no reference)."""
    groups: list[_Group] = []
    refs: list[_Ref] = []
    names: dict[str, int] = {}
    # open groups: (number or 0, where the content starts, a negative lookaround?)
    stack: list[tuple[int, int, bool, int]] = []
    flags: int | None = None
    pending: list[tuple[int, int, str, tuple[int, ...]]] = []  # \k<name> read before its group
    i, n, count = 0, len(source), 0
    while i < n:
        c = source[i]
        negatives = tuple(start for _, _, neg, start in stack if neg)
        if c == "\\":
            j = i + 1
            while j < n and source[j].isdigit() and (j > i + 1 or source[j] != "0"):
                j += 1
            if j > i + 1:
                refs.append(_Ref(i, j, int(source[i + 1 : j]), negatives))
                i = j
                continue
            m = re.match(r"k<([A-Za-z_][A-Za-z0-9_]*)>", source[i + 1 :])
            if m:
                pending.append((i, i + 1 + m.end(), m.group(1), negatives))
                refs.append(_Ref(i, i + 1 + m.end(), -1, negatives))
                i += 1 + m.end()
                continue
            i += 2
        elif c == "[":
            i = _class_end(source, i)
        elif c == "(":
            rest = source[i + 1 :]
            named = re.match(r"\?<([A-Za-z_][A-Za-z0-9_]*)>", rest)
            if named:
                count += 1
                names[named.group(1)] = count
                stack.append((count, i + 1 + named.end(), False, i))
                i += 1 + named.end()
            elif rest.startswith(("?!", "?<!")):
                skip = 3 if rest.startswith("?!") else 4
                stack.append((0, i + skip, True, i))
                i += skip
            elif rest.startswith(("?:", "?=", "?<=")):
                skip = 4 if rest.startswith("?<=") else 3
                stack.append((0, i + skip, False, i))
                i += skip
            elif rest.startswith("?"):
                flags = i if flags is None else flags
                stack.append((0, i + 2, False, i))
                i += 2
            else:
                count += 1
                stack.append((count, i + 1, False, i))
                i += 1
        elif c == ")" and stack:
            number, lo, _, _ = stack.pop()
            if number:
                groups.append(_Group(number, lo, i))
            i += 1
        else:
            i += 1
    if pending:  # \k<name>: its number, from every named group of the pattern
        numbered = {(r.lo, r.hi): r for r in refs}
        for lo, hi, name, negatives in pending:
            if name not in names:
                raise _fail(source, f"a backreference to a group named {name!r}, which none is", lo)
            numbered[(lo, hi)] = _Ref(lo, hi, names[name], negatives)
        refs = sorted(numbered.values(), key=lambda r: r.lo)
    return groups, refs, flags


def _class_end(source: str, i: int) -> int:
    """Where the character class opened at ``source[i]`` ends (past its ``]``), as ECMA reads
    it (``[]`` is empty, ``[^]`` any character)."""
    j = i + 1 + (source[i + 1 : i + 2] == "^")
    while j < len(source) and source[j] != "]":
        j += 2 if source[j] == "\\" else 1
    return j + 1


def _fail(source: str, what: str, at: int) -> ConstraintError:
    return ConstraintError(f"regex {source!r}: {what} at position {at}")
