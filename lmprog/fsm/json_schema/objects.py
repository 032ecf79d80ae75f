"""Objects: named properties in canonical order, then the keys the schema does not name.

Canonical order: the properties a term names are written in declaration order (``properties``
first, then ``required`` keys that ``properties`` does not list), each optional one may be left
out; keys not named follow, in any number, in *regions*:

* with ``patternProperties`` (up to 4 patterns, no ``propertyNames``): one region per set of
  patterns, holding the keys that match exactly those patterns (built as automata with
  interegular, written back as regexes), with exactly the schemas that apply to such keys;
* otherwise a catch-all region: any key (allowed by ``propertyNames``, other than the named
  ones) whose value satisfies ``additionalProperties`` *and* every pattern's schema, which is
  right whatever the key matches; plus one region per pattern with its schema and those of the
  patterns that may overlap it (narrower than the schema, never wider).

A named key is excluded from the regions by a trie over all its spellings where possible; where it
is not (a pattern or format on the keys), the region's value must also satisfy that key's schema,
so that writing it there is still valid. A key written twice (JSON allows it; the last one wins)
never makes an instance invalid here, except against ``minProperties``, hence the limit on it.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import permutations
from typing import TYPE_CHECKING

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.algebra import conj, conj_all
from lmprog.fsm.json_schema.automata import to_regex
from lmprog.fsm.json_schema.sequences import Slot, separated
from lmprog.fsm.json_schema.strings import can_exclude, canonical_token, json_text, string_regex
from lmprog.fsm.json_schema.terms import Node, ObjT, StrT
from lmprog.fsm.json_schema.values import pattern_matcher, str_ok
from lmprog.fsm.regex import ANY_CHAR, CharSet, R, alt, cat, lit

if TYPE_CHECKING:
    from lmprog.fsm.json_schema.emit import Emitter


def object_regex(t: ObjT, em: Emitter) -> R | None:
    named, n_required = [], 0
    for key, node in t.props:
        value = em.node(node)
        required = key in t.required
        if value is None:
            if required:
                return None
            continue
        named.append(Slot(_member(lit(json_text(key)), value, em), int(required), 1))
        n_required += required
    regions = _regions(t, em)
    if t.any_order and not regions and len(named) <= 4 and all(s.lo for s in named):
        body = alt(*(separated(list(p), em.sep)[0] for p in permutations(named)))
        return em.container("{", body, not named, "}")
    slots = named + _region_slots(regions, t, n_required, len(named) - n_required)
    return em.container("{", *separated(slots, em.sep), "}")


def _member(key: R | None, value: R | None, em: Emitter) -> R | None:
    return cat(key, em.ws, lit(":"), em.ws, value)


def _region_slots(regions: list, t: ObjT, n_required: int, n_optional: int) -> list[Slot]:
    """The slot of the unnamed keys, with its count from min/maxProperties."""
    item = alt(*regions)
    most = None if item is not None else n_required + n_optional
    free = t.min_props <= n_required and (
        t.max_props is None or (most is not None and most <= t.max_props)
    )
    if free:
        return [Slot(item, 0, None)] if item is not None else []
    if n_optional:
        raise ConstraintError(
            "minProperties/maxProperties together with optional properties has no exact regex"
        )
    lo = max(0, t.min_props - n_required)
    if lo >= 2:
        raise ConstraintError(
            "minProperties that needs two or more additional properties has no "
            "exact regex (a repeated key would count twice)"
        )
    hi = None if t.max_props is None else t.max_props - n_required
    return [Slot(item, lo, hi)]


def _regions(t: ObjT, em: Emitter) -> list:
    named = {k: v for k, v in t.props}
    sources = tuple(dict.fromkeys(src for r in t.rules for src, _ in r.patterns))
    partition = _key_partition(sources, frozenset(named)) if sources and t.names.top else None
    if partition is not None:  # exact: each class of keys takes what every rule says of it
        out = []
        for matched, key in partition:
            value = conj_all(_rule_value(r, matched) for r in t.rules)
            out.append(None if value.never else _member(key, em.node(value), em))
        return [r for r in out if r is not None]
    return _narrow_regions(t, named, em)


def _rule_value(rule, matched: frozenset) -> Node:
    schemas = [node for src, node in rule.patterns if src in matched]
    return conj_all(schemas) if schemas else rule.additional


def _narrow_regions(t: ObjT, named: dict, em: Emitter) -> list:
    """Regions without automata: right for every key, narrower than the schema."""
    names = [StrT()] if t.names.top else [x for x in t.names.terms if isinstance(x, StrT)]
    out = []
    everything = conj_all(conj(r.additional, conj_all(n for _, n in r.patterns)) for r in t.rules)
    if not everything.never:
        for nt in names:
            out.append(_region(nt, everything, named, em))
    for i, rule in enumerate(t.rules):
        others = conj_all(
            conj(r.additional, conj_all(n for _, n in r.patterns))
            for j, r in enumerate(t.rules)
            if j != i
        )
        for src, node in rule.patterns:
            overlapping = [n for s, n in rule.patterns if s != src and _overlap(src, s)]
            value = conj_all([node, others] + overlapping)
            for nt in names:
                out.append(_region(_with_pattern(nt, src), value, named, em))
    return [r for r in out if r is not None]


def _with_pattern(nt: StrT, src: str) -> StrT:
    from dataclasses import replace

    return replace(nt, patterns=nt.patterns + (src,))


def _region(keys: StrT, value: Node, named: dict, em: Emitter) -> R | None:
    """Members with a key of ``keys`` (other than the named keys) and a value of ``value``."""
    clashing = {k for k in named if str_ok(keys, k)}
    if clashing and not can_exclude(keys):
        value = conj_all([value] + [named[k] for k in clashing])
        clashing = set()
    if value.never:
        return None
    from dataclasses import replace

    key_regex = string_regex(replace(keys, excluded=keys.excluded | frozenset(clashing)))
    return _member(key_regex, em.node(value), em)


@lru_cache(maxsize=1024)
def _key_partition(patterns: tuple, named: frozenset) -> list | None:
    """For each set S of the patterns, the key texts of the strings that match exactly the
    patterns in S and are not ``named``: [(S, regex)], empty classes left out. None when
    interegular cannot build the automata or the regexes grow too large."""
    if len(patterns) > 4 or not all(_small_classes(p) for p in patterns):
        return None
    try:
        import interegular

        fsms = [interegular.parse_pattern(pattern_matcher(p).pattern).to_fsm() for p in patterns]
        taken = [interegular.parse_pattern(lit(k).text or "(?:)").to_fsm() for k in named]
        out = []
        for mask in range(2 ** len(patterns)):
            inside = [f for i, f in enumerate(fsms) if mask >> i & 1]
            outside = [f for i, f in enumerate(fsms) if not mask >> i & 1] + taken
            keys = inside[0].intersection(*inside[1:]) if inside else outside[0].everythingbut()
            if outside:
                keys = keys.difference(*outside)
            keys = keys.reduce()
            if keys.empty():
                continue
            body = _fsm_regex(keys)
            if body is None:
                return None
            out.append(
                (
                    frozenset(p for i, p in enumerate(patterns) if mask >> i & 1),
                    cat(lit('"'), body, lit('"')),
                )
            )
    except Exception:  # noqa: BLE001 - interegular gave up: callers fall back to narrower regions
        return None
    return out


def _small_classes(source: str) -> bool:
    """interegular expands every character range it reads: only hand it patterns whose classes
    are written with a few thousand characters at most (``\\p{L}`` is not)."""
    from lmprog.fsm.regex import Chars, Concat, Repeat, parse_regex

    def ok(node) -> bool:
        if isinstance(node, Chars):
            size = node.chars.size()
            return size <= 4096 or ANY_CHAR.size() - size <= 4096
        if isinstance(node, Repeat):
            return ok(node.node)
        return all(ok(p) for p in (node.parts if isinstance(node, Concat) else node.options))

    return all(ok(b.node) for b in parse_regex(source, "ecma").branches)


def _fsm_regex(fsm) -> R | None:
    """The canonical-token regex of a small interegular automaton (None if too large)."""
    from interegular.fsm import anything_else

    if len(fsm.states) > 24:
        return None
    explicit = CharSet.of(c for c in fsm.alphabet if c is not anything_else)
    classes = {}
    for symbol, chars in fsm.alphabet.by_transition.items():
        members = CharSet.of(c for c in chars if c is not anything_else)
        classes[symbol] = members | (ANY_CHAR - explicit) if anything_else in chars else members
    edges: dict = {}
    for state, moves in fsm.map.items():
        for symbol, target in moves.items():
            edges[(state, target)] = edges.get((state, target), CharSet()) | classes[symbol]
    try:
        return to_regex(
            {pair: canonical_token(c) for pair, c in edges.items()},
            fsm.initial,
            fsm.finals,
            limit=8000,
        )
    except OverflowError:
        return None


@lru_cache(maxsize=4096)
def _overlap(a: str, b: str) -> bool:
    """Whether some string contains matches of both patterns (True when unsure)."""
    if not (_small_classes(a) and _small_classes(b)):
        return True
    try:
        import interegular

        fa = interegular.parse_pattern(pattern_matcher(a).pattern).to_fsm()
        fb = interegular.parse_pattern(pattern_matcher(b).pattern).to_fsm()
        return not (fa & fb).empty()
    except Exception:  # noqa: BLE001 - interegular gave up: assume they overlap (the conservative answer)
        return True
