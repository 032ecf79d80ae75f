"""Numbers: exact regexes for integer and decimal ranges, excluded values and ``multipleOf``.

A number with a bound, ``multipleOf`` or an excluded value is written without an exponent
(but for ``json.dumps``'s exponent form of decades inside the bounds), an integer without a
fraction; decimal ranges split at the integer part. Which ``multipleOf`` steps are exact
(others raise ConstraintError), and steps to avoid (``not`` over ``multipleOf``):
docs/design/json-schema.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction
from typing import NamedTuple

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.emit.digits import any_digit, digit_set, natural_range
from lmprog.fsm.json_schema.emit.multiples import multiples
from lmprog.fsm.json_schema.emit.strings import spellings_read
from lmprog.fsm.json_schema.terms.algebra import integer_bounds
from lmprog.fsm.json_schema.terms.nodes import NumT
from lmprog.fsm.regex import EPS, R, alt, cat, lit, opt, raw, rep

NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
INTEGER = r"-?(?:0|[1-9][0-9]*)"


def number_text(v: Decimal) -> str:
    """The plain decimal text of a value (no exponent, no trailing zeros)."""
    if v == v.to_integral_value():
        return str(int(v))
    return format(v.normalize(), "f")


def value_regex(v: Decimal) -> R:
    """One value (enum/const): its plain decimal text; an integral value may also carry a zero
    fraction (``2``, ``2.0``), as ``json.dumps`` writes integral floats."""
    text = lit(number_text(v))
    return cat(text, opt(raw(r"\.0+"))) if v == v.to_integral_value() else text


# A number that must avoid a step has at most this many digits: as a float (jsonschema's
# reading) it is then within 1.2e-16 of its decimal value, while a decimal of n < 16
# significant digits that is not a multiple is at least 1e-15 (relative) away from every
# multiple, so the float division jsonschema does cannot land on a whole quotient.
_AVOIDING_DIGITS = 15


def number_lexeme(t: NumT) -> R | str | None:
    """A number's lexeme: ``number_regex``, or where ``t`` avoids steps (``not`` over
    ``multipleOf``) a Lark terminal expression: the numbers without the steps, of at most
    15 digits and without exponent, minus every text of the steps' multiples
    (``/numbers/ & /short/ & ~/multiples/``, llguidance's ``&`` and ``~``); a bounded
    integer range of at most 2,000 values is listed instead."""
    if not t.not_multiples:
        return number_regex(t)
    from lmprog.fsm.json_schema.emit.lark import regex_terminal
    from lmprog.fsm.json_schema.terms.values import num_ok

    lo, hi = integer_bounds(t) if t.integer else (None, None)
    if lo is not None and hi is not None and hi - lo <= _ENUMERATE_LIMIT:
        listed = alt(*(lit(str(v)) for v in range(lo, hi + 1) if num_ok(t, Decimal(v))))
        return _zero_fraction(listed) if spellings_read() else listed
    base = number_regex(replace(t, not_multiples=frozenset()))
    if base is None:
        return None
    short = raw(rf"-?[0-9.]{{1,{_AVOIDING_DIGITS}}}")
    avoided = [_every_multiple(m, t) for m in sorted(t.not_multiples)]
    texts = [regex_terminal(base), regex_terminal(short)]
    texts += ["~" + regex_terminal(r) for r in avoided if r is not None]
    return "(" + " & ".join(texts) + ")"


def _every_multiple(m: Decimal, t: NumT) -> R | None:
    """Every text of ``-?I(.F)?`` whose value is a multiple of ``m`` (a superset outside the
    bounds of ``t`` does no harm: the texts are subtracted from ``t``'s), including ``-0``
    and trailing zeros of the fraction."""
    f = Fraction(m)
    try:
        if f.denominator == 1 or t.integer:  # an integer x is a multiple of p/q iff p | x
            step = f.numerator
            ints = natural_range(0, None) if step == 1 else multiples(0, None, step, m)
            return cat(opt(lit("-")), ints, opt(raw(r"\.0+")))
        plain = number_regex(NumT(lo=Decimal(0), multiple_of=m))
        return cat(opt(lit("-")), plain)
    except ConstraintError:
        bound = max((abs(b) for b in (t.lo, t.hi) if b is not None), default=None)
        if t.lo is not None and t.hi is not None and bound is not None:
            listed = _listed_multiples(NumT(lo=Decimal(0), hi=bound, multiple_of=m))
            if listed is not None:
                return cat(opt(lit("-")), listed)
        raise ConstraintError(
            f"'not' over multipleOf {m} has no exact regex here (supported: integer steps "
            "whose multipleOf is exact over an open range, decimal steps c / 10**k with c "
            "dividing 10**k, and any step beside both bounds with at most "
            f"{_LIST_LIMIT:,} multiples below the larger magnitude)"
        ) from None


def number_regex(t: NumT) -> R | None:
    if t.values is not None:
        return alt(*(value_regex(v) for v in sorted(t.values)))
    if t == NumT():
        return raw(NUMBER)
    if t == NumT(integer=True):
        if spellings_read():
            return alt(_zero_fraction(raw(INTEGER)), _exponents(NumT(), integral=True))
        return raw(INTEGER)
    try:
        plan = _multiple_plan(t)
    except ConstraintError:
        listed = _listed_multiples(t)
        if listed is None:
            raise
        return listed
    if plan is None:
        return None
    integer, int_step, frac = plan
    parts = []
    for lo, lo_excl, hi, hi_excl in _intervals(t):
        iv = NumT(integer=integer, lo=lo, lo_excl=lo_excl, hi=hi, hi_excl=hi_excl)
        if integer:
            parts.append(_integers(iv, int_step, t))
        else:
            parts.append(_decimals(iv, nonzero_fraction=integer is False, frac=frac))
            if integer is None and frac is None:
                parts.append(_exponents(iv))
        if not spellings_read():
            continue
        if integer:  # read: 2.0 for 2
            parts[-1] = _zero_fraction(parts[-1])
        if integer and int_step in (None, 1) or integer is None and frac is not None:
            parts.append(_exponents(iv, integral=True))  # read: 1e+20 (every integer fits)
    return alt(*parts)


def _zero_fraction(r: R | None) -> R | None:
    """Integers also with a zero fraction (``2.0``): JSON Schema (draft 6 on) counts it an
    integer, as jsonschema does; a reading grammar's (``strings.read_spellings``)."""
    return None if r is None else cat(r, opt(raw(r"\.0+")))


_MANTISSA = raw(r"[1-9](?:\.[0-9]+)?")


def _exponents(iv: NumT, integral: bool = False) -> R | None:
    """Numbers of the interval in exponent notation, as ``json.dumps`` writes very large and
    very small floats (``1e-05``, ``2.5e+16``): a mantissa in [1, 10) times ``10**E`` lies in
    [10**E, 10**(E+1)), so each sign takes the exponents whose whole decade is inside.
    `integral`: only integral values (``_integral_exponents``)."""
    lo, hi = iv.lo, iv.hi

    def inside(a: Fraction, b: Fraction, a_closed: bool) -> bool:  # is [a, b) or (a, b] in iv?
        lo_ok = lo is None or a > lo or (a == lo and a_closed and not iv.lo_excl)
        hi_ok = hi is None or b < hi or (b == hi and (not a_closed or not iv.hi_excl))
        return lo_ok and hi_ok

    hints = [-400, 400, -1, 0, 1]
    for bound in (lo, hi):
        if bound:
            e = Decimal(bound).adjusted()
            hints += [e - 2, e - 1, e, e + 1, e + 2]
    parts = []
    for sign in (1, -1):

        def decade(e: int, sign: int = sign) -> bool:
            a, b = Fraction(10) ** e, Fraction(10) ** (e + 1)
            return inside(a, b, True) if sign > 0 else inside(-b, -a, False)

        sign_text = lit("-") if sign < 0 else EPS
        if integral:
            found = _exponent_bounds(decade, hints)
            if found is not None:
                parts.append(cat(sign_text, _integral_exponents(*found)))
            continue
        exps = _exponent_range(decade, hints)
        if exps is not None:
            parts.append(cat(sign_text, _MANTISSA, exps))
    return alt(*parts)


_FLOAT_FRACTION = 16  # fraction digits of a mantissa as a float's shortest repr writes it
_FLOAT_EXPONENT = 307  # past it a mantissa may overflow a float (jsonschema reads inf)


def _integral_exponents(lo: int | None, hi: int | None) -> R | None:
    """Mantissas and exponents E in lo..hi (None: unbounded) of integral values: a mantissa
    with at most E fraction digits (``1.5e+20``, ``1e2``), up to 16 past E = 16 (as a float is
    written; a longer mantissa is not read), E at most 307 (a float's range)."""
    first = 0 if lo is None else max(lo, 0)
    last = _FLOAT_EXPONENT if hi is None else min(hi, _FLOAT_EXPONENT)
    if last < first:
        return None
    options: list[R | None] = []
    top = min(last, _FLOAT_FRACTION)
    for e in range(first, top + 1):
        fraction = raw(rf"(?:\.[0-9]{{1,{e}}})?") if e else EPS
        exponent = raw(r"[+-]?0+") if e == 0 else cat(raw(r"\+?0*"), lit(str(e)))
        options.append(cat(raw("[1-9]"), fraction, raw("[eE]"), exponent))
    if last > _FLOAT_FRACTION:
        tail = natural_range(max(first, _FLOAT_FRACTION + 1), last)
        options.append(cat(raw(rf"[1-9](?:\.[0-9]{{1,{_FLOAT_FRACTION}}})?[eE]\+?0*"), tail))
    return alt(*options)


def _exponent_bounds(
    ok: Callable[[int], bool], hints: list[int]
) -> tuple[int | None, int | None] | None:
    """The exponents E with ok(E), as (first, last), None past |E| = 400 (beyond floats'
    range): ok holds on an interval of integers (the decades inside a convex set), whose ends
    lie next to ``hints`` (the bounds' exponents); found by bisection from a point inside.
    None: no E."""
    inside = next((e for e in hints if ok(e)), None)
    if inside is None:
        return None
    a, b = -400, inside  # the first E inside
    while a < b:
        m = (a + b) // 2
        a, b = (a, m) if ok(m) else (m + 1, b)
    lo = None if a == -400 else a
    a, b = inside, 400  # the last E inside
    while a < b:
        m = (a + b + 1) // 2
        a, b = (m, b) if ok(m) else (a, m - 1)
    return lo, None if a == 400 else a


def _exponent_range(ok: Callable[[int], bool], hints: list[int]) -> R | None:
    """``[eE]`` and the exponents E with ok(E) (``_exponent_bounds``)."""
    found = _exponent_bounds(ok, hints)
    if found is None:
        return None
    lo, hi = found
    options = []
    if hi is None or hi >= 1:
        options.append(cat(raw(r"\+?0*"), natural_range(max(lo or 1, 1), hi)))
    if (lo is None or lo <= 0) and (hi is None or hi >= 0):
        options.append(raw(r"[+-]?0+"))
    if lo is None or lo <= -1:
        options.append(
            cat(
                raw("-0*"),
                natural_range(1 if hi is None else max(-hi, 1), None if lo is None else -lo),
            )
        )
    return cat(raw("[eE]"), alt(*options))


class FracRule(NamedTuple):
    """Multiples of ``step / 10**digits`` (step dividing 10**digits): no nonzero fraction digit
    past ``digits``, and the fraction padded to ``digits`` digits divisible by ``step``."""

    digits: int
    step: int = 1


def _multiple_plan(t: NumT) -> tuple[bool | None, int | None, FracRule | None] | None:
    """(integer mode, integer step, fraction rule) implied by multipleOf; None = empty."""
    m = t.multiple_of
    if m is None:
        return t.integer, None, None
    f = Fraction(m)
    if f.denominator == 1 or t.integer:
        if t.integer is False and f.denominator == 1:
            return None
        k = _decimal_places(f)
        if k is None:
            raise ConstraintError(f"multipleOf {m} is not a decimal number")
        c = f.numerator * 10**k // f.denominator  # m = c / 10**k
        return True, c // math.gcd(c, 10**k), None
    k = _decimal_places(f)
    c = None if k is None else 10**k * f.numerator // f.denominator  # m = c / 10**k
    if k is not None and c and 10**k % c == 0:
        return t.integer, None, FracRule(k, c)
    raise ConstraintError(
        f"multipleOf {m} over non-integer numbers has no exact regex (supported: integers; "
        "steps c / 10**k with c dividing 10**k, such as 0.01, 0.5, 0.25; other decimal steps "
        f"over a bounded range of at most {_LIST_LIMIT:,} multiples)"
    )


_ENUMERATE_LIMIT = 2000  # integers not a multiple of a step, listed over a bounded range
_LIST_LIMIT = 2000  # multiples of a decimal step listed one by one over a bounded range
MAX_FRACTION_DIGITS = 64  # of a bound or a multipleOf step (llguidance's regexes nest at most
# 250 groups deep: the fraction's regex nests about 3 a digit)


def _listed_multiples(t: NumT) -> R | None:
    """The multiples of a decimal step inside bounded intervals, listed (None when an interval
    is unbounded, the step is not a finite decimal, or they are too many)."""
    assert t.multiple_of is not None  # (called for a step)
    f = Fraction(t.multiple_of)
    if _decimal_places(f) is None:
        return None
    values: list[Decimal] = []
    for lo, lo_excl, hi, hi_excl in _intervals(t):
        if lo is None or hi is None:
            return None
        first, last = math.ceil(Fraction(lo) / f), math.floor(Fraction(hi) / f)
        if last - first + 1 > _LIST_LIMIT - len(values):
            return None
        for n in range(first, last + 1):
            v = n * f
            if (v == lo and lo_excl) or (v == hi and hi_excl):  # (excluded values cut intervals)
                continue
            if (t.integer is True and v.denominator != 1) or (
                t.integer is False and v.denominator == 1
            ):
                continue
            values.append(Decimal(v.numerator) / Decimal(v.denominator))
    # as an unconstrained decimal is written: trailing zeros after the last fraction digit too
    return alt(*(cat(value_regex(v), raw("0*") if v % 1 else EPS) for v in values))


# An interval of numbers: (lo, lo excluded?, hi, hi excluded?), a bound None where there is none.
Interval = tuple[Decimal | None, bool, Decimal | None, bool]


def _decimal_places(f: Fraction) -> int | None:
    """k with denominator dividing 10**k, or None when the denominator has other factors."""
    d, twos, fives = f.denominator, 0, 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    return max(twos, fives) if d == 1 else None


def _intervals(t: NumT) -> list[Interval]:
    """The bounds of ``t`` cut at each excluded value: [(lo, lo_excl, hi, hi_excl)]."""
    out: list[Interval] = []
    lo, lo_excl = t.lo, t.lo_excl
    for v in sorted(t.excluded):
        out.append((lo, lo_excl, v, True))
        lo, lo_excl = v, True
    out.append((lo, lo_excl, t.hi, t.hi_excl))
    return [
        iv
        for iv in out
        if iv[0] is None
        or iv[2] is None
        or iv[0] < iv[2]
        or (iv[0] == iv[2] and not iv[1] and not iv[3])
    ]


# ----------------------------------------------------------------------------- integers


def _integers(iv: NumT, step: int | None, whole: NumT) -> R | None:
    lo, hi = integer_bounds(iv)
    if lo is not None and hi is not None and lo > hi:
        return None
    if step is not None and step > 1:
        return multiples(lo, hi, step, whole.multiple_of)
    parts = []
    if hi is None or hi >= 0:
        parts.append(natural_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        neg_lo = 1 if hi is None or hi >= 0 else -hi
        parts.append(cat(lit("-"), natural_range(neg_lo, None if lo is None else -lo)))
    return alt(*parts)


# ----------------------------------------------------------------------------- decimals


def _decimals(iv: NumT, nonzero_fraction: bool, frac: FracRule | None) -> R | None:
    """Numbers in the interval written as ``-?I(.F)?``; ``nonzero_fraction``: non-integers."""
    lo, hi = iv.lo, iv.hi
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not iv.hi_excl):
        a, a_excl = (Decimal(0), False) if lo is None or lo < 0 else (lo, iv.lo_excl)
        parts.append(_magnitudes(a, a_excl, hi, iv.hi_excl, nonzero_fraction, frac))
    if lo is None or lo < 0:
        a, a_excl = (-hi, iv.hi_excl) if hi is not None and hi < 0 else (Decimal(0), True)
        b, b_excl = (None, False) if lo is None else (-lo, iv.lo_excl)
        parts.append(cat(lit("-"), _magnitudes(a, a_excl, b, b_excl, nonzero_fraction, frac)))
    return alt(*parts)


def _split(d: Decimal) -> tuple[int, str]:
    """Integer part and fraction digits (no trailing zeros) of a non-negative decimal."""
    whole = int(d)
    frac = format((d - whole).normalize(), "f")
    return whole, "" if frac in ("0", "0.0") or "." not in frac else frac.split(".")[1].rstrip("0")


def _magnitudes(
    a: Decimal,
    a_excl: bool,
    b: Decimal | None,
    b_excl: bool,
    nonzero: bool,
    rule: FracRule | None,
) -> R | None:
    """Non-negative decimals in the interval (a ≥ 0), as ``I(.F)?``."""
    ia, fa = _split(a)
    frac = lambda lo, lo_x, hi, hi_x: _fraction(lo, lo_x, hi, hi_x, nonzero, rule)
    if b is not None:
        ib, fb = _split(b)
        if ia == ib:
            return cat(lit(str(ia)), frac(fa, a_excl, fb, b_excl))
    parts = [cat(lit(str(ia)), frac(fa, a_excl, None, False))]
    mid_hi = None if b is None else ib - 1
    if mid_hi is None or ia + 1 <= mid_hi:
        parts.append(cat(natural_range(ia + 1, mid_hi), frac(None, False, None, False)))
    if b is not None:
        parts.append(cat(lit(str(ib)), frac(None, False, fb, b_excl)))
    return alt(*parts)


def _fraction(
    lo: str | None,
    lo_excl: bool,
    hi: str | None,
    hi_excl: bool,
    nonzero: bool,
    rule: FracRule | None,
) -> R | None:
    """The text after the integer part, ``''`` or ``.DIGITS``, for fractions 0.F with
    lo <(=) 0.F <(=) hi (digit strings; None = no bound) that ``rule`` allows."""
    auto = _Fraction(lo, lo_excl, hi, hi_excl, nonzero, rule)
    start = (lo is not None, hi is not None, False, 0)
    dotted = cat(lit("."), auto.nonempty(0, start))
    return alt(EPS if auto.accepts(0, start) else None, dotted)


# (tight to lo, tight to hi, seen a nonzero digit, the digits so far mod the rule's step)
_FracState = tuple[bool, bool, bool, int]


class _Fraction:
    """Digit-by-digit automaton over fraction digits; state = (tight to lo, tight to hi, seen a
    nonzero digit, the digits so far mod the rule's step). Past the last bound digit the
    states loop, and are written in closed form."""

    def __init__(
        self,
        lo: str | None,
        lo_excl: bool,
        hi: str | None,
        hi_excl: bool,
        nonzero: bool,
        rule: FracRule | None,
    ) -> None:
        self.lo, self.hi = lo or "", hi or ""
        self.lo_excl, self.hi_excl, self.nonzero = lo_excl, hi_excl, nonzero
        self.max_digits = None if rule is None else rule.digits
        self.mod = 1 if rule is None else rule.step
        self.depth = max(len(self.lo), len(self.hi), self.max_digits or 0)
        if self.depth > MAX_FRACTION_DIGITS:  # a group nested per digit in its regex
            raise ConstraintError(
                f"a number's minimum, maximum or multipleOf needs {self.depth:,} digits after "
                f"the decimal point; at most {MAX_FRACTION_DIGITS} are supported"
            )
        self.memo: dict[tuple[int, _FracState], R | None] = {}

    def accepts(self, i: int, state: _FracState) -> bool:
        tl, th, nz, r = state
        if self.nonzero and not nz:
            return False
        # padded: not a multiple (r is nonzero only under a rule, which sets max_digits)
        if r and self.max_digits is not None and r * 10 ** max(self.max_digits - i, 0) % self.mod:
            return False
        if tl and (i < len(self.lo) or self.lo_excl):
            return False
        return not (th and i >= len(self.hi) and self.hi_excl)

    def step(self, i: int, state: _FracState, d: int) -> _FracState | None:
        tl, th, nz, r = state
        lo_d = int(self.lo[i]) if tl and i < len(self.lo) else 0
        hi_d = int(self.hi[i]) if th and i < len(self.hi) else 0
        if (tl and d < lo_d) or (th and d > hi_d):
            return None
        if self.max_digits is not None and i >= self.max_digits and d:
            return None
        return (tl and d == lo_d, th and d == hi_d, nz or d != 0, (10 * r + d) % self.mod)

    def nonempty(self, i: int, state: _FracState) -> R | None:
        groups: dict[str, tuple[list[int], R]] = {}
        for d in range(10):
            nxt = self.step(i, state, d)
            if nxt is None:
                continue
            cont = self.rest(i + 1, nxt)
            if cont is None:
                continue
            groups.setdefault(cont.text, ([], cont))[0].append(d)
        return alt(*(cat(digit_set(ds), cont) for ds, cont in groups.values()))

    def rest(self, i: int, state: _FracState) -> R | None:
        key = (i, state)
        if key not in self.memo:
            self.memo[key] = (
                self._tail(i, state)
                if i >= self.depth
                else alt(EPS if self.accepts(i, state) else None, self.nonempty(i, state))
            )
        return self.memo[key]

    def _tail(self, i: int, state: _FracState) -> R | None:
        ok = self.accepts(i, state)
        if state[1] or self.max_digits is not None:  # only zeros may follow
            return rep(lit("0"), 0, None) if ok else None
        return rep(any_digit(), 0, None) if ok else raw("0*[1-9][0-9]*")
