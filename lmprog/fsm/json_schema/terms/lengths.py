"""A string's maxLength counted beside its pattern, where one lexeme holding both is too big.

Where a large pattern meets a large maxLength, the lexeme pairing them spends llguidance's
lexer limits within a few hundred tokens; there the lexeme keeps the pattern and minLength,
and the guide's check counts the characters (``LengthCount``, ``checks.JsonChecks``), never
accepting a longer string. ``counted_apart`` picks those terms. Why and when:
docs/design/json-schema.md.
"""

from __future__ import annotations

from bisect import bisect_right
from functools import lru_cache

from lmprog.fsm.json_schema.terms.formats import format_source
from lmprog.fsm.json_schema.terms.jsontext import decode
from lmprog.fsm.json_schema.terms.matched import PatternMatch, has_backrefs
from lmprog.fsm.json_schema.terms.nodes import ArrT, Bodies, Node, ObjT, RefT, StrT, Term
from lmprog.fsm.regex import parse_regex
from lmprog.fsm.regex.charset import SURROGATES, CharSet
from lmprog.fsm.regex.dfa import search_automaton
from lmprog.fsm.regex.lookahead import split_lookaheads

# counted apart: a maxLength of at least APART_LENGTH (the lexeme's emptiness checks walk the
# characters left: 500 already spent a mask step's fuel on a 21-state word-count pattern), or
# automaton states x (maxLength + 1) past APART
APART_LENGTH = 256
APART = 20_000
MAX_STATES = 2_048  # the largest pattern automaton counted over (building it is Python)
_FAR = 1 << 62  # a state from which the pattern cannot end


class LengthCount:
    """A string term's pattern as an automaton over characters, and its maxLength. A string
    being read is (state, characters completed, bytes of one begun): `read` moves it, `fits`
    says whether it can still end within maxLength. Immutable; shared by every guide."""

    initial = 0  # the automaton's start state

    def __init__(self, t: StrT) -> None:
        """OverflowError if the pattern's automaton has over MAX_STATES states."""
        (source,) = _sources(t)
        moves, blocks, accepting = search_automaton(parse_regex(source, "ecma"), MAX_STATES)
        assert t.max_len is not None  # (counted_apart counts only strings with a maxLength)
        self.max_len: int = t.max_len
        self.states = len(moves)
        self._moves = moves
        self._blocks = blocks
        self.short = _shortest(moves, accepting)
        # the most characters a live state needs to end (a token that leaves at least this
        # much room is never refused)
        self.slack = max((s for s in self.short if s < _FAR), default=0)
        bounds = sorted((lo, hi, b) for b, chars in enumerate(blocks) for lo, hi in chars.ranges)
        self._los = [lo for lo, _, _ in bounds]
        self._block_at = [b for _, _, b in bounds]

    def block(self, cp: int) -> int:
        return self._block_at[bisect_right(self._los, cp) - 1]

    def read(self, q: int, n: int, pending: bytes, data: bytes) -> tuple[int, int, bytes]:
        """The string after `data` (content bytes, no closing quote) from (q, n, pending)."""
        cps, pending = decode(pending + data)
        for cp in cps:
            q = self._moves[q][self.block(cp)]
        return q, n + len(cps), pending

    def close(self, q: int, n: int, pending: bytes) -> int | None:
        """The length of the string its closing quote ends here; None past maxLength."""
        cps, rest = decode(pending, final=True)
        assert not rest, rest
        n += len(cps)
        return n if n <= self.max_len else None

    def fits(self, q: int, n: int, pending: bytes) -> bool:
        """Whether the string can still end within maxLength (its pattern and minLength are
        the lexeme's: a text the grammar allows can end)."""
        room = self.max_len - n
        if not pending:
            return self.short[q] <= room
        return any(self.short[self._moves[q][b]] < room for b in self._completing(pending))

    def _completing(self, pending: bytes) -> list[int]:
        """The blocks holding a character that `pending` (its first bytes) may become."""
        if pending[:1] == b"\\":  # an escape: any character may follow (see module notes)
            return list(range(len(self._blocks)))
        size = 2 if pending[0] >> 5 == 0b110 else 3 if pending[0] >> 4 == 0b1110 else 4
        bits = pending[0] & (0x7F >> size)
        for byte in pending[1:]:
            bits = bits << 6 | byte & 0x3F
        free = 6 * (size - len(pending))
        lo = max(bits << free, (0x80, 0x800, 0x10000)[size - 2])
        chars = CharSet(((lo, (bits << free) | ((1 << free) - 1)),)) - CharSet((SURROGATES,))
        return [b for b, block in enumerate(self._blocks) if not (block & chars).is_empty()]


def counted_apart(root: Node, bodies: Bodies) -> dict[StrT, LengthCount | PatternMatch]:
    """The string terms of a schema whose maxLength its grammar leaves to the check, each
    with its count (docs/design/json-schema.md says which), and those whose patterns with
    backreferences the check matches (``matched.PatternMatch``). A term is read by the check
    only where the check can tell that a string is one of it: alone among the string terms
    of every value it may be, outside a union of containers. `bodies`: RefT key -> node."""
    alone: set[StrT] = set()
    shared: set[StrT] = set()
    seen: set[tuple[Node, bool]] = set()
    todo = [(root, False)]  # (a node the check may read, under a union of containers)
    while todo:
        node, union = todo.pop()
        if node.top or (node, union) in seen:
            continue
        seen.add((node, union))
        terms = _terms(node, bodies)
        strings = {t for t in terms if isinstance(t, StrT)}
        objects = [t for t in terms if isinstance(t, ObjT)]
        arrays = [t for t in terms if isinstance(t, ArrT)]
        if any(t.contains for t in arrays) or any(t.some_values for t in objects):
            return {}
        (shared if union or len(strings) > 1 else alone).update(strings)
        union = union or len(objects) > 1 or len(arrays) > 1
        for o in objects:
            todo += [(v, union) for _, v in o.props]
            todo += [
                (v, union) for r in o.rules for v in (r.additional, *(n for _, n in r.patterns))
            ]
        for a in arrays:
            todo += [(v, union) for v in (*a.prefix, a.rest)]
    out: dict[StrT, LengthCount | PatternMatch] = {}
    for s in alone - shared:
        count: LengthCount | PatternMatch | None = _count(s)
        if count is None and s.values is None and has_backrefs(s):
            count = PatternMatch(s)
        if count is not None:
            out[s] = count
    return out


@lru_cache(maxsize=1024)
def _count(t: StrT) -> LengthCount | None:
    """The term's count, if its length is to be counted apart (built once per term)."""
    if t.max_len is None or t.values is not None or t.excluded or t.not_patterns:
        return None
    if has_backrefs(t):  # (its maxLength stays in the lexeme; the patterns are matched)
        return None
    if len(_sources(t)) != 1 or t.patterns and split_lookaheads(t.patterns[0]) != (t.patterns, ()):
        return None
    try:
        count = LengthCount(t)
    except OverflowError:
        return None
    if count.slack > t.max_len - t.min_len:
        return None
    if t.max_len < APART_LENGTH and count.states * (t.max_len + 1) <= APART:
        return None
    return count


def _sources(t: StrT) -> tuple[str, ...]:
    return t.patterns + tuple(format_source(f) for f in t.formats)


def _terms(node: Node, bodies: Bodies) -> list[Term]:
    """The node's terms, references followed (as the check reads them)."""
    out: list[Term] = []
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        for t in n.terms:
            if isinstance(t, RefT):
                if t.key not in seen:
                    seen.add(t.key)
                    todo.append(bodies[t.key])
            else:
                out.append(t)
    return out


def _shortest(moves: list[list[int]], accepting: list[bool]) -> list[int]:
    """Each state's fewest characters to an accepting state (_FAR: none)."""
    back: list[list[int]] = [[] for _ in moves]
    for p, row in enumerate(moves):
        for q in set(row):
            back[q].append(p)
    short = [0 if a else _FAR for a in accepting]
    frontier = [q for q, a in enumerate(accepting) if a]
    while frontier:
        nxt = []
        for q in frontier:
            for p in back[q]:
                if short[p] == _FAR:
                    short[p] = short[q] + 1
                    nxt.append(p)
        frontier = nxt
    return short
