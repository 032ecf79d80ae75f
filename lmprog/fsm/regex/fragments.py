"""Emitted regex text, built with a few combinators that add groups only where needed.

``None`` stands for the empty language throughout: ``cat`` with it is ``None``, ``alt`` drops
it, ``rep(None, 0, n)`` is the empty string. Emitted text uses only the syntax subset described
in ``lmprog.fsm.regex``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple, overload

from lmprog.core.errors import ConstraintError
from lmprog.fsm.regex.charset import SCALARS, SURROGATES, CharSet


class R(NamedTuple):
    """An emitted regex fragment. ``None`` stands for the empty language throughout."""

    text: str
    atomic: bool  # takes a quantifier without a group
    has_alt: bool  # a top-level '|' (needs a group inside a concatenation)


EPS = R("", True, False)
_MAX_CHARS: ContextVar[int | None] = ContextVar("lmprog_max_pattern_chars", default=None)


@contextmanager
def pattern_limit(max_chars: int | None) -> Iterator[None]:
    """Within the block, a fragment longer than `max_chars` raises ConstraintError (None:
    no limit). A schema's pattern can grow exponentially with its nesting (each level of
    arrays repeats its items): this stops the growth where it happens."""
    token = _MAX_CHARS.set(max_chars)
    try:
        yield
    finally:
        _MAX_CHARS.reset(token)


def _bounded(r: R) -> R:
    limit = _MAX_CHARS.get()
    if limit is not None and len(r.text) > limit:
        raise ConstraintError(
            f"the constraint's regex grows past max_pattern_chars={limit:,} characters (its "
            "nesting or alternatives multiply the pattern); simplify the schema or raise "
            "max_pattern_chars"
        )
    return r


_META = set(".^$*+?()[]{}|\\")
_CLASS_META = set("\\]^[-&~")


def _escape_char(c: str, meta: set[str]) -> str:
    cp = ord(c)
    if cp < 0x20 or 0x7F <= cp <= 0x9F:
        return f"\\x{cp:02x}"
    return "\\" + c if c in meta else c


def lit(text: str) -> R:
    """The literal string ``text``."""
    if not text:
        return EPS
    body = "".join(_escape_char(c, _META) for c in text)
    return R(body, len(text) == 1, False)


def raw(text: str, atomic: bool = False) -> R:
    """A fragment written by hand in the emitted syntax (no top-level '|' unless grouped)."""
    return R(text, atomic, False)


def _grouped(r: R) -> str:
    return f"(?:{r.text})"


@overload
def cat(*parts: R) -> R: ...
@overload
def cat(*parts: R | None) -> R | None: ...
def cat(*parts: R | None) -> R | None:
    """Concatenation; the empty language if any part is."""
    if any(p is None for p in parts):
        return None
    texts = tuple(p for p in parts if p is not None and p.text)
    if not texts:
        return EPS
    if len(texts) == 1:
        return texts[0]
    return _bounded(R("".join(_grouped(p) if p.has_alt else p.text for p in texts), False, False))


@overload
def alt(first: R, /, *options: R | None) -> R: ...
@overload
def alt(*options: R | None) -> R | None: ...
def alt(*options: R | None) -> R | None:
    """Alternation; ``None`` options are dropped (an empty union is the empty language)."""
    seen: dict[str, R] = {}
    for o in options:
        if o is not None and o.text not in seen:
            seen[o.text] = o
    has_eps = "" in seen
    rest = [o for t, o in seen.items() if t]
    if not rest:
        return EPS if has_eps else None
    body = rest[0] if len(rest) == 1 else _bounded(R("|".join(o.text for o in rest), False, True))
    return rep(body, 0, 1) if has_eps else body


@overload
def rep(r: R, lo: int, hi: int | None) -> R: ...
@overload
def rep(r: R | None, lo: int, hi: int | None) -> R | None: ...
def rep(r: R | None, lo: int, hi: int | None) -> R | None:
    """``r`` repeated lo..hi times (hi None = unbounded)."""
    assert lo >= 0 and (hi is None or hi >= lo), (lo, hi)
    if hi == 0 or (r is not None and not r.text):
        return EPS
    if r is None:
        return EPS if lo == 0 else None
    if lo == hi == 1:
        return r
    q = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((lo, hi))
    if q is None:
        q = f"{{{lo}}}" if lo == hi else f"{{{lo},}}" if hi is None else f"{{{lo},{hi}}}"
    base = r.text if r.atomic else _grouped(r)
    return _bounded(R(base + q, False, False))


def opt(r: R | None) -> R:
    return EPS if r is None else rep(r, 0, 1)


def charset_regex(s: CharSet) -> R | None:
    """One character of ``s`` as a class, choosing the form that keeps classes small."""
    s = s & SCALARS
    if s.is_empty():
        return None
    if s == SCALARS:
        return R("[\\s\\S]", True, False)
    if len(s.ranges) == 1 and s.ranges[0][0] == s.ranges[0][1]:
        return R(_escape_char(chr(s.ranges[0][0]), _META), True, False)
    negated = s.size() > 4096
    parts = []
    for lo, hi in _negated_ranges(s) if negated else s.ranges:
        a = _escape_char(chr(lo), _CLASS_META)
        if lo == hi:
            parts.append(a)
        else:
            sep = "" if hi == lo + 1 else "-"
            parts.append(a + sep + _escape_char(chr(hi), _CLASS_META))
    return R(("[^" if negated else "[") + "".join(parts) + "]", True, False)


def _negated_ranges(s: CharSet) -> list[tuple[int, int]]:
    """The ranges a negated class of ``s`` lists: the scalars outside ``s``, where a run on both
    sides of the surrogates is one range written across them (``\\ud7fc-\\uf8ff``). Listed
    as two ranges (ending at U+D7FF, starting at U+E000), llguidance 1.9.1's negated class
    matches U+D7FF and U+E000 although both are listed (``[^\\ud7ff\\ue000]`` matches
    them): where the class of ``\\p{L}`` and a few more was negated, U+E000 passed."""
    lo_s, hi_s = SURROGATES
    out = []
    for lo, hi in s.complement().ranges:  # s holds no surrogate: the complement holds them all
        lo = hi_s + 1 if lo_s <= lo <= hi_s else lo
        hi = lo_s - 1 if lo_s <= hi <= hi_s else hi
        if lo <= hi:
            out.append((lo, hi))
    return out
