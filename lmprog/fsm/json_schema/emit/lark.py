"""A schema's JSON text as a grammar over JSON tokens, written in llguidance's Lark syntax.

Each JSON token is one lexeme (``tok``), since llguidance's lexer is greedy and at JSON token
boundaries going on is always right; structure is built with ``seq``/``choice``/``rep`` into
a DAG of fragments, named rules (``Ref``) hold what recurses, and ``to_lark`` writes it.
``None`` stands for the empty language, as in ``lmprog.fsm.regex``.
Design: docs/design/json-schema.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar, overload

from lmprog.core.errors import ConstraintError
from lmprog.fsm.deadline import tick
from lmprog.fsm.fixpoint import finite_nodes
from lmprog.fsm.regex import R


class Frag:
    """A fragment of the grammar: a lexeme, a sequence, a union, a repetition or a rule."""

    __slots__ = ()


class Tok(Frag):
    """One lexeme: a Lark terminal expression (``/regex/``, or ``/a/ & ~(/b/)``)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class Seq(Frag):
    __slots__ = ("parts",)

    def __init__(self, parts: tuple[Frag, ...]) -> None:
        self.parts = parts


class Group(Seq):
    """A sequence written as a rule of its own (a container: rules keep the nesting of the
    Lark text, and of the code writing it, to one container at a time)."""

    __slots__ = ()


class Choice(Frag):
    __slots__ = ("options",)

    def __init__(self, options: tuple[Frag, ...]) -> None:
        self.options = options


class Rep(Frag):
    __slots__ = ("item", "lo", "hi")

    def __init__(self, item: Frag, lo: int, hi: int | None) -> None:
        self.item, self.lo, self.hi = item, lo, hi


class Unique(Frag):
    """lo..hi distinct ``items`` in any order, separated by ``sep`` (lo >= 1, at most 64
    items): a parametric rule of llguidance, one bit per item used."""

    __slots__ = ("items", "lo", "hi", "sep")

    def __init__(self, items: tuple[Frag, ...], lo: int, hi: int, sep: Frag) -> None:
        self.items, self.lo, self.hi, self.sep = items, lo, hi, sep


class Loop(Frag):
    """An object's members in any order (llguidance's parametric rules): each of ``keyed`` at
    most once (bit i of the parameter: member i written), each of ``free`` any number of times,
    the first without ``sep`` and each later one after it; the sequence may end once bits
    0..``required``-1 are set and lo <= set bits; an optional keyed member (i >= required) is
    added while the optional ones set stay under hi - required, which leaves room for every
    required one (hi None: no bound). At most 64 keyed members; at least one is written."""

    __slots__ = ("keyed", "free", "sep", "required", "lo", "hi")

    def __init__(
        self,
        keyed: tuple[Frag, ...],
        free: Frag | None,
        sep: Frag,
        required: int,
        lo: int,
        hi: int | None,
    ) -> None:
        self.keyed, self.free, self.sep = keyed, free, sep
        self.required, self.lo, self.hi = required, lo, hi


class Ref(Frag):
    """The named rule ``name`` (its body is in the rules given to ``to_lark``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


EPS = Seq(())

# ---- the budget of one compile ------------------------------------------------------------
# Fragments are counted as they are made, so that a schema whose grammar would grow without
# bound (e.g. exponentially, through nesting) is refused where it grows.
_BUDGET: ContextVar[list[int] | None] = ContextVar("lmprog_grammar_budget", default=None)


@contextmanager
def fragment_limit(max_chars: int) -> Iterator[None]:
    """Within the block, making more than ``max_chars // 8`` fragments (each is a few
    characters of grammar at least) raises ConstraintError naming ``max_pattern_chars``."""
    token = _BUDGET.set([max_chars // 8, max_chars])
    try:
        yield
    finally:
        _BUDGET.reset(token)


_F = TypeVar("_F", bound="Frag")


def _made(frag: _F) -> _F:
    tick()
    budget = _BUDGET.get()
    if budget is not None:
        budget[0] -= 1
        if budget[0] < 0:
            raise ConstraintError(
                f"the schema's grammar grows past max_pattern_chars={budget[1]:,} characters "
                "(its nesting or alternatives multiply it); simplify the schema or raise "
                "max_pattern_chars"
            )
    return frag


# ---- combinators --------------------------------------------------------------------------


def regex_terminal(r: R) -> str:
    """``r`` as a Lark regex literal (``/`` escaped; the emitted syntax is Rust's as well)."""
    return "/" + r.text.replace("/", "\\/") + "/"


@overload
def tok(r: R | str) -> Tok: ...
@overload
def tok(r: R | str | None) -> Tok | None: ...
def tok(r: R | str | None) -> Tok | None:
    """A lexeme from a regex fragment, or from a Lark terminal expression (str)."""
    if r is None:
        return None
    if isinstance(r, R):
        if not r.text:
            raise ValueError("a lexeme must not match only the empty string")
        r = regex_terminal(r)
    return _made(Tok(r))


@overload
def seq(*parts: Frag) -> Frag: ...
@overload
def seq(*parts: Frag | None) -> Frag | None: ...
def seq(*parts: Frag | None) -> Frag | None:
    """Concatenation; the empty language if any part is."""
    if any(p is None for p in parts):
        return None
    # nested sequences are kept (not flattened): a shared tail stays one fragment
    flat = [p for p in parts if p is not None and p is not EPS]
    if len(flat) == 1:
        return flat[0]
    return _made(Seq(tuple(flat))) if flat else EPS


def group(f: Frag | None) -> Frag | None:
    """``f`` as a rule of its own in the Lark text (same language)."""
    if not isinstance(f, Seq) or isinstance(f, Group) or not f.parts:
        return f
    return _made(Group(f.parts))


@overload
def choice(first: Frag, /, *options: Frag | None) -> Frag: ...
@overload
def choice(*options: Frag | None) -> Frag | None: ...
def choice(*options: Frag | None) -> Frag | None:
    """Union; ``None`` options are dropped (an empty union is the empty language)."""
    seen: dict[int, Frag] = {}
    has_eps = False
    for o in options:
        if o is None:
            continue
        if o is EPS or (isinstance(o, Seq) and not o.parts):
            has_eps = True
            continue
        seen.setdefault(id(o), o)
    rest = list(seen.values())
    if not rest:
        return EPS if has_eps else None
    body = rest[0] if len(rest) == 1 else _made(Choice(tuple(rest)))
    return rep(body, 0, 1) if has_eps else body


@overload
def rep(f: Frag, lo: int, hi: int | None) -> Frag: ...
@overload
def rep(f: Frag | None, lo: int, hi: int | None) -> Frag | None: ...
def rep(f: Frag | None, lo: int, hi: int | None) -> Frag | None:
    """``f`` repeated lo..hi times (hi None = unbounded)."""
    assert lo >= 0 and (hi is None or hi >= lo), (lo, hi)
    if hi == 0 or f is EPS:
        return EPS
    if f is None:
        return EPS if lo == 0 else None
    if lo == hi == 1:
        return f
    return _made(Rep(f, lo, hi))


def unique(items: list[Frag | None], lo: int, hi: int, sep: Frag | None) -> Frag | None:
    """lo..hi of the distinct `items`, each at most once, in any order (1 <= lo)."""
    present = [x for x in items if x is not None]
    hi = min(hi, len(present))
    if sep is None or lo > hi:
        return None
    if len(present) > 64:
        raise ValueError("a unique list holds at most 64 distinct items")
    return _made(Unique(tuple(present), max(lo, 1), hi, sep))


def loop(
    keyed: list[Frag | None],
    free: Frag | None,
    sep: Frag | None,
    required: int,
    lo: int,
    hi: int | None,
) -> Frag | None:
    """Members in any order (``Loop``): ``keyed`` (Frags, bit i each; the first ``required``
    of them must all be written), ``free`` (any number of times); lo..hi keyed members."""
    if sep is None or any(x is None for x in keyed[:required]):
        return None
    if len(keyed) > 64:
        raise ValueError("a loop keys at most 64 members (bits of its parameter)")
    if not keyed and free is None:
        return None
    assert free is None or (lo <= 1 and hi is None), "counts need every member keyed"
    members = tuple(x for x in keyed if x is not None)
    assert len(members) == len(keyed), "a member that cannot be written is left out before"
    return _made(Loop(members, free, sep, required, lo, hi))


def opt(f: Frag | None) -> Frag:
    return EPS if f is None else rep(f, 0, 1)


def derives_text(root: Frag, rules: dict[str, Frag]) -> bool:
    """Whether ``root`` derives some finite text: False where every derivation goes through
    a rule that never ends (``{"$ref": "#"}`` is the rule ``ref0: ref0``), which llguidance
    would take and then allow no token. Linear: each fragment counts the parts it still
    needs, and is done once none are left (a union needs one; ``Unique`` and ``Loop`` are
    taken as done once any part is, erring toward done: the index's build then decides)."""

    def need(f: Frag, parts: tuple[Frag, ...]) -> int:
        if not parts or (isinstance(f, Rep) and f.lo == 0):
            return 0
        return len(parts) if type(f) in (Seq, Group) else 1

    return id(root) in finite_nodes([root], lambda f: _parts(f, rules), need)


def _parts(f: Frag, rules: dict[str, Frag]) -> tuple[Frag, ...]:
    if isinstance(f, Seq):
        return f.parts
    if isinstance(f, Choice):
        return f.options
    if isinstance(f, Rep):
        return (f.item,)
    if isinstance(f, Ref):
        return (rules[f.name],) if f.name in rules else ()
    if isinstance(f, Unique):
        return (*f.items, f.sep)
    if isinstance(f, Loop):
        return (*f.keyed, f.sep) + (() if f.free is None else (f.free,))
    return ()  # a lexeme


# ---- writing Lark -------------------------------------------------------------------------


def to_lark(root: Frag, rules: dict[str, Frag] | None = None) -> str:
    """The Lark text of ``root`` (the ``start`` rule) and the named ``rules`` (Ref targets).
    Fragments reached more than once become rules of their own, so the text grows with the
    DAG, not with its unfolding."""
    rules = dict(rules or {})
    return _Writer(root, rules).text()


class _Writer:
    def __init__(self, root: Frag, rules: dict[str, Frag]) -> None:
        self.root, self.rules = root, rules
        self.names: dict[int, str] = {}  # shared fragment -> its rule name
        self.terminals: dict[str, str] = {}  # terminal expression -> its name
        self._named = 0
        self.extra: list[str] = []  # parametric rules, written as they are met
        self._count_uses()

    def _count_uses(self) -> None:
        uses: dict[int, int] = {}
        stack = [self.root, *self.rules.values()]
        while stack:
            f = stack.pop()
            if isinstance(f, (Tok, Ref)):
                continue
            if isinstance(f, Unique):
                stack.extend((*f.items, f.sep))
                continue
            if isinstance(f, Loop):
                stack.extend(x for x in (*f.keyed, f.free, f.sep) if x is not None)
                continue
            uses[id(f)] = uses.get(id(f), 0) + 1
            if uses[id(f)] == 1:
                stack.extend(
                    f.parts
                    if isinstance(f, Seq)
                    else f.options
                    if isinstance(f, Choice)
                    else (f.item,)
                    if isinstance(f, Rep)
                    else ()  # (no other fragment holds parts)
                )
            if (uses[id(f)] == 2 or isinstance(f, Group)) and f is not self.root:
                self.names[id(f)] = ""  # named when first written

    def text(self) -> str:
        out: list[str] = []
        pending: list[tuple[str, Frag]] = [("start", self.root), *self.rules.items()]
        while pending:
            name, frag = pending.pop()
            out.append(f"{name}: {self._expr(frag, 0, pending, top=True)}")
        out += self.extra
        out += [f"{n}: {t}" for t, n in self.terminals.items()]
        return "\n".join(out) + "\n"

    def _name_of(self, f: Frag, pending: list[tuple[str, Frag]]) -> str | None:
        name = self.names.get(id(f))
        if name == "":
            name = self.names[id(f)] = f"s{self._named}"
            self._named += 1
            pending.append((name, f))
        return name

    # precedence: 0 = a rule's body (alternatives ok), 1 = inside a sequence, 2 = quantified.
    # Expressions nested deeper than _MAX_NESTING become rules of their own (bounded recursion
    # here and in the Lark parser).
    def _expr(
        self, f: Frag, prec: int, pending: list[tuple[str, Frag]], top: bool = False, depth: int = 0
    ) -> str:
        if isinstance(f, Tok):
            name = self.terminals.get(f.text)
            if name is None:
                name = self.terminals[f.text] = f"T{len(self.terminals)}"
            return name
        if isinstance(f, Ref):
            return f.name
        if isinstance(f, Unique):
            return self._unique(f, pending)
        if isinstance(f, Loop):
            return self._loop(f, pending)
        if not top:
            if depth > _MAX_NESTING and id(f) not in self.names:
                self.names[id(f)] = ""
            shared = self._name_of(f, pending)
            if shared is not None:
                return shared
        depth += 1
        if isinstance(f, Seq):
            if not f.parts:
                raise ValueError("an empty sequence has no Lark text of its own")
            text = " ".join(self._expr(p, 1, pending, depth=depth) for p in f.parts)
            return f"({text})" if prec >= 2 else text
        if isinstance(f, Choice):
            text = " | ".join(self._expr(o, 0, pending, depth=depth) for o in f.options)
            return f"({text})" if prec >= 1 else text
        assert isinstance(f, Rep)
        q = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((f.lo, f.hi))
        if q is None:
            q = f"{{{f.lo}}}" if f.lo == f.hi else f"{{{f.lo},{'' if f.hi is None else f.hi}}}"
        text = self._expr(f.item, 2, pending, depth=depth) + q
        return f"({text})" if prec >= 2 else text

    def _unique(self, f: Unique, pending: list[tuple[str, Frag]]) -> str:
        """Two parametric rules: the first item, then the others (each after the separator),
        the parameter's bits marking the items used."""
        name = f"u{self._named}"
        self._named += 1
        items = [f"({self._expr(x, 0, pending)})" for x in f.items]
        sep = self._expr(f.sep, 1, pending)
        first = [f"{x} {name}m::set_bit({i}) %if bit_clear({i})" for i, x in enumerate(items)]
        more = [f'"" %if bit_count_ge(_, {f.lo})'] + [
            f"{sep} {x} {name}m::set_bit({i}) %if and(bit_clear({i}), bit_count_lt(_, {f.hi}))"
            for i, x in enumerate(items)
        ]
        self.extra.append(f"{name}::_ : " + " | ".join(first))
        self.extra.append(f"{name}m::_ : " + " | ".join(more))
        return f"{name}::0x0"

    def _loop(self, f: Loop, pending: list[tuple[str, Frag]]) -> str:
        """A rule for the first member (the parameter it passes on: that member's bit) and a
        parametric one for the rest, which may end where the conditions hold::

            uN: K0 uNm::0x1 | K1 uNm::0x2 | F uNm::0x0
            uNm::_: "" %if <required set, count ok> | S K0 uNm::set_bit(0) %if bit_clear(0) | S F uNm::_
        """
        name = f"u{self._named}"
        self._named += 1
        keyed = [f"({self._expr(x, 0, pending)})" for x in f.keyed]
        free = None if f.free is None else f"({self._expr(f.free, 0, pending)})"
        sep = self._expr(f.sep, 1, pending)
        room = None if f.hi is None else f.hi - f.required  # optional members that fit
        first = [
            f"{x} {name}m::{1 << i:#x}"
            for i, x in enumerate(keyed)
            if i < f.required or room is None or room > 0
        ]
        first += [] if free is None else [f"{free} {name}m::0x0"]
        ends = [f"is_ones([0:{f.required}])"] if f.required else []
        ends += [f"bit_count_ge(_, {f.lo})"] if f.lo > 1 else []
        end = '""' + (f" %if {_and(ends)}" if ends else "")
        more = [end]
        for i, x in enumerate(keyed):
            adds = [f"bit_clear({i})"]
            if room is not None and i >= f.required:  # room left for the required ones
                adds.append(f"bit_count_lt([{f.required}:64], {room})")
            more.append(f"{sep} {x} {name}m::set_bit({i}) %if {_and(adds)}")
        more += [] if free is None else [f"{sep} {free} {name}m::_"]
        self.extra.append(f"{name}: " + " | ".join(first))
        self.extra.append(f"{name}m::_ : " + " | ".join(more))
        return name


def _and(conditions: list[str]) -> str:
    """One condition holding where all of them do (``and`` takes two)."""
    out = conditions[-1]
    for c in reversed(conditions[:-1]):
        out = f"and({c}, {out})"
    return out


_MAX_NESTING = 40
