"""JSON strings: character tokens, lengths, patterns, formats and excluded values.

With a ``minLength`` a string is one token per code point (a character, a short escape or
``\\uXXXX``), so ``{min,max}`` counts characters as the keywords do; under a pattern, a format
or excluded values its characters are written in their canonical spelling, so exclusion is
exact (``string_expr``). Design: docs/design/json-schema.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import TYPE_CHECKING

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.emit.digits import fixed_width_range
from lmprog.fsm.json_schema.terms.formats import format_pattern
from lmprog.fsm.json_schema.terms.nodes import StrT
from lmprog.fsm.regex import (
    ANY_CHAR,
    EPS,
    Alternation,
    CharSet,
    Concat,
    Node,
    ParsedRegex,
    R,
    Repeat,
    alt,
    cat,
    charset_regex,
    emit,
    lit,
    parse_regex,
    raw,
    rep,
)
from lmprog.fsm.regex.backrefs import has_backreference
from lmprog.fsm.regex.charset import SCALARS
from lmprog.fsm.regex.lookahead import complement_source, split_lookaheads

if TYPE_CHECKING:
    from lmprog.fsm.json_schema.emit.lark import Tok

# one UTF-16 code unit: right wherever only an upper bound on the length matters (a surrogate
# pair is two tokens but one character, so the count of characters never exceeds the tokens)
UNIT_TOKEN = raw(r'(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))', atomic=True)
# one code point: pairs are one token, lone surrogates are refused (minLength needs this)
ANY_TOKEN = raw(
    r'(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}'
    r"|[dD][0-7][0-9a-fA-F]{2}|[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})))",
    atomic=True,
)
# one UTF-16 code unit or an escaped surrogate pair (one character): a reading grammar's
# upper bounds on lengths, where a pair written as two escapes must count one
PAIRED_UNIT_TOKEN = raw(
    r'(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}'
    r"|u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}))",
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

# ----------------------------------------------------------------------------- every spelling

# While a reading grammar is built (``build_grammar(read_spellings=...)``), which strings are
# written in every JSON spelling, not only canonical: everything (True: ``matches``, read over
# bytes), or LITERALS (a token reader's: keys, enum/const strings, strings bound only by excluded
# values or patterns without repetition, and numbers' spellings; the characters of patterns
# with a repetition and of formats stay canonical, as a counted repetition of spelled
# characters passes llguidance's lexer limits over a model's vocabulary)
LITERALS = "literals"
CharTokens = Callable[[CharSet], R | None]  # one character of a set, as the grammar writes it
_READ_SPELLINGS: ContextVar[bool | str] = ContextVar("read_spellings", default=False)
_SHORT_ANY = {**_SHORT, "/": "/"}  # \/ is a spelling of "/", never the canonical one
_BMP = CharSet(((0, 0xFFFF),))


@contextmanager
def read_spellings(which: bool | str) -> Iterator[None]:
    """Strings written in every JSON spelling inside: all of them (True), literal ones
    (``LITERALS``) or none (False)."""
    token = _READ_SPELLINGS.set(which)
    try:
        yield
    finally:
        _READ_SPELLINGS.reset(token)


def spellings_read() -> bool:
    """Whether the grammar being built is a reading one (``read_spellings`` True or
    ``LITERALS``): literal strings and numbers in every spelling."""
    return bool(_READ_SPELLINGS.get())


def _char_tokens(sources: list[str | None]) -> CharTokens:
    """How the characters of a string term's patterns and free part are written (``sources``:
    its patterns and formats, with lookaheads split): every spelling where all strings are
    read so (True), or for ``LITERALS`` where no pattern repeats (the strings matched a
    finite set of short literals); else the canonical spelling. All the parts of one term are
    written alike, so a ``~`` part excludes every spelling the others take."""
    which = _READ_SPELLINGS.get()
    if which is True:
        return spelled_token
    parsed = [_parsed(s) for s in sources if s is not None]
    if which == LITERALS and not any(_repeats(b.node) for p in parsed for b in p.branches):
        return spelled_token
    return canonical_token


def _repeats(node: Node) -> bool:
    if isinstance(node, Repeat):
        return True
    if isinstance(node, Concat):
        return any(_repeats(n) for n in node.parts)
    if isinstance(node, Alternation):
        return any(_repeats(n) for n in node.options)
    return False


@lru_cache(maxsize=4096)
def spelled_token(chars: CharSet) -> R | None:
    """One character of ``chars`` in every JSON spelling: as itself (where JSON allows), a
    short escape (``\\n``, ``\\/``...), ``\\uXXXX`` in either hex case, or a surrogate pair
    of escapes for a character past the BMP. A surrogate is never escaped alone: a pair would
    otherwise read as two characters. One alternative per range of ``chars``: linear in it."""
    literal = charset_regex(chars - _MUST_ESCAPE)
    letters = [_SHORT_ANY[c] for c in (chars & CharSet.of(list(_SHORT_ANY))).chars()]
    scalars = chars & SCALARS
    units = [fixed_width_range(a, b, 4) for a, b in (scalars & _BMP).ranges]
    pairs = [_pair(a, b) for a, b in (scalars - _BMP).ranges]
    escaped = alt(
        charset_regex(CharSet.of(letters)) if letters else None,
        cat(lit("u"), alt(*units)) if units else None,
        *pairs,
    )
    return alt(literal, cat(lit("\\"), escaped) if escaped is not None else None)


def _pair(a: int, b: int) -> R | None:
    """The surrogate-pair escapes (``uD83D\\uDE00``, after the first backslash) of the code
    points a..b past the BMP: at most three blocks of high surrogates by their low ones."""
    (ha, la), (hb, lb) = divmod(a - 0x10000, 0x400), divmod(b - 0x10000, 0x400)
    blocks = [(ha, ha, la, lb)] if ha == hb else [(ha, ha, la, 0x3FF), (hb, hb, 0, lb)]
    if hb > ha + 1:
        blocks.insert(1, (ha + 1, hb - 1, 0, 0x3FF))
    return alt(
        *(
            cat(
                lit("u"),
                fixed_width_range(0xD800 + h0, 0xD800 + h1, 4),
                lit("\\u"),
                fixed_width_range(0xDC00 + l0, 0xDC00 + l1, 4),
            )
            for h0, h1, l0, l1 in blocks
        )
    )


def string_text(s: str) -> R:
    """The text of the string ``s``: its canonical JSON text, or while reading
    (``read_spellings``) every spelling of it, one alternative per character."""
    if not _READ_SPELLINGS.get():
        return lit(json_text(s))
    chars: list[R] = []
    for c in s:
        if 0xD800 <= ord(c) <= 0xDFFF:  # a lone surrogate: only an escape can hold it
            one = cat(lit("\\u"), fixed_width_range(ord(c), ord(c), 4))
        else:
            one = spelled_token(CharSet.of(c))
        assert one is not None  # every character has a spelling
        chars.append(one)
    return cat(lit('"'), *chars, lit('"'))


# ----------------------------------------------------------------------------- string terms


def json_text(s: str) -> str:
    """The canonical JSON text of a string (``json.dumps``, non-ASCII kept as is; a lone
    surrogate, which no UTF-8 text can hold, escaped as ``\\uXXXX``)."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(s, ensure_ascii=False))


_SURROGATE = re.compile("[\ud800-\udfff]")


@lru_cache(maxsize=4096)
def _parsed(source: str) -> ParsedRegex:
    return parse_regex(source, "ecma")


def string_lexeme(t: StrT, counted: bool = False) -> Tok | None:
    """The lexeme (``lark.tok``) of the strings of ``t``; None if there are none. `counted`:
    its maxLength is left to the check (``lengths.counted_apart``)."""
    from lmprog.fsm.json_schema.emit.lark import tok

    expr = string_expr(t, counted)
    return None if expr is None else tok(expr)


def string_expr(t: StrT, counted: bool = False) -> str | None:
    """The strings of ``t`` as a Lark terminal expression: one regex, or regexes joined with
    llguidance's ``&`` (and) and ``~`` (not) where facets combine:

    * each pattern and format: the strings containing (or matching, if anchored) a match;
    * ``minLength``/``maxLength`` beside them: the strings of that many characters;
    * excluded values and negated patterns: ``& ~(...)``, exact because the strings are also
      held to their canonical spelling (so each excluded value has one text to exclude), or
      while reading spelled every way on both sides (``_char_tokens``).
    None for an empty set of values. `counted`: the maxLength is not written (the check
    counts it), the minLength is."""
    from lmprog.fsm.json_schema.emit.lark import regex_terminal

    if t.values is not None:
        r = alt(*(string_text(v) for v in sorted(t.values)))
        return None if r is None else regex_terminal(r)
    _no_backreference(t)
    # patterns with lookaheads: the patterns a match must (not) match (regex.lookahead)
    split = [split_lookaheads(src) for src in t.patterns]
    sources = [m for must, _ in split for m in must] + [format_pattern(f) for f in t.formats]
    negated = [n for _, must_not in split for n in must_not]
    looks = []
    for src in t.not_patterns:
        must, must_not = split_lookaheads(src)
        # a pattern to avoid, written where small as the pattern of the strings avoiding it
        # (regex.dfa): llguidance's ``~`` beside a maxLength can exhaust its lexer's fuel
        positive = complement_source(src) if must == (src,) and not must_not else None
        if positive is None:
            looks.append((must, must_not))
        else:
            sources.append(positive)
    looked = [src for must, must_not in looks for src in must + must_not]
    tokens = _char_tokens([*sources, *negated, *looked])
    exclusive = bool(t.excluded or looks or negated)
    lengths = t.min_len > 0 or t.max_len is not None
    if lengths and t.max_len is not None and t.min_len > t.max_len:
        return None
    parts = [_quoted(_pattern_content(_parsed(src), tokens)) for src in sources]
    if counted:
        lengths = t.min_len > 0
    if lengths or not (parts or exclusive):
        hi = None if counted else t.max_len
        unit = PAIRED_UNIT_TOKEN if spellings_read() else UNIT_TOKEN
        parts.append(_quoted(rep(ANY_TOKEN if t.min_len else unit, t.min_len, hi)))
    if exclusive:
        parts.append(_quoted(rep(tokens(ANY_CHAR), 0, None)))
    texts = [regex_terminal(r) for r in parts if r is not None]
    if len(texts) < len(parts):
        return None
    if exclusive:
        plain = [must[0] for must, must_not in looks if len(must) == 1 and not must_not]
        out = [_quoted(_pattern_content(_parsed(src), tokens)) for src in plain + negated]
        out += [string_text(v) for v in sorted(t.excluded)]
        if out:
            any_of = alt(*out)
            assert any_of is not None  # patterns no string matches are dropped before
            texts.append("~" + regex_terminal(any_of))
        for must, must_not in looks:  # a negated pattern with lookaheads: ~(a & b & ~c)
            if len(must) > 1 or must_not:
                texts.append("~" + _matches(must, must_not, tokens))
    return texts[0] if len(texts) == 1 else "(" + " & ".join(texts) + ")"


def _no_backreference(t: StrT) -> None:
    """ConstraintError for a term with a pattern holding a backreference: no grammar holds
    it; only a term the check matches (``matched.PatternMatch``) is written, relaxed."""
    for src in t.patterns + t.not_patterns:
        if has_backreference(src):
            raise ConstraintError(
                f"pattern {src!r} holds a backreference, which no grammar can hold, at a "
                "place where the check made as the text is decoded cannot tell which string "
                "schema a string follows (a union of string schemas or of containers there, "
                "'contains', 'not' over additionalProperties, propertyNames, or a grammar "
                "composed with another); write the pattern without it"
            )


def _matches(must: tuple[str, ...], must_not: tuple[str, ...], tokens: CharTokens) -> str:
    """The strings matching every pattern of ``must`` and none of ``must_not``, their
    characters written by ``tokens``."""
    from lmprog.fsm.json_schema.emit.lark import regex_terminal

    texts = [regex_terminal(_matching(src, tokens)) for src in must]
    if must_not:
        any_of = alt(*(_quoted(_pattern_content(_parsed(src), tokens)) for src in must_not))
        assert any_of is not None  # patterns no string matches are dropped before
        texts.append("~" + regex_terminal(any_of))
    return "(" + " & ".join(texts) + ")"


def _matching(src: str, tokens: CharTokens) -> R:
    r = _quoted(_pattern_content(_parsed(src), tokens))
    assert r is not None, src  # a pattern no string matches: the schema was refused before
    return r


def _quoted(content: R | None) -> R | None:
    return cat(lit('"'), content, lit('"'))


def _pattern_content(p: ParsedRegex, tokens: CharTokens) -> R | None:
    """Tokens of strings that contain a match of ``p`` (exactly match, where anchored); the
    matched part's characters written by ``tokens``, the rest in any spelling."""
    anything = rep(UNIT_TOKEN, 0, None)
    options = []
    for b in p.branches:
        body = emit(b.node, tokens)
        options.append(cat(EPS if b.start else anything, body, EPS if b.end else anything))
    return alt(*options)
