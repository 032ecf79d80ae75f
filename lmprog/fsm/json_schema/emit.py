"""Nodes to regex: one fragment per term, joined by ``|``; whitespace and "any value".

"Any value" (``{}``, ``true``, a missing ``items``...) is not a regular language because arrays and
objects nest without bound; it is written with containers nested at most ``any_depth`` levels
(scalars at the innermost level). Deeper values are rejected, never accepted wrongly.
"""

from __future__ import annotations

import json
from decimal import Decimal
from itertools import permutations, product

from lmprog.fsm.json_schema.arrays import array_regex
from lmprog.fsm.json_schema.numbers import NUMBER, number_regex, value_regex
from lmprog.fsm.json_schema.objects import object_regex
from lmprog.fsm.json_schema.sequences import Slot, separated
from lmprog.fsm.json_schema.strings import UNIT_TOKEN, json_text, string_regex
from lmprog.fsm.json_schema.terms import ArrT, BoolT, Node, NullT, NumT, ObjT, StrT
from lmprog.fsm.json_schema.values import to_decimal
from lmprog.fsm.regex import EPS, R, alt, cat, lit, raw, rep

_FINITE_LIMIT = 256


class Emitter:
    """Writes nodes as regexes; one per compile (it memoizes by node)."""

    def __init__(self, ws: R, any_depth: int):
        assert any_depth >= 0
        self.ws, self.any_depth = ws, any_depth
        self.sep = cat(ws, lit(","), ws)
        self._memo: dict = {}
        self._any: dict[int, R] = {}

    def node(self, node: Node) -> R | None:
        if node.top:
            return self.any_value(self.any_depth)
        if node not in self._memo:
            self._memo[node] = alt(*(self.term(t) for t in node.terms))
        return self._memo[node]

    def term(self, t) -> R | None:
        if isinstance(t, NullT):
            return lit("null")
        if isinstance(t, BoolT):
            return alt(*(lit("true" if v else "false") for v in sorted(t.values, reverse=True)))
        if isinstance(t, NumT):
            return number_regex(t)
        if isinstance(t, StrT):
            return string_regex(t)
        if isinstance(t, ArrT):
            return array_regex(t, self)
        assert isinstance(t, ObjT), t
        return object_regex(t, self)

    def any_value(self, depth: int) -> R:
        if depth not in self._any:
            options = [lit("null"), lit("true"), lit("false"), raw(NUMBER), string_regex(StrT())]
            if depth > 0:
                inner = self.any_value(depth - 1)
                member = cat(
                    lit('"'), rep(UNIT_TOKEN, 0, None), lit('"'), self.ws, lit(":"), self.ws, inner
                )
                for open_, item, close in (("[", inner, "]"), ("{", member, "}")):
                    body, _ = separated([Slot(item, 0, None)], self.sep)
                    options.append(self.container(open_, body, True, close))
            self._any[depth] = alt(*options)  # type: ignore[assignment]
        return self._any[depth]

    def container(self, open_: str, body: R | None, empty_ok: bool, close: str) -> R | None:
        """``open_ body close`` with whitespace inside the brackets (``body`` None: only the
        empty container, if ``empty_ok``)."""
        return cat(
            lit(open_), self.ws, alt(EPS if empty_ok else None, cat(body, self.ws)), lit(close)
        )

    def value(self, v) -> R | None:
        """The text of one JSON value (objects in every key order when they have few keys)."""
        if v is None or isinstance(v, bool):
            return lit(json.dumps(v))
        if isinstance(v, (int, float, Decimal)):
            return value_regex(to_decimal(v))
        if isinstance(v, str):
            return lit(json_text(v))
        if isinstance(v, list):
            body, empty = separated([Slot(self.value(x), 1, 1) for x in v], self.sep)
            return self.container("[", body, empty, "]")
        items = [
            cat(lit(json_text(k)), self.ws, lit(":"), self.ws, self.value(x)) for k, x in v.items()
        ]
        orders = permutations(items) if len(items) <= 4 else [items]
        body = alt(*(separated([Slot(m, 1, 1) for m in order], self.sep)[0] for order in orders))
        return self.container("{", body, not items, "}")

    def finite_values_of_term(self, t) -> list | None:
        """Every value of a term, when there are at most a few hundred; else None."""
        if isinstance(t, NullT):
            return [None]
        if isinstance(t, (BoolT, NumT, StrT)):
            return None if t.values is None else sorted(t.values, key=repr)
        if isinstance(t, ArrT) and t.rest.never and not t.contains and not t.unique:
            choices = [self.finite_values(n) for n in t.prefix]
            if any(c is None for c in choices):
                return None
            out = []
            for length in range(t.min_items, len(t.prefix) + 1):
                out += [list(combo) for combo in product(*choices[:length])]
                if len(out) > _FINITE_LIMIT:
                    return None
            return out
        return None

    def finite_values(self, node: Node) -> list | None:
        if node.top:
            return None
        out = []
        for t in node.terms:
            vals = self.finite_values_of_term(t)
            if vals is None or len(out) + len(vals) > _FINITE_LIMIT:
                return None
            out += vals
        return out


def value_key(v):
    """A hashable key under JSON Schema equality (1 == 1.0, true != 1, key order ignored)."""
    if v is None or isinstance(v, bool):
        return ("c", v)
    if isinstance(v, (int, float, Decimal)):
        return ("n", to_decimal(v))
    if isinstance(v, str):
        return ("s", v)
    if isinstance(v, list):
        return ("a", tuple(value_key(x) for x in v))
    return ("o", frozenset((k, value_key(x)) for k, x in v.items()))
