"""Regular expressions as values: character sets, an AST, a strict parser and an emitter.

Every pattern lmprog hands to the token index is *emitted* by this module, never passed through
from a user. The emitted syntax is the common subset that Python ``re``, interegular and the Rust
``regex`` crate (llguidance, the token engine) read the same way:

* literals, with metacharacters backslash-escaped and control characters as ``\\xHH``;
* classes ``[...]`` / ``[^...]`` with explicit ranges (never ``\\d``/``\\w``/``\\s``, whose meaning
  differs between engines; ``[\\s\\S]`` is used only for "any character");
* ``(?:...)`` groups, ``|``, and the quantifiers ``* + ? {n} {n,} {n,m}``.

No anchors, lookaround, backreferences or flags: an emitted pattern always means "the whole
string". ``parse_regex`` accepts Python-style (``dialect="python"``) or ECMA-262 (``"ecma"``, the
JSON Schema ``pattern`` dialect) syntax, with Python's inline flags (``(?i)``, ``(?s)``, ``(?m)``,
scoped ``(?i:...)``; ``casefold.py``) and ``\\A``/``\\Z`` in both; word boundaries and
lookarounds of one character class become assertion-free branches (``assertions.py``), longer
lookaheads in JSON Schema patterns intersections (``lookahead.py``) or, where those cannot
place them, branches through the automaton too. It raises
``ConstraintError`` naming the construct and its position for anything that cannot be
represented exactly (longer lookbehinds, backreferences, the ``x`` flag, Unicode properties
other than general categories such as ``\\p{L}``, ...).
"""

from __future__ import annotations

import re

from lmprog.core.errors import ConstraintError
from lmprog.fsm.regex.charset import ANY_CHAR, MAX_CP, CharSet, cs, unicode_category
from lmprog.fsm.regex.fragments import EPS, R, alt, cat, charset_regex, lit, opt, raw, rep
from lmprog.fsm.regex.parser import parse_regex
from lmprog.fsm.regex.syntax import (
    EMPTY,
    Alternation,
    Branch,
    Chars,
    Concat,
    Node,
    ParsedRegex,
    Repeat,
    emit,
    node_lengths,
    nonempty,
)

__all__ = [
    "check_not_only_empty",
    "ANY_CHAR",
    "MAX_CP",
    "CharSet",
    "cs",
    "unicode_category",
    "EPS",
    "R",
    "alt",
    "cat",
    "charset_regex",
    "lit",
    "opt",
    "raw",
    "rep",
    "parse_regex",
    "EMPTY",
    "Alternation",
    "Branch",
    "Chars",
    "Concat",
    "Node",
    "ParsedRegex",
    "Repeat",
    "emit",
    "node_lengths",
    "compile_user_regex",
    "value_matcher",
]


def compile_user_regex(pattern: str) -> str:
    """The canonical emitted form of a Python-style user regex (full-match semantics)."""
    parsed = parse_regex(pattern, "python")
    out = emit(parsed.whole())
    if out is None:
        raise ConstraintError(f"regex {pattern!r} matches no string")
    return out.text


def check_not_only_empty(pattern: str) -> None:
    """ConstraintError if a user's regex for a gen matches the empty string alone (the gen
    could output nothing)."""
    if nonempty(parse_regex(pattern, "python").whole()) is None:
        raise ConstraintError(
            f"regex {pattern!r} matches only the empty string, so the gen could output "
            "nothing; drop the constraint or give a pattern with non-empty matches"
        )


def value_matcher(parsed: ParsedRegex) -> re.Pattern[str]:
    """A Python ``re`` pattern, for ``fullmatch``, testing a value against an ECMA ``pattern``
    with JSON Schema's search semantics (unanchored = "contains")."""
    anything = rep(charset_regex(ANY_CHAR), 0, None)
    options = []
    for b in parsed.branches:
        body = emit(b.node)
        options.append(cat(EPS if b.start else anything, body, EPS if b.end else anything))
    out = alt(*options)
    return re.compile(out.text if out is not None else "[^\\s\\S]")
