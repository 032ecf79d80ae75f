"""Case-insensitive character sets as Python's ``re`` matches them under ``(?i)``.

JSON Schema patterns written for Python validators use inline flags (``(?i)^[a-z]+$``); two
characters match each other iff ``re`` would fold them together (simple lowercase mapping plus
``re._casefix``), and a set matches every character of a class it meets.
Design: docs/design/constraints.md.
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
