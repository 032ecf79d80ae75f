"""The program-facing half of a state: what `s` offers inside a program.

`FrontendState` turns every append into IR nodes, validates them at the call that made them
(the value's type, role structure, sampling parameters, variable names) and hands them on
(`_submit`) to the tracer's state, which records them, or the interpreter's `ProgramState`,
which executes them; so validation is identical whether a program is traced or run.
Design: docs/design/frontend.md.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from lmprog.core.limits import get_limits, over_limit
from lmprog.core.sampling import SamplingParams
from lmprog.lang.fork import ForkGroup
from lmprog.lang.ir import (
    ROLES,
    ArgRef,
    Expr,
    Fork,
    Gen,
    Join,
    JoinMode,
    Node,
    RoleBegin,
    RoleEnd,
    Select,
    VarScopeBegin,
    VarScopeEnd,
    flatten,
)

S = TypeVar("S", bound="FrontendState")

# What `_submit` receives: each node with its payload (the resolved SamplingParams of a Gen;
# None for other nodes; subclasses attach their own payloads to Fork and Join).
Step = tuple[Node, Any]

JOIN_MODES: dict[str, JoinMode] = {
    "gather": "gather",
    "gather_variable": "gather",
    "concat_and_append": "concat_and_append",
    "concate_and_append": "concat_and_append",  # SGLang's spelling
}


@dataclass(frozen=True)
class Inherited:
    """What a fork's copy takes from its parent's front half."""

    open_role: str | None
    declared: tuple[str, ...]


class FrontendState(abc.ABC):
    """The state `s` a program appends to (`s += x`) and reads from (`s["x"]`).

    Subclasses implement `_submit` (take validated steps), `_spawn` (make a fork's
    copies), `_submit_join`, `_on_close`, `_accept_arg` and the readers.
    """

    def __init__(self, defaults: SamplingParams, inherited: Inherited | None = None) -> None:
        self._defaults = defaults
        self._open_role: str | None = inherited.open_role if inherited else None
        self._declared: dict[str, None] = dict.fromkeys(inherited.declared) if inherited else {}
        self._new_names: dict[str, None] = {}  # declared here, not inherited (what join gathers)
        self._scopes: list[str] = []
        self._closed: str | None = None  # why appends are refused, once closed
        self._fork_count = 0
        self._open_groups: list[ForkGroup[FrontendState]] = []

    # ---- appending ---------------------------------------------------------------

    def __iadd__(self: S, value: object) -> S:
        """Append text, a number or an expression; see `lmprog.lang.ir.flatten`."""
        self._append(flatten(value))
        return self

    def _append(self, exprs: tuple[Expr, ...]) -> None:
        self._check_open()
        role = self._open_role
        steps: list[Step] = []
        names: list[str] = []
        for node in exprs:
            role = _next_role(node, role)
            if isinstance(node, ArgRef):
                self._accept_arg(node)
            if isinstance(node, Gen):
                steps.append((node, self._resolve(node)))
            elif isinstance(node, Select):  # the run's defaults: its LoRA adapter
                steps.append((node, self._defaults))
            else:
                steps.append((node, None))
            if isinstance(node, (Gen, Select)) and node.name is not None:
                names.append(node.name)
        self._open_role = role
        if steps:
            self._submit(tuple(steps), tuple(names))
        self._declare(names)  # after submitting: a reader then waits for the new value

    def _resolve(self, node: Gen) -> SamplingParams:
        try:
            return node.sampling_params(self._defaults)
        except (TypeError, ValueError) as e:
            raise type(e)(f"gen({node.name!r}) with the run's defaults: {e}") from None

    # ---- roles -------------------------------------------------------------------

    def system(self, expr: object = None) -> contextlib.AbstractContextManager[None] | None:
        """`with s.system():` opens a system message; `s.system(x)` appends a whole one."""
        return self._role("system", expr)

    def user(self, expr: object = None) -> contextlib.AbstractContextManager[None] | None:
        """`with s.user():` opens a user message; `s.user(x)` appends a whole one."""
        return self._role("user", expr)

    def assistant(self, expr: object = None) -> contextlib.AbstractContextManager[None] | None:
        """`with s.assistant():` opens an assistant message; `s.assistant(x)` appends one."""
        return self._role("assistant", expr)

    def _role(self, role: str, expr: object) -> contextlib.AbstractContextManager[None] | None:
        if expr is not None:
            self._append((RoleBegin(role), *flatten(expr), RoleEnd(role)))
            return None
        return self._role_block(role)

    @contextlib.contextmanager
    def _role_block(self, role: str) -> Iterator[None]:
        self._append((RoleBegin(role),))
        yield  # on an exception the program is failing: leave the role open
        self._append((RoleEnd(role),))

    # ---- variable scopes ---------------------------------------------------------

    def var_scope(self, name: str) -> contextlib.AbstractContextManager[None]:
        """`with s.var_scope("name"):` stores the text appended inside in variable `name`."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"var_scope() name must be a non-empty str, got {name!r}")
        return self._scope_block(name)

    @contextlib.contextmanager
    def _scope_block(self, name: str) -> Iterator[None]:
        self._check_open()
        self._scopes.append(name)
        self._submit(((VarScopeBegin(name), None),), ())
        yield
        assert self._scopes[-1] == name, "var scopes close in reverse order"
        self._scopes.pop()
        self._submit(((VarScopeEnd(name), None),), (name,))
        self._declare([name])  # readable only once the scope has closed

    # ---- fork / join -------------------------------------------------------------

    def fork(self: S, n: int = 1, position_ids_offset: Sequence[int] | None = None) -> ForkGroup[S]:
        """`n` copies of this state that continue independently; see `ForkGroup`.

        `position_ids_offset` (SGLang's, one position offset per copy) is accepted and, as
        in SGLang's interpreter, not used: each copy's text continues the parent's.
        """
        if position_ids_offset is not None and (
            isinstance(position_ids_offset, (str, bytes))
            or not isinstance(position_ids_offset, Sequence)
        ):
            raise TypeError(
                "fork() position_ids_offset must be a list of ints (one per copy) or None, "
                f"got {type(position_ids_offset).__name__}"
            )
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"fork() takes an int number of copies, got {type(n).__name__} {n!r}")
        if n < 1:
            raise ValueError(f"fork() needs at least 1 copy, got {n}")
        if n > get_limits().max_fork:
            raise over_limit(f"fork({n}) makes too many copies", n, "max_fork")
        self._check_open()
        fork = Fork(n, self._fork_count)
        self._fork_count += 1
        children = self._spawn(fork, Inherited(self._open_role, tuple(self._declared)))
        group = ForkGroup(self, fork, children, self._open_role)
        self._open_groups.append(group)
        return group

    @contextlib.contextmanager
    def copy(self: S, position_ids_offset: Sequence[int] | None = None) -> Iterator[S]:
        """`with s.copy() as c:` a copy of this state (SGLang's), joined back at the end
        (gather: the variables it created become one-item lists on `s`)."""
        group = self.fork(1, position_ids_offset)
        try:
            yield group[0]
        finally:
            if not group.joined:
                group.join()

    def _join(self, group: ForkGroup[FrontendState], mode: str) -> None:
        if mode not in JOIN_MODES:
            raise ValueError(f"join() mode must be 'gather' or 'concat_and_append', got {mode!r}")
        joined = JOIN_MODES[mode]
        self._check_open()
        children: list[FrontendState] = list(group)
        if joined == "concat_and_append":
            _check_concat(self, group, children)
        names: dict[str, None] = {}
        for child in children:
            child._close("this fork copy was joined into its parent; append to the parent instead")
            names.update(child._new_names)
        self._open_groups.remove(group)
        gathered = tuple(names) if joined == "gather" else ()
        self._submit_join(Join(group.fork.fork_id, joined), children, gathered)
        self._declare(gathered)

    # ---- lifecycle ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed is not None:
            raise RuntimeError(self._closed)

    def _close(self, reason: str) -> None:
        """Refuse further appends; copies of forks that were never joined are closed too."""
        if self._closed is not None:
            return
        self._closed = reason
        for group in self._open_groups:
            for child in group:
                child._close("the parent program finished without joining this fork")
        self._on_close()

    def _declare(self, names: Iterable[str]) -> None:
        for name in names:
            self._declared[name] = None
            self._new_names[name] = None

    # ---- subclass hooks ----------------------------------------------------------

    @abc.abstractmethod
    def _submit(self, steps: tuple[Step, ...], defines: tuple[str, ...]) -> None:
        """Take validated steps, in program order; `defines` names the variables they set."""

    @abc.abstractmethod
    def _spawn(self: S, fork: Fork, inherited: Inherited) -> list[S]:
        """Make the `fork.n` copies (same class as self) and submit the fork step."""

    @abc.abstractmethod
    def _submit_join(self: S, join: Join, children: Sequence[S], defines: tuple[str, ...]) -> None:
        """Submit the join step; `children` are already closed; `defines` is what it gathers."""

    @abc.abstractmethod
    def _on_close(self) -> None:
        """Called once when the state stops taking appends."""

    @abc.abstractmethod
    def _accept_arg(self, node: ArgRef) -> None:
        """Accept a trace placeholder, or raise TypeError where it cannot run."""

    # ---- readers -----------------------------------------------------------------

    @abc.abstractmethod
    def __getitem__(self, name: str) -> Any:
        """The value of variable `name`, once it is ready."""

    def get_var(self, name: str) -> Any:
        """`s[name]` under SGLang's name."""
        return self[name]

    def set_var(self, name: str, value: Any) -> None:
        """Set variable `name` to `value` now (SGLang's `s.set_var`; also `s[name] = value`).

        The value is any Python object, read back with `s[name]`; it is not appended to the
        text. A gen of the same name still pending overwrites it when it runs.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"a variable name is a non-empty str, got {name!r}")
        self._store_var(name, value)
        self._declare((name,))

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    @abc.abstractmethod
    def _store_var(self, name: str, value: Any) -> None:
        """Record a value set by the program (`set_var`)."""

    @abc.abstractmethod
    def __contains__(self, name: object) -> bool:
        """Whether variable `name` has a value now (SGLang's `name in s`)."""

    @abc.abstractmethod
    def text(self) -> str:
        """The whole text so far (waits for pending appends)."""

    @abc.abstractmethod
    def messages(self) -> list[dict[str, str]]:
        """The role messages so far, as [{"role": ..., "content": ...}]."""

    @abc.abstractmethod
    def get_meta_info(self, name: str) -> Any:
        """Token counts, finish reason, logprobs or scores of variable `name`."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Wait until every append so far has run; raise the program's error if any."""

    @abc.abstractmethod
    def error(self) -> BaseException | None:
        """The program's error after the appends so far have run, or None."""

    @abc.abstractmethod
    def text_iter(self, var: str | None = None) -> Iterator[str]:
        """The text (or variable `var`) in pieces, as they are produced."""

    @abc.abstractmethod
    def text_async_iter(self, var: str | None = None) -> AsyncIterator[str]:
        """`text_iter` for asyncio code: awaits pieces without blocking the event loop."""


def _next_role(node: Node, role: str | None) -> str | None:
    """The open role after `node`; raises ValueError for a nested or unmatched role."""
    if isinstance(node, RoleBegin):
        if node.role not in ROLES:
            raise ValueError(f"unknown role {node.role!r}; roles are {list(ROLES)}")
        if role is not None:
            raise ValueError(
                f"cannot begin a {node.role!r} message while the {role!r} message is open "
                f"(roles do not nest); end it first with lp.{role}_end() or leave its `with` block"
            )
        return node.role
    if isinstance(node, RoleEnd):
        if role is None:
            raise ValueError(f"cannot end a {node.role!r} message: no message is open")
        if role != node.role:
            raise ValueError(f"cannot end a {node.role!r} message: the open message is {role!r}")
        return None
    return role


def _check_concat(
    parent: FrontendState, group: ForkGroup[FrontendState], children: list[FrontendState]
) -> None:
    if parent._open_role != group.open_role:
        raise ValueError(
            f"join(mode='concat_and_append') needs the parent in the same role as at the fork "
            f"({group.open_role!r}), but it is in {parent._open_role!r}"
        )
    for i, child in enumerate(children):
        if child._open_role != group.open_role or child._scopes:
            raise ValueError(
                f"fork copy {i} left a role or var_scope open ({child._open_role!r}, "
                f"{child._scopes}); close it before join(mode='concat_and_append')"
            )
