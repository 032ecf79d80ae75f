"""Regular expressions as values: character sets, an AST, a strict parser and an emitter.

    parsed = parse_regex(pattern, dialect="ecma")   # or "python"; ConstraintError if not exact
    fragment = emit(parsed.whole())                  # R, in the subset every engine reads

Every pattern lmprog hands to the token index is emitted here, never passed through from a
user: literals, explicit classes, ``(?:...)``, ``|`` and quantifiers, always meaning "the whole
string". Which constructs are read and how: docs/design/constraints.md.
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
