"""Case-insensitive character sets as Python's ``re`` matches them under ``(?i)``.

JSON Schema patterns are ECMA-262 regexes, which have no inline flags; schemas written for
Python validators use them anyway (``(?i)^[a-z]+$``), and the validators people run (jsonschema,
fastjsonschema) hand them to ``re``. Under IGNORECASE, ``re`` (Unicode str patterns) lowers a
character with its simple lowercase mapping and compares it with the pattern's characters
lowered the same way, plus a few characters that lowering leaves apart (``re._casefix``: ``s``
and ``ſ``, ``k`` and the Kelvin sign's lowercase, the Greek iota forms, ...). So two characters
match each other iff they fall in one class of that equivalence, and a set matches every
character of a class it meets; a negated class ``[^...]`` is the complement of its members'
closure.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from functools import cache, lru_cache

from lmprog.fsm.regex.charset import MAX_CP, CharSet


@cache
def _classes() -> tuple[list[int], list[int], list[tuple[int, ...]]]:
    """(the code points that share a class with another, sorted; each one's class id; the
    classes' members)."""
    import _sre  # type: ignore[import-not-found]  # CPython's internals: no stubs
    from re._casefix import _EXTRA_CASES  # type: ignore[import-not-found]  # (as _sre)

    key: dict[int, int] = {}  # code point -> a representative of its class
    members: dict[int, set[int]] = {}
    for cp in range(MAX_CP + 1):
        low = _sre.unicode_tolower(cp)
        if low != cp:
            members.setdefault(low, {low}).add(cp)
    for low, others in _EXTRA_CASES.items():
        for other in (low, *others):
            members.setdefault(other, {other})
        merged = set().union(*(members[o] for o in (low, *others)))
        for o in (low, *others):
            members[o] = merged
    groups = {id(m): tuple(sorted(m)) for m in members.values()}
    ids = {g: i for i, g in enumerate(groups.values())}
    for m in members.values():
        for cp in m:
            key[cp] = ids[groups[id(m)]]
    points = sorted(key)
    return points, [key[p] for p in points], list(ids)


@lru_cache(maxsize=4096)
def fold(chars: CharSet) -> CharSet:
    """The characters ``re`` matches case-insensitively against a set of ``chars``."""
    points, group_of, groups = _classes()
    hit: set[int] = set()
    for lo, hi in chars.ranges:
        hit.update(group_of[bisect_left(points, lo) : bisect_right(points, hi)])
    if not hit:
        return chars
    extra = [(cp, cp) for g in hit for cp in groups[g]]
    return CharSet.from_ranges(chars.ranges + tuple(extra))
