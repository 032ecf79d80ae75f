"""The IR: frozen node types shared by the tracer and the interpreter.

    Expr (appendable with `s += ...`, composable with `+`)
      Text, ArgRef, Gen, Select, RoleBegin, RoleEnd, Image, Concat
    Node (structural; created by state methods only)
      VarScopeBegin, VarScopeEnd, Fork, Join

`s += x` turns `x` into nodes (`flatten`, which also dissolves `Concat`); the tracer records
them into a `Graph`, the interpreter executes them: what `trace()` prints is what runs.
Design: docs/design/frontend.md.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from lmprog.core.sampling import SamplingParams
from lmprog.core.text import check_text

if TYPE_CHECKING:
    from lmprog.fsm import Constraint
    from lmprog.lang.choices import ChoicesMethod

Role = Literal["system", "user", "assistant"]
ROLES: tuple[str, ...] = ("system", "user", "assistant")
JoinMode = Literal["gather", "concat_and_append"]


class TraceStop(BaseException):
    """Raised inside a traced program at the first operation the tracer cannot follow.

    A BaseException so that a program's own `except Exception:` does not swallow it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Node:
    """Base of every IR node."""

    def describe(self) -> str:
        """A one-line human-readable form (used when a graph is printed)."""
        return type(self).__name__


@dataclass(frozen=True, slots=True)
class Expr(Node):
    """A node a program may append (`s += expr`) or concatenate (`expr + "text"`)."""

    def __add__(self, other: object) -> Concat:
        return Concat(flatten(self) + flatten(other))

    def __radd__(self, other: object) -> Concat:
        return Concat(flatten(other) + flatten(self))


@dataclass(frozen=True, slots=True)
class Text(Expr):
    """Constant text, appended as is (ValueError if it is not valid Unicode)."""

    text: str

    def __post_init__(self) -> None:
        check_text(self.text)

    def describe(self) -> str:
        return f"Text({_short(repr(self.text))})"


@dataclass(frozen=True, slots=True)
class ArgRef(Expr):
    """An argument whose value is unknown while tracing (`lp.Arg`).

    Appending or concatenating it is recorded, and so is formatting it into an f-string
    (`f"The capital of {country} is"`): it formats as a sentinel the tracer splits back
    into text and argument nodes (`split_placeholders`). Anything else that needs its
    value (str(), a format spec, `if arg:`, iteration, attribute access) stops the trace.
    """

    name: str

    def describe(self) -> str:
        return f"Arg({self.name})"

    def _stop(self, what: str) -> TraceStop:
        return TraceStop(f"{what} of argument {self.name!r} needs its value")

    def __str__(self) -> str:
        raise self._stop("str()")

    def __format__(self, spec: str) -> str:
        if spec:
            raise self._stop(f"formatting with the spec {spec!r}")
        return placeholder_sentinel(self.name)

    def __bool__(self) -> bool:
        raise self._stop("truth test")

    def __len__(self) -> int:
        raise self._stop("len()")

    def __iter__(self) -> NoReturn:
        raise self._stop("iteration")

    def __getitem__(self, key: object) -> NoReturn:
        raise self._stop("indexing")

    def __contains__(self, item: object) -> bool:
        raise self._stop("`in` test")

    def __int__(self) -> int:
        raise self._stop("int()")

    def __float__(self) -> float:
        raise self._stop("float()")

    def __index__(self) -> int:
        raise self._stop("use as an index")

    def __getattr__(self, attr: str) -> NoReturn:
        if attr.startswith("_"):
            raise AttributeError(attr)
        raise self._stop(f"attribute access .{attr}")


# What a placeholder formats as inside an f-string while tracing: NUL-delimited, with a
# per-process random nonce, so no text a program writes can look like one.
_SENTINEL_TAG = f"lmprog-arg-{secrets.token_hex(8)}:"
_SENTINEL = re.compile("\x00" + re.escape(_SENTINEL_TAG) + "([^\x00]*)\x00")


def placeholder_sentinel(name: str) -> str:
    """The text `f"{placeholder}"` produces for the placeholder of argument `name`."""
    return f"\x00{_SENTINEL_TAG}{name}\x00"


def split_placeholders(text: str) -> tuple[Expr, ...]:
    """`text` with each placeholder sentinel turned back into its `ArgRef`: Text and ArgRef
    nodes in order. Raises TraceStop if a sentinel was altered (sliced, upper-cased...):
    the program used the argument's text in a way the trace cannot follow."""
    parts: list[Expr] = []
    pos = 0
    for match in _SENTINEL.finditer(text):
        if match.start() > pos:
            parts.append(Text(text[pos : match.start()]))
        parts.append(ArgRef(match.group(1)))
        pos = match.end()
    if pos < len(text):
        parts.append(Text(text[pos:]))
    for part in parts:
        if isinstance(part, Text) and mentions_placeholder(part.text):
            raise TraceStop(
                "an argument formatted into a string was then changed as text (sliced, "
                "case-changed, ...), which needs its value"
            )
    return tuple(parts)


def mentions_placeholder(text: str) -> bool:
    """Whether `text` may hold (part of) a placeholder's sentinel: its tag, or a NUL (what
    a slice of one keeps at either end; text that holds a NUL of its own merely ends the
    trace, never changes what runs)."""
    return "\x00" in text or _SENTINEL_TAG in text


@dataclass(frozen=True, slots=True)
class Gen(Expr):
    """Generate text into variable `name` (None: append it without naming it).

    `overrides` holds only the sampling fields the call set explicitly, as sorted
    (field, value) pairs; `sampling_params` merges them over the run's defaults.
    `constraint` is an `lmprog.fsm.Constraint` or None; `constraint_spec` says how it was
    asked for ("regex", "json_schema", "dtype=int") for printing. `schema_class` is the
    pydantic model class or Python type given as json_schema, if any (what
    `state.parsed(name)` builds). `reasoning` (a `lmprog.lang.reasoning.Reasoning`, set by
    `separate_reasoning`): the output is a reasoning model's, split into thinking and answer.
    """

    name: str | None
    overrides: tuple[tuple[str, Any], ...] = ()
    constraint: Constraint | None = None
    constraint_spec: str | None = None
    schema_class: object = field(default=None, compare=False)
    reasoning: Any = None

    def sampling_params(self, defaults: SamplingParams) -> SamplingParams:
        """The one place where a gen's own arguments meet the run's defaults."""
        return defaults.merged(dict(self.overrides)) if self.overrides else defaults

    def describe(self) -> str:
        parts = [repr(self.name)] + [f"{k}={v!r}" for k, v in self.overrides]
        if self.constraint_spec:
            parts.append(self.constraint_spec)
        if self.reasoning is not None:
            parts.append("separate_reasoning")
        return f"Gen({', '.join(parts)})"


@dataclass(frozen=True, slots=True)
class Select(Expr):
    """Append the choice the backend scores best (by `method`) and name it `name`."""

    name: str | None
    choices: tuple[str, ...]
    method: ChoicesMethod

    def describe(self) -> str:
        return f"Select({self.name!r}, {list(self.choices)!r}, {self.method.name})"


@dataclass(frozen=True, slots=True)
class RoleBegin(Expr):
    """Open a chat message of `role` (renders the chat template's role prefix)."""

    role: str

    def describe(self) -> str:
        return f"RoleBegin({self.role})"


@dataclass(frozen=True, slots=True)
class RoleEnd(Expr):
    """Close the open chat message of `role` (renders the role suffix)."""

    role: str

    def describe(self) -> str:
        return f"RoleEnd({self.role})"


@dataclass(frozen=True, slots=True)
class Image(Expr):
    """An image for a vision-language model: a file path (read when the node runs) or the
    encoded bytes (`lp.image` encodes a PIL image or a data URL to them)."""

    source: str | bytes

    def describe(self) -> str:
        if isinstance(self.source, bytes):
            return f"Image(<{len(self.source)} bytes>)"
        return f"Image({self.source!r})"


@dataclass(frozen=True, slots=True)
class Concat(Expr):
    """A sequence of expressions built with `+`; never nested (see `flatten`)."""

    parts: tuple[Expr, ...]

    def describe(self) -> str:
        return " + ".join(p.describe() for p in self.parts)


@dataclass(frozen=True, slots=True)
class VarScopeBegin(Node):
    """Start capturing appended text into variable `name` (`with s.var_scope(name):`)."""

    name: str

    def describe(self) -> str:
        return f"VarScopeBegin({self.name!r})"


@dataclass(frozen=True, slots=True)
class VarScopeEnd(Node):
    """Stop capturing; the variable holds the text appended since the matching begin."""

    name: str

    def describe(self) -> str:
        return f"VarScopeEnd({self.name!r})"


@dataclass(frozen=True, slots=True)
class Fork(Node):
    """Copy the state `n` times (`s.fork(n)`); the copies continue independently.

    In a traced graph `branches` holds each copy's own sub-graph; when executed it is empty.
    """

    n: int
    fork_id: int
    branches: tuple[Graph, ...] = ()

    def describe(self) -> str:
        return f"Fork(n={self.n}, id={self.fork_id})"


@dataclass(frozen=True, slots=True)
class Join(Node):
    """Join the copies of fork `fork_id` back into the state (`group.join(mode)`)."""

    fork_id: int
    mode: JoinMode = "gather"

    def describe(self) -> str:
        return f"Join(id={self.fork_id}, mode={self.mode})"


def flatten(value: object) -> tuple[Expr, ...]:
    """The leaf nodes `s += value` appends, in order.

    Accepts a str, an int or float (appended as `str(value)`), or an expression; raises
    TypeError for anything else (None included), saying what is accepted.
    """
    if isinstance(value, str):
        return (Text(value),) if value else ()
    if isinstance(value, Concat):
        return value.parts
    if isinstance(value, Expr):
        return (value,)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (Text(str(value)),)
    raise TypeError(
        f"cannot append {type(value).__name__} {_short(repr(value))}: a program appends str, "
        "int, float, or an lmprog expression (lp.gen, lp.select, lp.user(...), lp.image, or "
        "their `+` concatenation)"
        + (" — got None; did a function forget to return?" if value is None else "")
    )


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Nodes whose rendering depends on nothing but the chat template.
_CONSTANT = (Text, RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd)


@dataclass(frozen=True)
class Graph:
    """The traced form of a program: the nodes it appends, in order; printable.

        >>> print(qa.trace(question=lp.Arg))
        graph qa(question)
          0  RoleBegin(system)
          1  Text('You are a terse assistant.')
          2  RoleEnd(system)
          3  RoleBegin(user)
          4  Arg(question)
          ...

    Forks hold their branches as sub-graphs (`Fork.branches`). `arguments` names the arguments that were placeholders (`lp.Arg`); `stopped` is None
    when the whole program was traced, else the reason tracing stopped; the nodes before
    that point are still exactly what the program appends.
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
