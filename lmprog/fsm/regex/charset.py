"""Sets of code points as sorted ranges, and the Unicode general categories."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

MAX_CP = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

# ----------------------------------------------------------------------------- character sets


@dataclass(frozen=True)
class CharSet:
    """A set of code points as sorted, disjoint, non-adjacent inclusive ranges."""

    ranges: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def of(chars: Iterable[str]) -> CharSet:
        return CharSet.from_ranges((ord(c), ord(c)) for c in chars)

    @staticmethod
    def from_ranges(ranges: Iterable[tuple[int, int]]) -> CharSet:
        out: list[list[int]] = []
        for lo, hi in sorted(ranges):
            assert 0 <= lo <= hi <= MAX_CP, (lo, hi)
            if out and lo <= out[-1][1] + 1:
                out[-1][1] = max(out[-1][1], hi)
            else:
                out.append([lo, hi])
        return CharSet(tuple((a, b) for a, b in out))

    def __contains__(self, ch: str) -> bool:
        cp = ord(ch)
        return any(lo <= cp <= hi for lo, hi in self.ranges)

    def __or__(self, other: CharSet) -> CharSet:
        return CharSet.from_ranges(self.ranges + other.ranges)

    def __sub__(self, other: CharSet) -> CharSet:
        return self & other.complement()

    def __and__(self, other: CharSet) -> CharSet:
        out, i, j = [], 0, 0
        a, b = self.ranges, other.ranges
        while i < len(a) and j < len(b):
            lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
            if lo <= hi:
                out.append((lo, hi))
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return CharSet(tuple(out))

    def complement(self) -> CharSet:
        out, start = [], 0
        for lo, hi in self.ranges:
            if lo > start:
                out.append((start, lo - 1))
            start = hi + 1
        if start <= MAX_CP:
            out.append((start, MAX_CP))
        return CharSet(tuple(out))

    def size(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.ranges)

    def is_empty(self) -> bool:
        return not self.ranges

    def chars(self) -> list[str]:
        """The members, in order; only for small sets."""
        assert self.size() <= 4096, "chars() on a large set"
        return [chr(c) for lo, hi in self.ranges for c in range(lo, hi + 1)]


ANY_CHAR = CharSet(((0, MAX_CP),))
SCALARS = CharSet((SURROGATES,)).complement()  # every code point text can hold


def cs(spec: str) -> CharSet:
    """A set from a compact spec such as ``"a-zA-Z_"`` (no escapes; ``-`` last means itself)."""
    ranges, i = [], 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1] == "-":
            ranges.append((ord(spec[i]), ord(spec[i + 2])))
            i += 3
        else:
            ranges.append((ord(spec[i]), ord(spec[i])))
            i += 1
    return CharSet.from_ranges(ranges)


CATEGORY_NAMES = {
    "Letter": "L",
    "Cased_Letter": "LC",
    "Uppercase_Letter": "Lu",
    "Lowercase_Letter": "Ll",
    "Titlecase_Letter": "Lt",
    "Modifier_Letter": "Lm",
    "Other_Letter": "Lo",
    "Mark": "M",
    "Nonspacing_Mark": "Mn",
    "Spacing_Mark": "Mc",
    "Enclosing_Mark": "Me",
    "Number": "N",
    "Decimal_Number": "Nd",
    "digit": "Nd",
    "Letter_Number": "Nl",
    "Other_Number": "No",
    "Punctuation": "P",
    "punct": "P",
    "Connector_Punctuation": "Pc",
    "Dash_Punctuation": "Pd",
    "Open_Punctuation": "Ps",
    "Close_Punctuation": "Pe",
    "Initial_Punctuation": "Pi",
    "Final_Punctuation": "Pf",
    "Other_Punctuation": "Po",
    "Symbol": "S",
    "Math_Symbol": "Sm",
    "Currency_Symbol": "Sc",
    "Modifier_Symbol": "Sk",
    "Other_Symbol": "So",
    "Separator": "Z",
    "Space_Separator": "Zs",
    "Line_Separator": "Zl",
    "Paragraph_Separator": "Zp",
    "Other": "C",
    "Control": "Cc",
    "cntrl": "Cc",
    "Format": "Cf",
    "Surrogate": "Cs",
    "Private_Use": "Co",
    "Unassigned": "Cn",
}


# Java's POSIX character classes (java.util.regex.Pattern, US-ASCII: its default), as
# patterns written for Java validators (AWS CloudFormation's resource schemas) mean them;
# \p{ASCII} is also ECMA-262's binary property of that name
_PUNCT = "!-/:-@[-`{-~"
POSIX_CLASSES = {
    "Lower": cs("a-z"),
    "Upper": cs("A-Z"),
    "ASCII": CharSet.from_ranges([(0, 0x7F)]),
    "Alpha": cs("a-zA-Z"),
    "Digit": cs("0-9"),
    "Alnum": cs("a-zA-Z0-9"),
    "Punct": cs(_PUNCT),
    "Graph": cs("!-~"),
    "Print": cs(" -~"),
    "Blank": cs(" \t"),
    "Cntrl": CharSet.from_ranges([(0, 0x1F), (0x7F, 0x7F)]),
    "XDigit": cs("0-9a-fA-F"),
    "Space": cs(" \t\n\x0b\x0c\r"),
}


@cache
def _categories() -> dict[str, CharSet]:
    """Every code point by Unicode general category (from ``unicodedata``; built once)."""
    import unicodedata

    ranges: dict[str, list[tuple[int, int]]] = {}
    start, current = 0, unicodedata.category(chr(0))
    for cp in range(1, MAX_CP + 2):
        cat_ = unicodedata.category(chr(cp)) if cp <= MAX_CP else ""  # "": past the last
        if cat_ != current:
            ranges.setdefault(current, []).append((start, cp - 1))
            start, current = cp, cat_
    return {k: CharSet.from_ranges(v) for k, v in ranges.items()}


def unicode_category(name: str) -> CharSet:
    """The code points of a general category: two letters (``Lu``), one letter (``L``), or
    ``LC`` (cased letters)."""
    table = _categories()
    if name == "LC":
        return table.get("Lu", CharSet()) | table.get("Ll", CharSet()) | table.get("Lt", CharSet())
    out = CharSet()
    for key, members in table.items():
        if key == name or (len(name) == 1 and key[0] == name):
            out = out | members
    return out
