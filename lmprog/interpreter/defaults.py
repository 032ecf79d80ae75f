"""The backend a run uses when none is passed.

The interpreter knows backends only through the `Backend` protocol, so it cannot pick a
concrete one itself: the `lmprog` facade registers a factory (`set_backend_factory`) that
builds `lmprog.backends.default_backend()` on first use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

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


class GlobalConfig:
    """Process-wide settings, under SGLang's name: `lp.global_config`.

        lp.global_config.default_backend              the default backend (None before one
                                                      is set or first built by a run)
        lp.global_config.default_backend = backend    the same as lp.set_default_backend(backend)

    SGLang programs read `global_config.default_backend.token_usage` after a run. Other
    attributes raise AttributeError: lmprog has no other process-wide knob.
    """

    __slots__ = ()

    @property
    def default_backend(self) -> Backend | None:
        return current_default_backend()

    @default_backend.setter
    def default_backend(self, backend: Backend | None) -> None:
        set_default_backend(backend)

    def __setattr__(self, name: str, value: object) -> None:
        if name != "default_backend":
            raise AttributeError(
                f"lp.global_config has no setting {name!r}; the one setting is default_backend"
            )
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"GlobalConfig(default_backend={current_default_backend()!r})"


global_config = GlobalConfig()
