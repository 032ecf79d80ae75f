"""Integers divisible by a step, as exact regexes.

A bounded range of at most 2,000 multiples is listed; a step 2**a * 5**b is decided by the
last digits; other steps (c coprime to 10, c <= 30) over a range open on one side use a
c-state automaton (``automata``). Anything else raises ConstraintError.
Design: docs/design/json-schema.md.
"""

from __future__ import annotations

from collections.abc import Hashable

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.emit.digits import (
    Block,
    any_digit,
    digit_class,
    digit_set,
    natural_blocks,
    render_block,
)
from lmprog.fsm.regex import EPS, R, alt, cat, lit, rep

_ENUMERATE_LIMIT = 2000
_MAX_AUTOMATON = 30  # states of a divisibility automaton (the part of a divisor coprime to 10)


def multiples(lo: int | None, hi: int | None, step: int, divisor: object) -> R | None:
    """Integers lo..hi (None = unbounded) divisible by ``step`` (``divisor``: for messages)."""
    if lo is not None and hi is not None and (hi - lo) // step <= _ENUMERATE_LIMIT:
        return _listed(-(-lo // step) * step, hi, step)
    d, c = _split_step(step)
    k = _suffix_digits(d)
    assert k is not None, d  # d = 2**a * 5**b: its last k digits decide
    split = None
    if 10**k // d <= 200 and 1 < c <= _MAX_AUTOMATON and (lo is None or hi is None):
        split = _at_least(-hi if lo is None and hi is not None else lo, step, c, d, k)
    if 10**k // d > 200 or (c > 1 and split is None):
        raise ConstraintError(
            f"multipleOf {divisor} over a large integer range has no "
            "exact regex (supported: a bounded range of at most 2,000 multiples; "
            "divisors 2**a * 5**b; others whose part coprime to 10 is at most 30, over a range "
            "open on one side whose other bound has at most 2,000 multiples to the next power "
            "of ten)"
        )
    if split is not None:  # (c > 1)
        above, zero, below = split
        if lo is None and hi is not None:  # x <= hi was read as -x >= -hi
            above, below = below, above
        return alt(
            cat(lit("-"), below) if below is not None else None,
            lit("0") if zero else None,
            above,
        )
    endings = alt(*(lit(str(v).zfill(k)) for v in range(0, 10**k, step)))
    parts: list[R | None] = []
    if hi is None or hi >= 0:
        parts.append(_natural_multiples(max(lo or 0, 0), hi, step, k, endings))
    if lo is None or lo < 0:
        neg_lo = 1 if hi is None or hi >= 0 else -hi
        parts.append(
            cat(lit("-"), _natural_multiples(neg_lo, None if lo is None else -lo, step, k, endings))
        )
    return alt(*parts)


def _split_step(step: int) -> tuple[int, int]:
    """step = d * c with d = 2**a * 5**b and c coprime to 10."""
    c = step
    while c % 2 == 0:
        c //= 2
    while c % 5 == 0:
        c //= 5
    return step // c, c


def _at_least(
    lo: int | None, step: int, c: int, d: int, k: int
) -> tuple[R | None, bool, R | None] | None:
    """The multiples x >= lo (None: all) as (positives, zero?, negatives' magnitudes); None
    when the listed part would hold more than _ENUMERATE_LIMIT multiples."""
    if lo is None or lo <= 0:
        count = 0 if lo is None else -lo // step
        if count > _ENUMERATE_LIMIT:
            return None
        positives = _coprime_multiples(c, d, k)
        return positives, True, positives if lo is None else _listed(step, -lo, step)
    digits = len(str(lo))
    first = -(-lo // step) * step
    if (10**digits - 1 - first) // step > _ENUMERATE_LIMIT:
        return None
    listed = _listed(first, 10**digits - 1, step)
    return alt(listed, _coprime_multiples(c, d, k, min_digits=digits + 1)), False, None


def _listed(first: int, last: int, step: int) -> R | None:
    """first, first + step, ... up to last, written out."""
    return alt(*(lit(str(v)) for v in range(first, last + 1, step)))


def _coprime_multiples(c: int, d: int, k: int, min_digits: int = 1) -> R | None:
    """Positive integers of at least ``min_digits`` digits divisible by c * d (c coprime to 10,
    d | 10**k): a number with more than k digits is a prefix P followed by a k-digit ending e
    (e divisible by d), and P's residue mod c is fixed by e; the prefixes of each residue
    come from an automaton over digits (c states, times the digits counted up to the
    prefix's least length)."""
    from lmprog.fsm.regex.automata import to_regex

    m, shift = c * d, pow(10, k, c)
    small = [lit(str(v)) for v in range(m, 10**k if k else 1, m) if len(str(v)) >= min_digits]
    least = max(1, min_digits - k)  # digits of a prefix
    inverse = pow(shift, -1, c)
    by_residue: dict[int, list[R]] = {}
    for e in range(0, 10**k, d):
        by_residue.setdefault((-e * inverse) % c, []).append(lit(str(e).zfill(k)) if k else EPS)
    edges: dict[tuple[Hashable, Hashable], list[int]] = {}
    states = ["init"] + [(r, i) for r in range(c) for i in range(1, least + 1)]
    for state in states:
        for digit in range(1 if state == "init" else 0, 10):
            if isinstance(state, str):  # "init"
                target = (digit % c, 1)
            else:
                target = ((10 * state[0] + digit) % c, min(state[1] + 1, least))
            edges.setdefault((state, target), []).append(digit)
    labelled = {pair: digit_set(ds) for pair, ds in edges.items()}
    try:
        prefixes = {r: to_regex(labelled, "init", [(r, least)]) for r in by_residue}
    except OverflowError:
        raise ConstraintError(f"multipleOf {m}: the divisibility regex is too large") from None
    return alt(*small, *(cat(prefixes[r], alt(*ends)) for r, ends in by_residue.items()))


def _suffix_digits(step: int) -> int | None:
    """k such that divisibility by ``step`` is decided by the last k digits, if any."""
    n, twos, fives = step, 0, 0
    while n % 2 == 0:
        n, twos = n // 2, twos + 1
    while n % 5 == 0:
        n, fives = n // 5, fives + 1
    return max(twos, fives) if n == 1 else None


def _natural_multiples(lo: int, hi: int | None, step: int, k: int, endings: R | None) -> R | None:
    parts = []
    for blk in natural_blocks(lo, hi):
        if isinstance(blk, Block) and blk.j >= k:
            parts.append(cat(render_block(blk._replace(j=blk.j - k)), endings))
        elif isinstance(blk, Block):
            parts += [lit(str(v)) for v in _stepped(_block_values(blk), step)]
        else:  # every number with more than d digits
            d = blk[1]
            for width in range(d + 1, k + 1):
                parts += [lit(str(v)) for v in _stepped(range(10 ** (width - 1), 10**width), step)]
            free = max(d + 1, k + 1) - 1 - k  # digits between the leading one and the ending
            parts.append(cat(digit_class(1, 9), rep(any_digit(), free, None), endings))
    return alt(*parts)


def _block_values(blk: Block) -> range:
    base = int("".join(map(str, blk.prefix)) or "0")
    start = (base * 10 + blk.x) * 10**blk.j
    stop = (base * 10 + blk.y + 1) * 10**blk.j
    return range(start, stop)


def _stepped(values: range, step: int) -> range:
    """The multiples of ``step`` in ``values`` (stepped through, never scanned: a block under
    a step of 10**300 spans 10**300 values, and holds at most 10**k // step of them)."""
    return range(-(-values.start // step) * step, values.stop, step)
