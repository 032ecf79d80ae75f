"""Nodes to a grammar over JSON tokens (``lark``): one fragment per term, unions, whitespace,
and "any value".

"Any value" (``{}``, ``true``, a missing ``items``...) is a recursive rule (``any``): arrays and
objects nest without bound. With ``any_depth`` set, it is written instead with containers nested
at most ``any_depth`` levels (scalars at the innermost level); deeper values are then rejected,
never accepted wrongly.
"""

from __future__ import annotations

import json
from decimal import Decimal
from itertools import permutations, product
from typing import Any

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.emit.arrays import array_regex
from lmprog.fsm.json_schema.emit.lark import Frag, Ref, choice, group, loop, seq, tok
from lmprog.fsm.json_schema.emit.numbers import NUMBER, number_lexeme, value_regex
from lmprog.fsm.json_schema.emit.objects import object_regex
from lmprog.fsm.json_schema.emit.sequences import Slot, separated
from lmprog.fsm.json_schema.emit.strings import string_lexeme, string_text
from lmprog.fsm.json_schema.emit.unordered import KEYED
from lmprog.fsm.json_schema.terms.algebra import conj
from lmprog.fsm.json_schema.terms.lengths import LengthCount
from lmprog.fsm.json_schema.terms.matched import PatternMatch
from lmprog.fsm.json_schema.terms.nodes import (
    ArrT,
    Bodies,
    BoolT,
    Node,
    NullT,
    NumT,
    ObjT,
    RefT,
    StrT,
    Term,
    counts_additional_keys,
)
from lmprog.fsm.json_schema.terms.strict import generated as strict_terms
from lmprog.fsm.json_schema.terms.values import to_decimal
from lmprog.fsm.regex import R, alt, cat, lit, raw

_FINITE_LIMIT = 256


class Emitter:
    """Writes nodes as grammar fragments; one per compile (it memoizes by node). ``rules``:
    the named rules its fragments refer to (``any``, recursive references). ``strict``: objects
    and arrays written as strict generation has them (``strict.generated``). ``any_order``:
    objects' members in any order (``unordered``), else in canonical order (``objects``)."""

    def __init__(
        self,
        ws: R,
        any_depth: int | None,
        bodies: Bodies | None = None,
        strict: bool = False,
        any_order: bool = False,
    ):
        assert any_depth is None or any_depth >= 0
        self.ws, self.any_depth, self.any_order = ws, any_depth, any_order
        self.strict = strict
        self.sep = tok(cat(ws, lit(","), ws))
        self.colon = tok(cat(ws, lit(":"), ws))
        self._open = {c: tok(cat(lit(c), ws)) for c in "{["}
        self._close = {c: tok(cat(ws, lit(c))) for c in "}]"}
        self._close_empty = {c: tok(lit(c)) for c in "}]"}
        self.rules: dict[str, Frag] = {}
        self._memo: dict[Node, Frag | None] = {}
        self._any: dict[int | None, Frag | None] = {}  # (None: being written)
        self._bodies = bodies or {}  # RefT key -> its node
        # ArrT terms whose distinct (or repeated) items, ObjT terms whose distinct keys, the
        # guide checks as it decodes (lmprog.fsm.checks)
        self.checked: set[ArrT | ObjT] = set()
        # StrT terms of values whose maxLength the check counts, or whose patterns with
        # backreferences it matches (lengths.counted_apart; set by json_schema._grammar before
        # writing): their lexemes leave the maxLength out, or write the relaxed term
        self.counted: dict[StrT, LengthCount | PatternMatch] = {}
        self._ref_names: dict[tuple[Any, ...], str] = {}
        self._needs: dict[
            Node, bool
        ] = {}  # node -> whether its grammar leaves a condition to the check
        self._writing: list[bool] = []  # the same, for the nodes being written (innermost last)

    def node(self, node: Node) -> Frag | None:
        if node.top:
            return self.any_value(self.any_depth)
        if node not in self._memo:
            self._writing.append(False)
            try:
                self._memo[node] = choice(*(self.term(t) for t in node.terms))
            finally:
                self._needs[node] = self._writing.pop()
        if self._needs[node]:
            self._mark()
        return self._memo[node]

    def check(self, t: ArrT | ObjT) -> None:
        """The grammar of term ``t`` leaves its condition to the check (lmprog.fsm.checks)."""
        self.checked.add(t)
        self._mark()

    def _mark(self) -> None:
        if self._writing:
            self._writing[-1] = True

    def derived(self, node: Node, other: Node) -> Frag | None:
        """The grammar of ``conj(node, other)``, written where the check reads the text along
        ``node`` (an array's items, a key's value) while the grammar narrows it by ``other``
        (an item matching ``contains`` or one outside it, a member breaking ``not`` over
        additionalProperties). The check enforces what the terms it reads ask for; the
        narrowed terms ask for what either does. ConstraintError if the narrowed grammar
        leaves a condition to the check and ``other`` asks for one, which would then go
        unchecked."""
        narrowed = conj(node, other)
        frag = self.node(narrowed)
        if not narrowed.top and self._needs[narrowed] and self._asks(other):
            raise ConstraintError(
                "uniqueItems, or 'not' over it or over additionalProperties/patternProperties, "
                "inside 'contains' or inside a value that 'not' over additionalProperties/"
                "patternProperties asks for has no exact grammar (the check made as the text "
                "is decoded cannot tell which items or members it applies to)"
            )
        return frag

    def _asks(self, node: Node) -> bool:
        """Whether a term in ``node``, or in a node under it, asks for a condition the check
        may be left with (uniqueItems, its complement, distinct keys)."""
        todo, seen = [node], set()
        while todo:
            n = todo.pop()
            if n in seen or n.top:
                continue
            seen.add(n)
            for t in n.terms:
                if isinstance(t, RefT):
                    todo.append(self._bodies[t.key])
                elif isinstance(t, ArrT):
                    if t.unique or t.repeats:
                        return True
                    todo += [*t.prefix, t.rest, *(c.node for c in t.contains)]
                elif isinstance(t, ObjT):
                    if t.some_values or counts_additional_keys(t) or t.one_of:
                        return True
                    todo += [v for _, v in t.props]
                    todo += [
                        v for r in t.rules for v in (r.additional, *(p for _, p in r.patterns))
                    ]
        return False

    def term(self, t: Term) -> Frag | None:
        if isinstance(t, NullT):
            return tok(lit("null"))
        if isinstance(t, BoolT):
            return tok(
                alt(*(lit("true" if v else "false") for v in sorted(t.values, reverse=True)))
            )
        if isinstance(t, NumT):
            return tok(number_lexeme(t))
        if isinstance(t, StrT):
            check = self.counted.get(t)
            if isinstance(check, PatternMatch):
                return string_lexeme(check.relaxed)
            return string_lexeme(t, check is not None)
        if isinstance(t, RefT):
            return self.reference(t)
        if isinstance(t, ArrT):
            closed_arr = strict_terms(t) if self.strict else t
            frag = array_regex(closed_arr, self)
            if frag is None and closed_arr is not t:  # closing left no value: it stays open
                frag = array_regex(t, self)
            return frag
        assert isinstance(t, ObjT), t
        closed_obj = strict_terms(t) if self.strict else t
        frag = object_regex(closed_obj, self)
        if frag is None and closed_obj is not t:  # closing left no value: the term stays open
            frag = object_regex(t, self)
        return frag

    def reference(self, t: RefT) -> Frag:
        """The rule of a recursive reference (written once; inside it, itself)."""
        name = self._ref_names.get(t.key)
        if name is None:
            name = self._ref_names[t.key] = f"ref{len(self._ref_names)}"
            body = self.node(self._bodies[t.key])
            if body is None:
                raise ConstraintError("a recursive schema accepts no JSON value")
            self.rules[name] = body
        elif self._needs.get(self._bodies[t.key], True):  # (unknown while it is written)
            self._mark()
        return Ref(name)

    def any_value(self, depth: int | None) -> Frag:
        """Every JSON value: the recursive rule ``any`` (depth None), or values whose
        containers nest at most ``depth`` levels."""
        if depth not in self._any:
            inner: Frag | None = Ref("any") if depth is None else None
            self._any[depth] = inner
            if depth is not None and depth > 0:
                inner = self.any_value(depth - 1)
            options: list[Frag | None] = [
                tok(lit("null")),
                tok(lit("true")),
                tok(lit("false")),
                tok(raw(NUMBER)),
            ]
            key = string_lexeme(StrT())
            options.append(key)
            if inner is not None:
                member = self.member(key, inner)
                for open_, item, close in (("[", inner, "]"), ("{", member, "}")):
                    body, _ = separated([Slot(item, 0, None)], self.sep)
                    options.append(self.container(open_, body, True, close))
            body = choice(*options)
            assert body is not None  # null, true, false and numbers at least
            if depth is None:
                self.rules["any"] = body
            else:
                self._any[depth] = body
        found = self._any[depth]
        assert found is not None
        return found

    def member(self, key: Frag | None, value: Frag | None) -> Frag | None:
        """``key ws : ws value`` (``key`` a string lexeme)."""
        return seq(key, self.colon, value)

    def container(self, open_: str, body: Frag | None, empty_ok: bool, close: str) -> Frag | None:
        """``open_ body close`` with whitespace inside the brackets (``body`` None: only the
        empty container, if ``empty_ok``). The whitespace after ``open_`` belongs to its
        lexeme; the one before ``close`` to the closing lexeme after a body."""
        empty = self._close_empty[close] if empty_ok else None
        return group(seq(self._open[open_], choice(empty, seq(body, self._close[close]))))

    def value(self, v: Any) -> Frag | None:
        """The text of one JSON value (objects in every key order when they have few keys, or
        with ``any_order``)."""
        if v is None or isinstance(v, bool):
            return tok(lit(json.dumps(v)))
        if isinstance(v, (int, float, Decimal)):
            return tok(value_regex(to_decimal(v)))
        if isinstance(v, str):
            return tok(string_text(v))
        if isinstance(v, list):
            body, empty = separated([Slot(self.value(x), 1, 1) for x in v], self.sep)
            return self.container("[", body, empty, "]")
        items = [self.member(tok(string_text(k)), self.value(x)) for k, x in v.items()]
        if self.any_order and 4 < len(items) <= KEYED:
            return self.container("{", loop(items, None, self.sep, len(items), 0, None), False, "}")
        orders = permutations(items) if len(items) <= 4 else [items]
        body = choice(*(separated([Slot(m, 1, 1) for m in order], self.sep)[0] for order in orders))
        return self.container("{", body, not items, "}")

    def finite_values_of_term(self, t: Term) -> list[Any] | None:
        """Every value of a term, when there are at most a few hundred; else None."""
        if isinstance(t, NullT):
            return [None]
        if isinstance(t, (BoolT, NumT, StrT)):
            return None if t.values is None else sorted(t.values, key=repr)
        if isinstance(t, ArrT) and self.strict:
            t = strict_terms(t)
        if isinstance(t, ArrT) and t.rest.never and not (t.contains or t.unique or t.repeats):
            finite = [self.finite_values(n) for n in t.prefix]
            choices = [c for c in finite if c is not None]
            if len(choices) < len(finite):
                return None
            out: list[Any] = []
            for length in range(t.min_items, len(t.prefix) + 1):
                out += [list(combo) for combo in product(*choices[:length])]
                if len(out) > _FINITE_LIMIT:
                    return None
            return out
        return None

    def finite_values(self, node: Node) -> list[Any] | None:
        if node.top:
            return None
        out: list[Any] = []
        for t in node.terms:
            vals = self.finite_values_of_term(t)
            if vals is None or len(out) + len(vals) > _FINITE_LIMIT:
                return None
            out += vals
        return out
