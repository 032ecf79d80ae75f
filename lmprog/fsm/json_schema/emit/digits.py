"""Regexes for ranges of digit strings (decimal integers, fixed-width hex for ``\\uXXXX``).

A range [a, b] of same-length digit strings splits into *blocks* ``prefix [x-y] D{j}``: a fixed
prefix, one digit in x..y, then j free digits. ``[123, 456]`` becomes
``12[3-9] | 1[3-9]D | [2-3]DD | 4[0-4]D | 45[0-6]``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from lmprog.fsm.regex import R, alt, cat, lit, raw, rep


class Block(NamedTuple):
    prefix: tuple[int, ...]  # digit values
    x: int
    y: int
    j: int  # free digits after the x..y digit


def digit_class(x: int, y: int, base: int = 10) -> R:
    """One digit with value in x..y (hex digits match either case)."""
    if base == 10:
        return lit(str(x)) if x == y else raw(f"[{x}-{y}]" if y > x + 1 else f"[{x}{y}]", True)
    if x == y and x <= 9:
        return lit(str(x))
    parts = []
    if x <= 9:
        top = min(y, 9)
        parts.append(f"{x}-{top}" if top > x else f"{x}")
    if y >= 10:
        lo, hi = max(x, 10) - 10, y - 10
        for start in "aA":
            a, b = chr(ord(start) + lo), chr(ord(start) + hi)
            parts.append(f"{a}-{b}" if b > a else a)
    return raw("[" + "".join(parts) + "]", True)


def any_digit(base: int = 10) -> R:
    return digit_class(0, base - 1, base)


def same_length_blocks(a: list[int], b: list[int], base: int = 10) -> list[Block]:
    """Blocks covering the same-length digit strings from ``a`` to ``b`` (a <= b)."""
    assert len(a) == len(b) and a <= b, (a, b)
    if len(a) == 1:
        return [Block((), a[0], b[0], 0)]
    if a[0] == b[0]:
        return [
            Block((a[0],) + blk.prefix, blk.x, blk.y, blk.j)
            for blk in same_length_blocks(a[1:], b[1:], base)
        ]
    n, top = len(a) - 1, base - 1
    lo_full, hi_full = all(d == 0 for d in a[1:]), all(d == top for d in b[1:])
    out = []
    if not lo_full:
        out += [
            Block((a[0],) + blk.prefix, blk.x, blk.y, blk.j)
            for blk in same_length_blocks(a[1:], [top] * n, base)
        ]
    start, end = a[0] + (not lo_full), b[0] - (not hi_full)
    if start <= end:
        out.append(Block((), start, end, n))
    if not hi_full:
        out += [
            Block((b[0],) + blk.prefix, blk.x, blk.y, blk.j)
            for blk in same_length_blocks([0] * n, b[1:], base)
        ]
    return out


def render_block(blk: Block, base: int = 10) -> R:
    prefix = "".join("0123456789abcdef"[d] for d in blk.prefix)
    head = lit(prefix) if base == 10 else cat(*(digit_class(d, d, base) for d in blk.prefix))
    return cat(head, digit_class(blk.x, blk.y, base), rep(any_digit(base), blk.j, blk.j))


def fixed_width_range(lo: int, hi: int, width: int, base: int = 16) -> R | None:
    """Digit strings of exactly ``width`` digits (leading zeros included) with value lo..hi."""
    if lo > hi:
        return None
    a, b = _digits(lo, base, width), _digits(hi, base, width)
    return alt(*(render_block(blk, base) for blk in same_length_blocks(a, b, base)))


def _digits(n: int, base: int, width: int) -> list[int]:
    out = []
    for _ in range(width):
        n, d = divmod(n, base)
        out.append(d)
    assert n == 0, "value wider than width"
    return out[::-1]


def natural_blocks(lo: int, hi: int | None) -> list[Block | tuple[str, int]]:
    """Blocks of decimal naturals lo..hi written without leading zeros. An unbounded tail
    "every number with more than d digits" is returned as the tuple ``("more", d)``."""
    assert 0 <= lo and (hi is None or lo <= hi), (lo, hi)
    top = hi if hi is not None else 10 ** len(str(lo)) - 1
    out: list[Block | tuple[str, int]] = []
    for width in range(len(str(lo)), len(str(top)) + 1):
        a = max(lo, 10 ** (width - 1) if width > 1 else 0)
        b = min(top, 10**width - 1)
        if a <= b:
            out += same_length_blocks(_digits(a, 10, width), _digits(b, 10, width))
    if hi is None:
        out.append(("more", len(str(top))))
    return out


def natural_range(lo: int, hi: int | None) -> R | None:
    """Decimal naturals lo..hi (hi None = unbounded), no leading zeros."""
    parts = []
    for blk in natural_blocks(lo, hi):
        if isinstance(blk, Block):
            parts.append(render_block(blk))
        else:
            parts.append(cat(digit_class(1, 9), rep(any_digit(), blk[1], None)))
    return alt(*parts)


@lru_cache(maxsize=1024)
def _digit_set_cached(ds: tuple[int, ...]) -> R:
    runs, start = [], ds[0]
    for a, b in zip(ds, ds[1:] + (-1,)):  # (-1: past the last digit, never a + 1)
        if b != a + 1:
            runs.append((start, a))
            start = b
    if len(runs) == 1:
        return digit_class(*runs[0])
    body = "".join(f"{x}-{y}" if y > x + 1 else f"{x}{y}" if y > x else f"{x}" for x, y in runs)
    return raw(f"[{body}]", True)


def digit_set(ds: list[int]) -> R:
    """One decimal digit from the sorted list ``ds``."""
    return _digit_set_cached(tuple(ds))
