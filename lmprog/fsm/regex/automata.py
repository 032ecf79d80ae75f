"""Small automata to regexes, by state elimination.

Some exact constraints are easy as automata and hard as regexes: "divisible by 3" is a 3-state
automaton over digits, "a key matching none of these patterns" is the complement of a small
automaton. ``to_regex`` removes states one by one, relabelling each path p -> q -> r with
``A (L)* B`` (L the loop on q), until only a fresh start and a fresh final state remain. The
result grows quickly with the number of states, so callers give up (and refuse or narrow) above
``limit`` characters.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping

from lmprog.fsm.regex.fragments import EPS, R, alt, cat, rep

_START, _FINAL = "start", "final"

# A graph being reduced: (p, q) -> the regex of the paths from state p to state q.
_Graph = dict[tuple[Hashable, Hashable], R]


def to_regex(
    edges: Mapping[tuple[Hashable, Hashable], R],
    start: Hashable,
    finals: Iterable[Hashable],
    limit: int = 20000,
) -> R | None:
    """The regex of an automaton given as ``{(p, q): R}`` (one fragment per state pair),
    or None when it accepts nothing. Raises OverflowError past ``limit`` characters."""
    graph: _Graph = {}
    for (p, q), label in edges.items():
        _add(graph, p, q, label)
    _add(graph, _START, start, EPS)
    for f in finals:
        _add(graph, f, _FINAL, EPS)
    inner = {s for pair in graph for s in pair} - {_START, _FINAL}
    while inner:
        q = min(inner, key=lambda s: _degree(graph, s))
        inner.remove(q)
        loop = graph.pop((q, q), None)
        star = rep(loop, 0, None) if loop is not None else EPS
        ins = [(p, lab) for (p, r), lab in graph.items() if r == q]
        outs = [(r, lab) for (p, r), lab in graph.items() if p == q]
        for p, _ in ins:
            del graph[(p, q)]
        for r, _ in outs:
            del graph[(q, r)]
        for p, a in ins:
            for r, b in outs:
                _add(graph, p, r, cat(a, star, b))
                if len(graph[(p, r)].text) > limit:
                    raise OverflowError("automaton too large for a regex")
    return graph.get((_START, _FINAL))


def _add(graph: _Graph, p: Hashable, q: Hashable, label: R | None) -> None:
    if label is None:
        return
    graph[(p, q)] = alt(graph[(p, q)], label) if (p, q) in graph else label


def _degree(graph: _Graph, s: Hashable) -> int:
    ins = sum(1 for (p, q) in graph if q == s and p != s)
    outs = sum(1 for (p, q) in graph if p == s and q != s)
    return ins * outs
