"""How long one constraint's compile may take, and whether its caller still wants it.

    with compile_deadline(30.0, cancelled=event):   # the server: a request's limit and flag
        Constraint.from_json_schema(schema)
    tick()                                          # the compilers, where they count work

Past the deadline the compile raises ConstraintError; with the flag set, `CompileAbandoned`.
Outside any `compile_deadline`, `Constraint`'s constructors take `DEFAULT_COMPILE_S`.
Design: docs/design/constraints.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from lmprog.core.errors import ConstraintError

DEFAULT_COMPILE_S = 30.0
_EVERY = 256  # ticks between two reads of the clock


class CompileAbandoned(ConstraintError):
    """The compile's caller no longer waits for it (its flag was set)."""


class CompileTimeout(ConstraintError):
    """The compile ran past its deadline."""


class _Deadline:
    __slots__ = ("at", "seconds", "cancelled", "count")

    def __init__(self, seconds: float, cancelled: threading.Event | None) -> None:
        self.seconds, self.cancelled, self.count = seconds, cancelled, 0
        self.at = time.monotonic() + seconds


_CURRENT: ContextVar[_Deadline | None] = ContextVar("lmprog_compile_deadline", default=None)


@contextmanager
def compile_deadline(
    seconds: float | None = None, cancelled: threading.Event | None = None
) -> Iterator[None]:
    """Within the block, compiles stop past `seconds` (None: DEFAULT_COMPILE_S) or once
    `cancelled` is set. An enclosing deadline stays in force if it is sooner."""
    outer = _CURRENT.get()
    inner = _Deadline(DEFAULT_COMPILE_S if seconds is None else seconds, cancelled)
    if outer is not None and outer.at <= inner.at and cancelled is None:
        yield
        return
    token = _CURRENT.set(inner)
    try:
        yield
    finally:
        _CURRENT.reset(token)


@contextmanager
def default_deadline() -> Iterator[None]:
    """DEFAULT_COMPILE_S, unless a caller set a deadline already (the constructors' own)."""
    if _CURRENT.get() is not None:
        yield
        return
    with compile_deadline(DEFAULT_COMPILE_S):
        yield


def tick() -> None:
    """Count one unit of compile work; every 256th, check the deadline and the flag."""
    current = _CURRENT.get()
    if current is None:
        return
    current.count += 1
    if current.count % _EVERY:
        return
    if current.cancelled is not None and current.cancelled.is_set():
        raise CompileAbandoned("the compile was abandoned: its caller no longer waits for it")
    if time.monotonic() > current.at:
        raise CompileTimeout(
            f"compiling the constraint took longer than {current.seconds:g} s "
            "(lmprog.fsm.deadline; lmprog serve --constraint-timeout): simplify it (fewer "
            "values, nested or repeated parts, smaller bounds)"
        )
