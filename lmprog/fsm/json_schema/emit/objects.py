"""Objects: named properties in canonical order, then the keys the schema does not name (in
any order instead where the emitter writes ``any_order``: ``unordered``).

Named properties come in declaration order, each optional one may be left out; other keys
follow in *regions*, one per set of ``patternProperties`` patterns a key can match together,
each region's key one lexeme (``strings.string_expr``). Design: docs/design/json-schema.md.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from itertools import combinations, permutations
from types import NotImplementedType

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.emit.lark import Frag, choice, tok
from lmprog.fsm.json_schema.emit.members import Members
from lmprog.fsm.json_schema.emit.sequences import Slot, separated
from lmprog.fsm.json_schema.emit.strings import string_lexeme, string_text
from lmprog.fsm.json_schema.emit.unordered import unordered
from lmprog.fsm.json_schema.emit.writer import Writer
from lmprog.fsm.json_schema.terms.algebra import conj, conj_all, meet, normalize_obj
from lmprog.fsm.json_schema.terms.nodes import KeyRule, Node, ObjT, StrT
from lmprog.fsm.json_schema.terms.values import str_ok
from lmprog.fsm.regex import Chars, CharSet, Concat, Repeat, node_lengths, parse_regex
from lmprog.fsm.regex import Node as RegexNode
from lmprog.fsm.regex.dfa import search_automaton
from lmprog.fsm.regex.lookahead import split_lookaheads

MAX_KEY_CLASSES = 64  # regions of one object (sets of patterns a key can match together)
# optional properties of one object: where n keys may come next, the parser's row holds about
# 2n items, and llguidance stops past index.MAX_ITEMS_IN_ROW (10,000)
MAX_OPTIONAL_PROPERTIES = 4000
_ANY_KEY = StrT()


def object_regex(t: ObjT, em: Writer) -> Frag | None:
    if t.one_of:  # in exactly one of some objects: counted as decoded, the grammar t alone
        em.check(t)
    if t.some_values:  # a member's value breaks a rule: its keys distinct, checked as decoded
        em.check(t)
        return choice(*(_members(u, em) for u in _named_hits(t, em)))
    return _members(t, em)


def _named_hits(t: ObjT, em: Writer) -> list[ObjT]:
    """``t`` as a union of terms whose ``some_values`` no named key can meet: for each named
    key in a facet's key set, the term where that key is present and meets it (the facet
    then gone), and the term where another key must (the named ones taken out of the set)."""
    if not t.some_values:
        return [t]
    (keys, value), others = t.some_values[0], t.some_values[1:]
    inside = [k for k, _ in t.props if str_ok(keys, k)]
    out: list[ObjT] = []
    for k in inside:
        own = t.prop(k)
        assert own is not None  # k is a key of props
        em.derived(own, value)  # (the check reads the key's own value)
        props = tuple((n, conj(v, value) if n == k else v) for n, v in t.props)
        required = t.required + (() if k in t.required else (k,))
        met = normalize_obj(replace(t, props=props, required=required, some_values=others))
        if met is not None:
            out += _named_hits(met, em)
    rest = replace(keys, excluded=keys.excluded | frozenset(inside))
    for u in _named_hits(replace(t, some_values=others), em):
        out.append(replace(u, some_values=((rest, value),) + u.some_values))
    return out


def _members(t: ObjT, em: Writer) -> Frag | None:
    named, n_required = [], 0
    for key, node in t.props:
        value = em.node(node)
        required = key in t.required
        if value is None:
            if required:
                return None
            continue
        named.append((key, Slot(em.member(tok(string_text(key)), value), int(required), 1)))
        n_required += required
    if len(named) - n_required > MAX_OPTIONAL_PROPERTIES:
        raise ConstraintError(
            f"an object with {len(named) - n_required:,} optional properties is not supported "
            f"(at most {MAX_OPTIONAL_PROPERTIES:,}; required ones are not counted)"
        )
    regions = _regions(t)
    slots = [slot for _, slot in named]
    item = choice(*(em.member(string_lexeme(k), em.node(v)) for k, v in regions))
    if em.any_order:
        written = unordered(named, item, t, em)
        if not isinstance(written, NotImplementedType):
            return written
    if t.any_order and not regions and len(named) <= 4 and all(s.lo for s in slots):
        body = choice(*(separated(list(p), em.sep)[0] for p in permutations(slots)))
        return em.container("{", body, not named, "}")
    most = None if item is not None else len(named)
    if (
        not (t.some or t.some_values)
        and t.min_props <= n_required
        and (t.max_props is None or (most is not None and most <= t.max_props))
    ):  # the counts hold whatever is written
        slots += [Slot(item, 0, None)] if item is not None else []
        return em.container("{", *separated(slots, em.sep), "}")
    body = Members(named, regions, t, em).body()
    empty_ok = t.min_props == 0 and n_required == 0 and not (t.some or t.some_values)
    return em.container("{", body, empty_ok, "}")


def _regions(t: ObjT) -> list[tuple[StrT, Node]]:
    """The key classes of the additional members: [(key StrT, value Node)]."""
    named = frozenset(k for k, _ in t.props)
    sources = tuple(dict.fromkeys(src for r in t.rules for src, _ in r.patterns))
    names = [StrT()] if t.names.top else [x for x in t.names.terms if isinstance(x, StrT)]
    out = []
    for inside in _pattern_sets(sources):
        value = conj_all(_rule_value(r, inside) for r in t.rules)
        if value.never:
            continue
        outside = tuple(
            s
            for s in sources
            if s not in inside and (not inside or any(_overlap(s, i) for i in inside))
        )
        keys = StrT(patterns=tuple(sorted(inside)), not_patterns=outside, excluded=named)
        for n in names:
            k = keys if n == _ANY_KEY and not inside else meet(n, keys)
            if k is not None:
                out.append((k, value))
    return out


def _rule_value(rule: KeyRule, matched: frozenset[str]) -> Node:
    schemas = [node for src, node in rule.patterns if src in matched]
    return conj_all(schemas) if schemas else rule.additional


def _pattern_sets(sources: tuple[str, ...]) -> list[frozenset[str]]:
    """The sets of patterns a key may match together: the empty set, each pattern, and larger
    sets whose patterns pairwise overlap."""
    out: list[frozenset[str]] = [frozenset()]
    for size in range(1, len(sources) + 1):
        found = False
        for combo in combinations(sources, size):
            if size == 1 or all(_overlap(a, b) for a, b in combinations(combo, 2)):
                out.append(frozenset(combo))
                found = True
                if len(out) > MAX_KEY_CLASSES:
                    raise ConstraintError(
                        f"patternProperties whose patterns overlap in more than "
                        f"{MAX_KEY_CLASSES} ways are not supported"
                    )
        if not found:
            break
    return out


@lru_cache(maxsize=4096)
def _overlap(a: str, b: str) -> bool:
    """Whether some key may match both patterns: False when both are anchored at the start
    and their first characters differ (``^x-`` and ``^[0-9]``), or when their automata have no
    string in common (``^x-.*-a$`` and ``^x-.*-b$``; lookaheads only narrow, so their bases
    are compared); True when unsure (a region for keys matching both is then formed, and is
    empty if no key does)."""
    first_a, first_b = _first_chars(a), _first_chars(b)
    if first_a is not None and first_b is not None and (first_a & first_b).is_empty():
        return False
    return _automata_meet(split_lookaheads(a)[0][0], split_lookaheads(b)[0][0])


_OVERLAP_STATES = 200  # of each pattern's search automaton, for the exact overlap test


def _automata_meet(a: str, b: str) -> bool:
    """Whether some string is searched by both patterns (through the product of their
    automata); True where an automaton passes _OVERLAP_STATES states."""
    try:
        ma, blocks_a, acc_a = search_automaton(parse_regex(a, "ecma"), _OVERLAP_STATES)
        mb, blocks_b, acc_b = search_automaton(parse_regex(b, "ecma"), _OVERLAP_STATES)
    except (OverflowError, RecursionError, ConstraintError):
        return True
    pairs = [
        (i, j)
        for i, x in enumerate(blocks_a)
        for j, y in enumerate(blocks_b)
        if not (x & y).is_empty()
    ]
    seen, todo = {(0, 0)}, [(0, 0)]
    while todo:
        p, q = todo.pop()
        if acc_a[p] and acc_b[q]:
            return True
        for i, j in pairs:
            nxt = (ma[p][i], mb[q][j])
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def _first_chars(source: str) -> CharSet | None:
    """The characters a match of an anchored pattern can start with (None: not anchored on
    every branch, or a branch may match the empty string)."""
    out = CharSet()
    base = split_lookaheads(source)[0][0]  # lookaheads only narrow: the base's first characters
    for branch in parse_regex(base, "ecma").branches:
        first = _first(branch.node) if branch.start else None
        if first is None:
            return None
        out = out | first
    return out


def _first(node: RegexNode) -> CharSet | None:
    """First characters of a non-empty match of `node`; None if it may match the empty string."""
    if isinstance(node, Chars):
        return node.chars
    if isinstance(node, Repeat):
        return _first(node.node) if node.lo > 0 else None
    if isinstance(node, Concat):
        out = CharSet()
        for part in node.parts:
            first = _first(part)
            if first is not None:
                return out | first
            if node_lengths(part)[0] > 0:
                return None
            inner = _first_any(part)
            if inner is None:
                return None
            out = out | inner
        return None
    options = [_first(o) for o in node.options]
    known = [o for o in options if o is not None]
    return None if not options or len(known) < len(options) else _union(known)


def _first_any(node: RegexNode) -> CharSet | None:
    """First characters of any match of a node that may match the empty string."""
    if isinstance(node, Repeat):
        return _first(node.node) if _first(node.node) is not None else _first_any(node.node)
    return None


def _union(sets: list[CharSet]) -> CharSet:
    out = CharSet()
    for s in sets:
        out = out | s
    return out
