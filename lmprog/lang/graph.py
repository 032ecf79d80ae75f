"""The traced form of a program: an inspectable, printable graph of IR nodes.

    >>> print(qa.trace(question=lp.Arg))
    graph qa(question)
      0  RoleBegin(system)
      1  Text('You are a terse assistant.')
      2  RoleEnd(system)
      3  RoleBegin(user)
      4  Arg(question)
      ...

Forks hold their branches as sub-graphs. A graph records where and why tracing stopped
(`stopped`); the nodes before that point are still exactly what the program appends.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from lmprog.lang.ir import Fork, Node, RoleBegin, RoleEnd, Text, VarScopeBegin, VarScopeEnd

# Nodes whose rendering depends on nothing but the chat template.
_CONSTANT = (Text, RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd)


@dataclass(frozen=True)
class Graph:
    """The nodes a program appends, in order.

    `arguments` names the arguments that were placeholders (`lp.Arg`); `stopped` is None
    when the whole program was traced, else the reason tracing stopped.
    """

    name: str
    nodes: tuple[Node, ...]
    arguments: tuple[str, ...] = ()
    stopped: str | None = None

    def constant_prefix(self) -> tuple[Node, ...]:
        """The leading nodes that depend on no argument and no generated value.

        These render to the same text for every call of the program (given a chat
        template), so a batch can compute their KV cache once before fanning out.
        """
        prefix = []
        for node in self.nodes:
            if not isinstance(node, _CONSTANT):
                break
            prefix.append(node)
        return tuple(prefix)

    def walk(self) -> Iterator[Node]:
        """Every node, depth first, with each fork's branches right after the fork."""
        for node in self.nodes:
            yield node
            if isinstance(node, Fork):
                for branch in node.branches:
                    yield from branch.walk()

    def __len__(self) -> int:
        return len(self.nodes)

    def __str__(self) -> str:
        return "\n".join(self._lines(0))

    def _lines(self, indent: int) -> list[str]:
        pad = "  " * indent
        lines = [f"{pad}graph {self.name}({', '.join(self.arguments)})"]
        for i, node in enumerate(self.nodes):
            lines.append(f"{pad}  {i:<3}{node.describe()}")
            if isinstance(node, Fork):
                for branch in node.branches:
                    lines.extend(branch._lines(indent + 2))
        if self.stopped:
            lines.append(f"{pad}  (tracing stopped: {self.stopped})")
        return lines
