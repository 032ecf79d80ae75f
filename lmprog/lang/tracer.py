"""Tracing: run a program on a recording state with placeholder arguments.

`program.trace(question=lp.Arg)` calls the program with `question` bound to an `ArgRef`
and `s` bound to a `TracerState`, which records every validated node instead of running
it. A placeholder formatted into an f-string is recorded too: it formats as a sentinel that
`_submit` splits back into text and argument nodes. Tracing stops (and the graph says why)
at the first operation that needs a value the tracer does not have: str() of a placeholder,
a truth test on it, reading a generated variable, the text so far... Design:
docs/design/frontend.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from lmprog.core.sampling import SamplingParams
from lmprog.lang.frontend import FrontendState, Inherited, Step
from lmprog.lang.ir import (
    ArgRef,
    Fork,
    Graph,
    Join,
    Node,
    Text,
    TraceStop,
    mentions_placeholder,
    split_placeholders,
)


class Arg:
    """Placeholder for an argument whose value is unknown: `program.trace(question=lp.Arg)`.

    Pass the class itself (or an instance). Inside the traced program the argument is an
    `ArgRef` node: appending or concatenating it is recorded, using its value stops the trace.
    """


def is_arg_marker(value: object) -> bool:
    return value is Arg or isinstance(value, Arg)


class _PendingFork:
    """A fork whose branches are still being recorded."""

    def __init__(self, fork: Fork, children: list[TracerState]) -> None:
        self.fork = fork
        self.children = children


class TracerState(FrontendState):
    """A state that records the nodes a program appends."""

    def __init__(self, defaults: SamplingParams, inherited: Inherited | None = None) -> None:
        super().__init__(defaults, inherited)
        self._items: list[Node | _PendingFork] = []

    def _submit(self, steps: tuple[Step, ...], defines: tuple[str, ...]) -> None:
        for node, _ in steps:
            if isinstance(node, Text):
                if mentions_placeholder(node.text):  # an f-string with a placeholder in it
                    self._items.extend(split_placeholders(node.text))
                else:
                    self._items.append(node)
            elif mentions_placeholder(repr(node)):
                raise TraceStop(
                    f"an argument formatted into a string is used in a {type(node).__name__} "
                    "node's arguments, which need its value"
                )
            else:
                self._items.append(node)

    def _spawn(self, fork: Fork, inherited: Inherited) -> list[TracerState]:
        children = [TracerState(self._defaults, inherited) for _ in range(fork.n)]
        self._items.append(_PendingFork(fork, children))
        return children

    def _submit_join(
        self, join: Join, children: Sequence[TracerState], defines: tuple[str, ...]
    ) -> None:
        self._items.append(join)

    def _on_close(self) -> None:
        pass

    def _accept_arg(self, node: ArgRef) -> None:
        pass

    def graph(
        self, name: str, arguments: tuple[str, ...] = (), stopped: str | None = None
    ) -> Graph:
        nodes: list[Node] = []
        for item in self._items:
            if isinstance(item, _PendingFork):
                branches = tuple(c.graph(f"branch{i}") for i, c in enumerate(item.children))
                nodes.append(Fork(item.fork.n, item.fork.fork_id, branches))
            else:
                nodes.append(item)
        return Graph(name, tuple(nodes), arguments, stopped)

    # Reading anything produced at run time ends the trace.

    def __getitem__(self, name: str) -> Any:
        raise TraceStop(f"the program reads variable {name!r}, generated at run time")

    def __contains__(self, name: object) -> bool:
        raise TraceStop(f"the program tests whether {name!r} is set, known at run time")

    def _store_var(self, name: str, value: Any) -> None:
        pass  # a Python value, not part of the text: nothing to record

    def text(self) -> str:
        raise TraceStop("the program reads its text, produced at run time")

    def messages(self) -> list[dict[str, str]]:
        raise TraceStop("the program reads its messages, produced at run time")

    def get_meta_info(self, name: str) -> Any:
        raise TraceStop(f"the program reads the meta info of {name!r}, produced at run time")

    def sync(self) -> None:
        raise TraceStop("the program waits for generation (sync)")

    def error(self) -> BaseException | None:
        raise TraceStop("the program checks for a run-time error")

    def text_iter(self, var: str | None = None) -> Iterator[str]:
        raise TraceStop("the program streams its text")

    def text_async_iter(self, var: str | None = None) -> AsyncIterator[str]:
        raise TraceStop("the program streams its text")


def trace_program(
    func: Callable[..., Any],
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    defaults: SamplingParams,
) -> Graph:
    """Run `func(state, *args, **kwargs)` on a `TracerState`; return the recorded graph.

    Arguments that are `lp.Arg` markers become `ArgRef` placeholders. Errors other than a
    trace stop (a bad argument to a primitive, a nested role, ...) propagate.
    """
    placeholders = [k for k, v in kwargs.items() if is_arg_marker(v)]
    kwargs = {k: ArgRef(k) if is_arg_marker(v) else v for k, v in kwargs.items()}
    state = TracerState(defaults)
    stopped = None
    try:
        func(state, *args, **kwargs)
    except TraceStop as e:
        stopped = e.reason
    state._close("tracing finished")
    return state.graph(name, tuple(placeholders), stopped)
