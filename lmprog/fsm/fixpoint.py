"""Which nodes of a grammar derive a finite text, in time linear in the grammar.

    finite_nodes(roots, parts, need) -> ids of the nodes that derive some finite text

A node derives a finite text once `need(node, parts)` of its parts do (a sequence needs all,
a union one, an optional repetition or a literal none). This is the least fixpoint of those
rules, found by counting: each node keeps how many parts it still waits for and tells the
nodes waiting on it once that reaches 0, instead of passes over every rule (a chain of n
rules took n passes). Used on GBNF grammars (`grammar.py`) and on the JSON-schema compiler's
fragments (`json_schema/emit/lark.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

_N = TypeVar("_N")
_Parts = TypeVar("_Parts", bound=Sequence[Any])


def finite_nodes(
    roots: Iterable[_N],
    parts: Callable[[_N], _Parts],
    need: Callable[[_N, _Parts], int],
) -> set[int]:
    """The `id()`s of the nodes reachable from `roots` that derive some finite text."""
    waiting_for: dict[int, int] = {}  # node id -> parts still needed
    parents: dict[int, list[int]] = {}  # node id -> the nodes waiting on it
    ready: list[int] = []
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) in waiting_for:
            continue
        its_parts = parts(node)
        waiting_for[id(node)] = need(node, its_parts)
        for part in its_parts:
            parents.setdefault(id(part), []).append(id(node))
            stack.append(part)
        if waiting_for[id(node)] == 0:
            ready.append(id(node))
    done: set[int] = set()
    while ready:
        node_id = ready.pop()
        if node_id in done:
            continue
        done.add(node_id)
        for parent in parents.get(node_id, ()):
            waiting_for[parent] -= 1
            if waiting_for[parent] == 0:
                ready.append(parent)
    return done
