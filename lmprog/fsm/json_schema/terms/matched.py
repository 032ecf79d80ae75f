"""A string's patterns with backreferences, matched on the decoded text by the guide's check.

The grammar writes the term ``relaxed``: each such pattern widened (``regex.backrefs``), each
negated one left out, so it accepts a superset of the term's strings; ``PatternMatch`` reads
the string as it is decoded and refuses a token after which no match can follow (``regex``'s
partial matching) and a closing quote where the string does not match (``regex`` and, where
it compiles the pattern, ``re``, which ``jsonschema`` reads patterns with). Its interface is
``lengths.LengthCount``'s, so ``checks.JsonChecks`` reads a string through either.
Design: docs/design/json-schema.md.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from functools import lru_cache
from typing import Any

import regex

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.terms.jsontext import decode
from lmprog.fsm.json_schema.terms.nodes import StrT
from lmprog.fsm.regex import parse_regex
from lmprog.fsm.regex.backrefs import backreferences
from lmprog.fsm.regex.lookahead import split_lookaheads

# seconds one match of a pattern may take (a backtracking engine): past it a prefix is
# given the benefit of the doubt, a whole string is refused
PARTIAL_TIMEOUT = 0.05
CLOSE_TIMEOUT = 1.0
PROBE_S = 0.001  # a probe match within it: the mask's matches are called without a timeout


@lru_cache(maxsize=1024)
def compiled(source: str) -> tuple[Any, re.Pattern[str] | None]:
    """The pattern with backreferences (``regex.backrefs``) compiled by ``regex`` and, where
    it can, by ``re``; ConstraintError where ``regex`` cannot read it."""
    found = backreferences(source)
    assert found is not None, source
    try:
        exact = regex.compile(found.python)
    except regex.error as e:
        raise ConstraintError(f"regex {source!r}: {e} (read as {found.python!r})") from None
    try:
        plain: re.Pattern[str] | None = re.compile(found.python)
    except re.error:
        plain = None
    return exact, plain


def search(source: str, s: str, either: bool = False) -> bool:
    """Whether ``s`` holds a match of ``source`` (a pattern with backreferences) by
    ``regex`` and, where it compiles it, by ``re`` (the two backtrack apart: ``regex`` finds
    none of ``([ab]*)(a+)\1?\1?$`` in "baab"); `either`: by one of them (a pattern the
    string must not match). Past CLOSE_TIMEOUT, ``regex`` finds it if `either`, else not."""
    exact, plain = compiled(source)
    try:
        found = exact.search(s, timeout=CLOSE_TIMEOUT) is not None
    except TimeoutError:
        found = either
    if plain is None or found == either:
        return found
    return plain.search(s) is not None


def has_backrefs(t: StrT) -> bool:
    return any(backreferences(p) is not None for p in t.patterns + t.not_patterns)


class PatternMatch:
    """A string term's patterns with backreferences, matched as the string is decoded. The
    string read so far is (its text, characters, bytes of one begun); `read` moves it,
    `fits` says whether a match can still follow, `close` whether it matches. Immutable."""

    initial = ""  # the text read so far

    def __init__(self, t: StrT) -> None:
        self.must = tuple(p for p in t.patterns if backreferences(p) is not None)
        self.must_not = tuple(p for p in t.not_patterns if backreferences(p) is not None)
        for p in self.must + self.must_not:
            compiled(p)
        self.relaxed = _relaxed(t)
        # patterns a match can always follow (a branch not anchored at the start): a prefix
        # is never refused for them
        self._partial = tuple(compiled(p)[0] for p in self.must if not _free(p))

    def read(self, q: str, n: int, pending: bytes, data: bytes) -> tuple[str, int, bytes]:
        cps, pending = decode(pending + data)
        return q + "".join(map(chr, cps)), n + len(cps), pending

    def fits(self, q: str, n: int, pending: bytes) -> bool:
        """Whether a match of every pattern the string must match can still follow (a
        character begun: judged on the text before it)."""
        return all(self.prefix_fits(p, q) for p in self._partial)

    def fits_each(self, q: str, texts: list[str]) -> list[bool]:
        """``fits`` of `q` followed by each of `texts` (whole characters, in lexicographic
        order), in fewer calls: from the last, a text the next one extends fits where that one
        does (a prefix of a string a match can follow is one too; in that order the texts
        extending one follow it), and a pattern is called without its timeout where a probe
        on `q` and the longest text ran within PROBE_S (a call with a timeout costs about four
        without)."""
        out = [True] * len(texts)
        for pattern in self._partial:
            search = pattern.search
            if texts:
                probe, took = q + max(texts, key=len), PROBE_S
                for _ in range(3):  # (the least of three: a busy machine's pauses aside)
                    start = time.perf_counter()
                    self.prefix_fits(pattern, probe)
                    took = min(took, time.perf_counter() - start)
                if took >= PROBE_S:
                    search = None
            after, fitting = "", False  # the text after this one, whether it fits
            for i in range(len(texts) - 1, -1, -1):
                text = texts[i]
                if not out[i]:
                    found = False
                elif fitting and after.startswith(text):
                    found = True
                elif search is None:
                    found = self.prefix_fits(pattern, q + text)
                else:
                    found = search(q + text, partial=True) is not None
                out[i], after, fitting = found, text, found
        return out

    def prefix_fits(self, pattern: Any, q: str) -> bool:
        try:
            return pattern.search(q, partial=True, timeout=PARTIAL_TIMEOUT) is not None
        except TimeoutError:
            return True

    def close(self, q: str, n: int, pending: bytes) -> int | None:
        """The string's length if it matches every pattern it must and none it must not;
        else None."""
        cps, rest = decode(pending, final=True)
        assert not rest, rest
        s = q + "".join(map(chr, cps))
        if all(search(p, s) for p in self.must) and not any(
            search(p, s, either=True) for p in self.must_not
        ):
            return n + len(cps)
        return None

    @property
    def free(self) -> bool:
        """Whether no prefix is refused (only a closing quote may be)."""
        return not self._partial


def _relaxed(t: StrT) -> StrT:
    """The term the grammar writes: patterns with backreferences widened (their lookaheads
    split as any pattern's), negated ones left out."""
    patterns: list[str] = []
    not_patterns = [p for p in t.not_patterns if backreferences(p) is None]
    for p in t.patterns:
        found = backreferences(p)
        if found is None:
            patterns.append(p)
            continue
        must, must_not = split_lookaheads(found.widened)
        patterns += must
        not_patterns += must_not
    for p in patterns + not_patterns:
        parse_regex(p, "ecma")
    return replace(
        t,
        patterns=tuple(dict.fromkeys(patterns)),
        not_patterns=tuple(dict.fromkeys(not_patterns)),
    )


def _free(source: str) -> bool:
    """Whether any text can be followed by a match (a branch of the widened pattern not
    anchored at its start, with no lookahead)."""
    found = backreferences(source)
    assert found is not None
    must, must_not = split_lookaheads(found.widened)
    if must != (found.widened,) or must_not:
        return False
    return any(not b.start for b in parse_regex(found.widened, "ecma").branches)
