"""Limits on what one DSL call may ask for: each a documented default, changed with
`lp.set_limits(...)` (process-wide) and read with `lp.get_limits()`.

    lp.set_limits(max_stop=128)      # gen(stop=[...]) may then list 128 strings

A call over a limit raises ValueError at the call, naming the limit. The server has its own
(`lmprog serve --max-stop ...`, lmprog.serve.limits.ServerLimits). A prompt's length is
bounded by the model's context (ContextLengthError, a ValueError, from the gen).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Limits:
    """max_stop: stop strings of one gen (`stop=[...]`); max_stop_chars: characters of one
    stop string; max_fork: copies of one `fork(n)`; max_choices: choices of one `select`."""

    max_stop: int = 64
    max_stop_chars: int = 1024
    max_fork: int = 1024
    max_choices: int = 10_000

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"limit {f.name} must be an int >= 1, got {value!r}")


_lock = threading.Lock()
_limits = Limits()


def get_limits() -> Limits:
    """The limits in force (see `Limits` for each one's meaning and default)."""
    return _limits


def set_limits(**changes: Any) -> Limits:
    """Change some limits for the whole process (`lp.set_limits(max_stop=128)`); returns the
    new limits. Unknown names raise TypeError."""
    global _limits
    names = {f.name for f in dataclasses.fields(Limits)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise TypeError(f"unknown limit(s) {unknown}; the limits are {sorted(names)}")
    with _lock:
        _limits = dataclasses.replace(_limits, **changes)
        return _limits


def over_limit(what: str, got: int, name: str) -> ValueError:
    """The ValueError of a call over the limit `name`."""
    limit = getattr(_limits, name)
    return ValueError(
        f"{what}: {got} is over the limit {name}={limit}; raise it with "
        f"lp.set_limits({name}=...) if you mean it"
    )


def check_stop_limits(stop: tuple[str, ...], call: str) -> None:
    """ValueError if `stop` (of a `call` such as "gen" or "run") is over max_stop or
    max_stop_chars."""
    limits = _limits
    if len(stop) > limits.max_stop:
        raise over_limit(f"{call}(stop=[...]) lists too many stop strings", len(stop), "max_stop")
    for s in stop:
        if len(s) > limits.max_stop_chars:
            raise over_limit(
                f"{call}(stop=...) has a stop string of {len(s)} characters ({s[:20]!r}...)",
                len(s),
                "max_stop_chars",
            )
