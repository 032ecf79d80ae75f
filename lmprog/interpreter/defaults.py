"""The backend a run uses when none is passed.

The interpreter knows backends only through the `Backend` protocol, so it cannot pick a
concrete one itself: the `lmprog` facade registers a factory (`set_backend_factory`) that
builds `lmprog.backends.default_backend()` on first use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from lmprog.core.errors import BackendError
from lmprog.core.protocol import Backend

_lock = threading.Lock()
_backend: Backend | None = None
_factory: Callable[[], Backend] | None = None


def set_default_backend(backend: Backend | None) -> None:
    """Use `backend` for every run that does not pass `backend=` (None: forget it)."""
    global _backend
    if backend is not None and not isinstance(backend, Backend):
        raise TypeError(
            f"set_default_backend() takes an lmprog backend, got {type(backend).__name__}"
        )
    with _lock:
        _backend = backend


def set_backend_factory(factory: Callable[[], Backend] | None) -> None:
    """How to build a default backend when none was set (wired by the `lmprog` facade)."""
    global _factory
    with _lock:
        _factory = factory


def resolve_backend(backend: Backend | None) -> Backend:
    """`backend` if given, else the default one (built by the factory on first use)."""
    global _backend
    if backend is not None:
        if not isinstance(backend, Backend):
            raise TypeError(
                f"backend must be an lmprog backend (lp.LlamaCpp(), lp.Runtime(), ...), got {type(backend).__name__}"
            )
        return backend
    with _lock:
        if _backend is None:
            if _factory is None:
                raise BackendError("no backend: call lp.set_default_backend(...) or pass backend=")
            built = _factory()
            if not isinstance(built, Backend):
                raise BackendError(
                    f"the default backend factory returned {type(built).__name__}, not a Backend"
                )
            _backend = built
        return _backend


def current_default_backend() -> Backend | None:
    """The default backend if one was set or built already (never builds one)."""
    with _lock:
        return _backend


def flush_cache(backend: Backend | None = None) -> bool:
    """Empty `backend`'s prefix cache (default: the default backend): SGLang's
    `sgl.flush_cache()`. False when there is no backend or it emptied nothing (see
    `Backend.flush_cache`)."""
    backend = backend if backend is not None else current_default_backend()
    return False if backend is None else bool(backend.flush_cache())


def get_server_info(backend: Backend | None = None) -> dict[str, Any] | None:
    """`backend.get_server_info()` (default: the default backend; None without one):
    SGLang's `sgl.get_server_info()`."""
    backend = backend if backend is not None else current_default_backend()
    return None if backend is None else backend.get_server_info()


# SGLang's global_config flags a program may set: name -> (default, what it may be set to).
_FLAGS: dict[str, tuple[object, Callable[[object], bool], str]] = {
    "verbosity": (0, lambda v: isinstance(v, int) and not isinstance(v, bool), "an int"),
    "enable_precache_with_tracing": (True, lambda v: isinstance(v, bool), "a bool"),
    "enable_parallel_encoding": (True, lambda v: isinstance(v, bool), "a bool"),
    "skip_special_tokens_in_output": (
        True,
        lambda v: v is True,
        "True (lmprog's outputs never hold special tokens' text)",
    ),
    "spaces_between_special_tokens_in_out": (True, lambda v: v is True, "True"),
}


class GlobalConfig:
    """Process-wide settings, under SGLang's names: `lp.global_config`.

        lp.global_config.default_backend              the default backend (None before one
                                                      is set or first built by a run)
        lp.global_config.default_backend = backend    the same as lp.set_default_backend(backend)
        lp.global_config.verbosity = 2                print each run's text when it ends
        lp.global_config.enable_precache_with_tracing = False
                                                      run_batch caches no traced prefix first
        lp.global_config.enable_parallel_encoding     accepted (a bool); concat_and_append
                                                      always appends the copies' text
        lp.global_config.skip_special_tokens_in_output, .spaces_between_special_tokens_in_out
                                                      True, the only value lmprog has

    SGLang programs read `global_config.default_backend.token_usage` after a run. Other
    names raise AttributeError, and a value a flag cannot take raises ValueError.
    """

    __slots__ = ("_flags",)
    _flags: dict[str, object]
    # _FLAGS's settings, as a program reads them (`__getattr__` answers them)
    verbosity: int
    enable_precache_with_tracing: bool
    enable_parallel_encoding: bool
    skip_special_tokens_in_output: bool
    spaces_between_special_tokens_in_out: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_flags", {k: v[0] for k, v in _FLAGS.items()})

    @property
    def default_backend(self) -> Backend | None:
        return current_default_backend()

    @default_backend.setter
    def default_backend(self, backend: Backend | None) -> None:
        set_default_backend(backend)

    def __getattr__(self, name: str) -> object:
        flags = object.__getattribute__(self, "_flags")
        if name in flags:
            return flags[name]
        raise AttributeError(f"lp.global_config has no setting {name!r}; {_known()}")

    def __setattr__(self, name: str, value: object) -> None:
        if name == "default_backend":
            object.__setattr__(self, name, value)
            return
        if name not in _FLAGS:
            raise AttributeError(f"lp.global_config has no setting {name!r}; {_known()}")
        _, accepts, what = _FLAGS[name]
        if not accepts(value):
            raise ValueError(f"lp.global_config.{name} must be {what}, got {value!r}")
        self._flags[name] = value

    def __repr__(self) -> str:
        flags = ", ".join(f"{k}={v!r}" for k, v in self._flags.items())
        return f"GlobalConfig(default_backend={current_default_backend()!r}, {flags})"


def _known() -> str:
    return f"the settings are default_backend, {', '.join(_FLAGS)}"


global_config = GlobalConfig()
