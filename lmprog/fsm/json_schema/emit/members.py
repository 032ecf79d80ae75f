"""An object's members where what is written must be counted. That is
``minProperties``/``maxProperties`` beside optional properties, ``some`` facets (a key of
the object must be in a set) and ``not`` over closed objects.

The grammar is the automaton over (slot, members written, distinct keys, facets met), written
out as shared fragments. How each member counts: docs/design/json-schema.md.
"""

from __future__ import annotations

from collections.abc import Hashable

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.emit.lark import EPS, Frag, choice, rep, seq
from lmprog.fsm.json_schema.emit.sequences import Slot
from lmprog.fsm.json_schema.emit.strings import string_lexeme
from lmprog.fsm.json_schema.emit.writer import Writer
from lmprog.fsm.json_schema.terms.algebra import conj, key_allowed, meet
from lmprog.fsm.json_schema.terms.complement import neg
from lmprog.fsm.json_schema.terms.nodes import Node, ObjT, StrT, make_node

MAX_STATES = 4096  # states of one object's automaton
MAX_FACETS_LEFT = 4  # 'not's over objects the additional members meet together (2**n states)


class Members:
    def __init__(
        self, named: list[tuple[str, Slot]], regions: list[tuple[StrT, Node]], t: ObjT, em: Writer
    ) -> None:
        """named: [(key, Slot)] in order; regions: [(key StrT, value Node)]."""
        self.named, self.regions, self.em, self.t = named, regions, em, t
        # facets: key sets (``some``), then (keys, value) pairs (``some_values``), which no
        # named key meets (objects._named_hits)
        self.lo, self.hi, self.facets = t.min_props, t.max_props, t.some + t.some_values
        self.masks = [
            sum(1 << f for f, keys in enumerate(t.some) if key_allowed(keys, k)) for k, _ in named
        ]
        self.all = (1 << len(self.facets)) - 1
        states = (len(named) + 1) * (self.lo + 1) * ((self.hi or 0) + 1) * 2 << len(self.facets)
        if states > MAX_STATES:
            raise ConstraintError(
                f"minProperties/maxProperties ({self.lo}, {self.hi}) and {len(self.facets)} "
                f"'not' over objects need more than {MAX_STATES} states over {len(named)} "
                "properties"
            )
        self.any = choice(*(self._member(k, v) for k, v in regions))
        self.memo: dict[tuple[Hashable, ...], Frag | None] = {}

    def body(self) -> Frag | None:
        """The non-empty member sequences."""
        return self.rest(0, 0, 0, 0, True)

    def rest(self, i: int, written: int, distinct: int, met: int, first: bool) -> Frag | None:
        key = (i, written, distinct, met, first)
        if key not in self.memo:
            self.memo[key] = self._rest(i, written, distinct, met, first)
        return self.memo[key]

    def _rest(self, i: int, written: int, distinct: int, met: int, first: bool) -> Frag | None:
        room = None if self.hi is None else self.hi - written
        if i == len(self.named):
            return self._additional(room, max(0, self.lo - distinct), self.all & ~met, first)
        slot = self.named[i][1]
        skip = None if slot.lo else self.rest(i + 1, written, distinct, met, first)
        if room == 0:
            return skip
        member = slot.item if first else seq(self.em.sep, slot.item)
        after = self.rest(
            i + 1,
            written + (self.hi is not None),
            min(distinct + 1, self.lo),
            met | self.masks[i],
            False,
        )
        return choice(skip, seq(member, after))

    def _additional(self, room: int | None, need: int, unmet: int, first: bool) -> Frag | None:
        """Additional members: at least `need`, at most `room`, meeting the facets in `unmet`
        (at most one); `first`: nothing written before them. Two or more needed: their keys
        distinct, checked as decoded."""
        if (need > 1 and unmet) or (self.any is None and (need or unmet)):
            return None
        if need > 1:
            self.em.check(self.t)
        if not unmet:
            least = max(need, 1 if first else 0)
            if self.any is None or (room is not None and room < least):
                return None if least else EPS
            return self._run(self.any, first, least, room)
        if unmet & (unmet - 1):
            if room is not None or unmet.bit_count() > MAX_FACETS_LEFT:
                raise ConstraintError(
                    "two 'not's over objects left for the additional properties to meet are "
                    f"supported without maxProperties and up to {MAX_FACETS_LEFT} of them"
                )
            return self._meeting(unmet, first)
        facet = self.facets[unmet.bit_length() - 1]
        if isinstance(facet, tuple):  # a member with its key in a set and its value in one
            keys, value = facet
            cut = self._split(make_node((keys,)), inside=True)
            hit = choice(*(self._member(k, v, value) for k, v in cut))
            plain = self.any
        else:
            hit = choice(*(self._member(k, v) for k, v in self._split(facet, inside=True)))
            plain = choice(*(self._member(k, v) for k, v in self._split(facet, inside=False)))
        if hit is None or (room is not None and room < 1):
            return None
        before_most = None if room is None else room - 1
        options = []
        for before in [0, None] if before_most is None else range(before_most + 1):
            if before is None:  # one or more plain members, then the hit
                lead = self._run(plain, first, 1, None) if plain is not None else None
            elif before == 0:
                lead = EPS
            else:
                lead = self._run(plain, first, before, before) if plain is not None else None
            if lead is None:
                continue
            after = None if room is None else room - 1 - (before or 0)
            hit_first = first and before == 0
            options.append(
                seq(
                    lead,
                    hit if hit_first else seq(self.em.sep, hit),
                    self._run(self.any, False, 0, after),
                )
            )
        return choice(*options)

    def _meeting(self, unmet: int, first: bool) -> Frag | None:
        """Additional members, any number, meeting every facet in `unmet` (two or more, no
        maxProperties): the state is the facets left; a member meets any subset of them at
        once (its key in each key set, its value in each value set), and members meeting none
        may come anywhere. A DAG: each hit leaves fewer facets."""
        key = ("meeting", unmet, first)
        if key not in self.memo:
            if not unmet:
                self.memo[key] = self._run(self.any, False, 0, None)
            else:
                options = []
                sub = unmet
                while sub:  # every non-empty subset of the facets left
                    hit, rest = self._hit(sub), self._meeting(unmet & ~sub, False)
                    if hit is not None and rest is not None:
                        options.append(seq(hit if first else seq(self.em.sep, hit), rest))
                        if self.any is not None:
                            lead = self._run(self.any, first, 1, None)
                            options.append(seq(lead, self.em.sep, hit, rest))
                    sub = (sub - 1) & unmet
                self.memo[key] = choice(*options)
        return self.memo[key]

    def _hit(self, facets: int) -> Frag | None:
        """A member meeting every facet whose bit is in `facets`."""
        parts: list[tuple[StrT, Node, Node | None]] = [(k, v, None) for k, v in self.regions]
        for f in range(len(self.facets)):
            if not facets >> f & 1:
                continue
            facet = self.facets[f]
            keys, value = facet if isinstance(facet, tuple) else (facet, None)
            keys = keys if isinstance(keys, Node) else make_node((keys,))
            sets = [StrT()] if keys.top else [t for t in keys.terms if isinstance(t, StrT)]
            parts = [
                (
                    m,
                    v,
                    narrow if value is None else value if narrow is None else conj(narrow, value),
                )
                for k, v, narrow in parts
                for x in sets
                if (m := meet(k, x)) is not None
            ]
        return choice(*(self._member(k, v, narrow) for k, v, narrow in parts))

    def _run(self, item: Frag | None, first: bool, least: int, most: int | None) -> Frag | None:
        """least..most members of `item`, each after a separator unless it is the first."""
        if first:
            if least == 0:
                raise AssertionError("a first run writes something")
            more = None if most is None else most - 1
            return seq(item, rep(seq(self.em.sep, item), least - 1, more))
        return rep(seq(self.em.sep, item), least, most)

    def _split(self, keys: Node, inside: bool) -> list[tuple[StrT, Node]]:
        """The regions cut to their keys in `keys` (inside) or not in it."""
        sets = [keys] if inside else [neg(keys)]
        parts = [t for s in sets for t in ([StrT()] if s.top else s.terms) if isinstance(t, StrT)]
        out = []
        for k, v in self.regions:
            for p in parts:
                m = meet(k, p)
                if m is not None:
                    out.append((m, v))
        return out

    def _member(self, key: StrT, value: Node, narrowed: Node | None = None) -> Frag | None:
        """A member; its value narrowed by `narrowed`, if given (Emitter.derived)."""
        frag = self.em.node(value) if narrowed is None else self.em.derived(value, narrowed)
        return self.em.member(string_lexeme(key), frag)
