"""JSON strings: character tokens, lengths, patterns, formats and excluded values.

A string's text is ``"`` + tokens + ``"``. With a ``minLength``, one token per code point:

* a literal character other than ``"``, ``\\`` and U+0000..U+001F;
* a short escape ``\\" \\\\ \\/ \\b \\f \\n \\r \\t``;
* ``\\uXXXX`` (hex in either case) for a non-surrogate code point, or a surrogate pair
  ``\\uD8xx\\uDCxx`` for one astral code point (lone surrogates are rejected),

so ``{min,max}`` repetitions count characters the way ``minLength``/``maxLength`` do. Without a
``minLength`` any ``\\uXXXX`` is one token (a shorter regex; a pair then counts as two, which can
only make ``maxLength`` stricter). Unconstrained strings accept every spelling. Under a
``pattern``/``format`` each character is matched in its canonical spelling (the one
``json.dumps(..., ensure_ascii=False)`` writes); other spellings of the same string are rejected,
which narrows the text language but not the set of values. Strings that must avoid some values
(``not``/``enum``, keys other than the named properties) are also written canonically, so that a
trie over the excluded strings' single spelling removes them exactly.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.digits import fixed_width_range
from lmprog.fsm.json_schema.formats import format_pattern
from lmprog.fsm.json_schema.terms import StrT
from lmprog.fsm.regex import (
    ANY_CHAR,
    EPS,
    Alternation,
    Chars,
    CharSet,
    Concat,
    ParsedRegex,
    R,
    Repeat,
    alt,
    cat,
    charset_regex,
    emit,
    lit,
    node_lengths,
    parse_regex,
    raw,
    rep,
)

# one UTF-16 code unit: right wherever only an upper bound on the length matters (a surrogate
# pair is two tokens but one character, so the count of characters never exceeds the tokens)
UNIT_TOKEN = raw(r'(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))', atomic=True)
# one code point: pairs are one token, lone surrogates are refused (minLength needs this)
ANY_TOKEN = raw(
    r'(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}'
    r"|[dD][0-7][0-9a-fA-F]{2}|[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})))",
    atomic=True,
)
_SHORT = {'"': '"', "\\": "\\", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
_MUST_ESCAPE = CharSet.of('"\\') | CharSet(((0, 0x1F),))


@lru_cache(maxsize=4096)
def canonical_token(chars: CharSet) -> R | None:
    """One character of ``chars`` in its canonical JSON spelling (either hex case)."""
    literal = charset_regex(chars - _MUST_ESCAPE)
    special = (chars & _MUST_ESCAPE).chars()
    letters = [_SHORT[c] for c in special if c in _SHORT]
    codes = [ord(c) for c in special if c not in _SHORT]
    escaped = alt(
        charset_regex(CharSet.of(letters)) if letters else None,
        cat(lit("u00"), alt(*(fixed_width_range(a, b, 2) for a, b in _runs(codes))))
        if codes
        else None,
    )
    return alt(literal, cat(lit("\\"), escaped) if escaped is not None else None)


def _runs(codes: list[int]) -> list[tuple[int, int]]:
    return list(CharSet.from_ranges((c, c) for c in codes).ranges)


_ANY_CANONICAL = canonical_token(ANY_CHAR)


# ----------------------------------------------------------------------------- string terms


def json_text(s: str) -> str:
    """The canonical JSON text of a string (``json.dumps``, non-ASCII kept as is; a lone
    surrogate, which no UTF-8 text can hold, escaped as ``\\uXXXX``)."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(s, ensure_ascii=False))


_SURROGATE = re.compile("[\ud800-\udfff]")


@lru_cache(maxsize=4096)
def _parsed(source: str) -> ParsedRegex:
    return parse_regex(source, "ecma")


def string_regex(t: StrT) -> R | None:
    """The JSON text (with quotes) of the strings of ``t``."""
    if t.values is not None:
        return alt(*(lit(json_text(v)) for v in sorted(t.values)))
    return cat(lit('"'), _content(t), lit('"'))


def can_exclude(t: StrT) -> bool:
    """Whether values can be excluded from ``t`` exactly (not under a pattern or format)."""
    return t.values is not None or not (t.patterns or t.formats)


def _content(t: StrT) -> R | None:
    sources = list(t.patterns) + [format_pattern(f) for f in t.formats]
    if not sources:
        if t.excluded:
            return _not_in(t.excluded, t.min_len, t.max_len)
        return rep(ANY_TOKEN if t.min_len else UNIT_TOKEN, t.min_len, t.max_len)
    if len(sources) > 1:
        raise ConstraintError(
            f"a string with several patterns/formats {sources} has no exact regex"
        )
    if t.excluded:
        raise ConstraintError(
            f"a pattern/format with excluded values {sorted(t.excluded)} "
            "(from not/enum/properties) has no exact regex"
        )
    return _pattern_content(_parsed(sources[0]), t.min_len, t.max_len)


def _pattern_content(p: ParsedRegex, lo: int, hi: int | None) -> R | None:
    """Tokens of strings that contain a match of ``p`` (exactly match, where anchored)."""
    anything = rep(UNIT_TOKEN, 0, None)
    options = []
    for b in p.branches:
        if lo > 0 or hi is not None:  # the padding becomes part of the node, to be counted
            pad = () if b.start else (Repeat(Chars(ANY_CHAR), 0, None),)
            node = Concat(
                pad + (b.node,) + (() if b.end else pad or (Repeat(Chars(ANY_CHAR), 0, None),))
            )
            options.append(emit(restrict_length(node, lo, hi, p.source), canonical_token))
            continue
        body = emit(b.node, canonical_token)
        options.append(cat(EPS if b.start else anything, body, EPS if b.end else anything))
    return alt(*options)


def restrict_length(node, lo: int, hi: int | None, source: str):
    """``node`` limited to strings of lo..hi characters: exactly when that is a change of one
    repetition count (fixed-length parts around one repetition of a fixed-length body), else,
    for an upper bound only, by capping every repetition count so that no match is longer than
    ``hi`` (a narrowing: e.g. ``format: email`` with ``maxLength: 40``)."""
    exact = _exact_length(node, lo, hi)
    if exact is not None:
        return exact
    if node_lengths(node)[0] >= lo and hi is not None:
        capped = _capped(node, hi)
        if capped is not None:
            return capped
    raise ConstraintError(
        f"pattern {source!r} together with minLength/maxLength has no exact "
        "regex (supported: one repetition of a fixed-length part between "
        "fixed-length parts, or a maxLength the pattern can be capped to)"
    )


def _exact_length(node, lo: int, hi: int | None):
    n_lo, n_hi = node_lengths(node)
    if n_lo >= lo and (hi is None or (n_hi is not None and n_hi <= hi)):
        return node
    if isinstance(node, Alternation):
        options = [_exact_length(o, lo, hi) for o in node.options]
        return None if any(o is None for o in options) else Alternation(tuple(options))
    parts = node.parts if isinstance(node, Concat) else (node,)
    if n_lo == n_hi:  # fixed length outside lo..hi
        return Alternation(())
    variable = [i for i, p in enumerate(parts) if node_lengths(p)[0] != node_lengths(p)[1]]
    if len(variable) != 1 or not isinstance(parts[variable[0]], Repeat):
        return None
    r = parts[variable[0]]
    unit = node_lengths(r.node)
    if unit[0] != unit[1] or unit[0] == 0:
        return None
    fixed = sum(node_lengths(p)[0] for i, p in enumerate(parts) if i != variable[0])
    k_lo = max(r.lo, -(-(lo - fixed) // unit[0]))
    k_hi = (hi - fixed) // unit[0] if hi is not None else None
    if r.hi is not None:
        k_hi = r.hi if k_hi is None else min(k_hi, r.hi)
    if k_hi is not None and k_hi < k_lo:
        return Alternation(())
    new = list(parts)
    new[variable[0]] = Repeat(r.node, k_lo, k_hi)
    return Concat(tuple(new))


def _capped(node, hi: int):
    """``node`` with repetition counts lowered until no match is longer than ``hi`` characters:
    unbounded repetitions first get one common cap, as large as fits; if that is not enough, the
    repetition that may add the most characters is halved, again and again; the
    alternatives of a top-level alternation are capped one by one, and those that cannot fit are
    dropped (None if nothing fits)."""
    while isinstance(node, Concat) and len(node.parts) == 1:
        node = node.parts[0]
    if isinstance(node, Alternation):
        options = [o for o in (_capped(o, hi) for o in node.options) if o is not None]
        return Alternation(tuple(options)) if options else None
    caps: dict = {}

    def collect(n) -> None:
        if isinstance(n, Repeat):
            caps.setdefault(n, n.hi if n.hi is not None else max(n.lo, hi))
            collect(n.node)
        elif isinstance(n, (Concat, Alternation)):
            for p in n.parts if isinstance(n, Concat) else n.options:
                collect(p)

    def build(n):
        if isinstance(n, Repeat):
            return Repeat(build(n.node), n.lo, caps[n])
        if isinstance(n, Concat):
            return Concat(tuple(build(p) for p in n.parts))
        if isinstance(n, Alternation):
            return Alternation(tuple(build(o) for o in n.options))
        return n

    def room(r) -> int:  # characters a repetition may add; optional groups (?) go last
        return 0 if caps[r] == 1 else (caps[r] - r.lo) * (node_lengths(r.node)[1] or hi)

    collect(node)
    unbounded = [r for r in caps if r.hi is None]
    if unbounded:  # first try one cap for every unbounded repetition, as large as fits
        low, high = 0, hi
        while low < high:
            mid = (low + high + 1) // 2
            caps.update({r: r.lo + mid for r in unbounded})
            low, high = (mid, high) if node_lengths(build(node))[1] <= hi else (low, mid - 1)
        caps.update({r: r.lo + low for r in unbounded})
    while True:
        capped = build(node)
        if node_lengths(capped)[1] <= hi:
            return capped
        loose = [r for r in caps if caps[r] > r.lo]
        if not loose:
            return None
        widest = max(loose, key=room)
        caps[widest] = widest.lo + (caps[widest] - widest.lo) // 2


def _not_in(excluded: frozenset, lo: int, hi: int | None) -> R | None:
    """Tokens of strings of lo..hi characters that are not in ``excluded``."""
    trie: dict = {}
    for word in sorted(
        excluded
    ):  # sorted: the pattern (and its index cache key) must not depend on the hash seed
        node = trie
        for c in word:
            node = node.setdefault(c, {})
        node[None] = True
    return _trie_node(trie, 0, lo, hi)


def _trie_node(trie: dict, depth: int, lo: int, hi: int | None) -> R | None:
    options = []
    if None not in trie and lo <= depth and (hi is None or depth <= hi):
        options.append(EPS)
    if hi is None or depth < hi:
        children = [c for c in trie if c is not None]
        for c in children:
            options.append(
                cat(canonical_token(CharSet.of(c)), _trie_node(trie[c], depth + 1, lo, hi))
            )
        tail_hi = None if hi is None else hi - depth - 1
        other = canonical_token(ANY_CHAR - CharSet.of(children))
        options.append(cat(other, rep(_ANY_CANONICAL, max(0, lo - depth - 1), tail_hi)))
    return alt(*options)
