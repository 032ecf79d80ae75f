"""Backends: one protocol (`lmprog.core.protocol.Backend`), several engines: LlamaCpp,
Runtime, OpenAI, RuntimeEndpoint, Fleet; default_backend() is Runtime on a CUDA machine,
else LlamaCpp (memoized).

Engines are imported lazily, on first use of their name: `import lmprog` stays cheap and
needs neither llama-cpp-python nor torch. Options by example: docs/getting_started.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmprog.backends.llamacpp import LlamaCpp
    from lmprog.core.protocol import Backend

__all__ = ["LlamaCpp", "OpenAI", "Runtime", "RuntimeEndpoint", "default_backend"]

# name -> (module, attribute); the module is imported when the name is first used.
_ENGINES = {
    "LlamaCpp": ("lmprog.backends.llamacpp", "LlamaCpp"),
    "Runtime": ("lmprog.backends.runtime", "Runtime"),
    "OpenAI": ("lmprog.backends.openai", "OpenAI"),
    "RuntimeEndpoint": ("lmprog.backends.sglang_endpoint", "RuntimeEndpoint"),
}

_default: list[Backend] = []
_default_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    if name not in _ENGINES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attr = _ENGINES[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise ImportError(
            f"lmprog.{name} is not available in this version of lmprog ({module_name} is missing); "
            "use lmprog.LlamaCpp() for CPU inference"
        ) from None
    value = getattr(module, attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def default_backend() -> Backend:
    """The process-wide default backend, created on first call (thread-safe).

    On a machine with a CUDA GPU and the in-process runtime available: `Runtime()`;
    otherwise `LlamaCpp()` on the default model. A default that was shut down is replaced.
    """
    with _default_lock:
        if not _default or getattr(_default[0], "closed", False):
            _default[:] = [_make_default()]
        return _default[0]


def _make_default() -> Backend:
    if _cuda_available() and importlib.util.find_spec("lmprog.backends.runtime") is not None:
        return __getattr__("Runtime")()
    return __getattr__("LlamaCpp")()


def _cuda_available() -> bool:
    if "torch" not in sys.modules:
        spec = importlib.util.find_spec("torch")
        if spec is None or not _gpu_build(spec.origin):
            return False  # told without importing torch (1 s or more) for the default backend
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _gpu_build(torch_init: str | None) -> bool:
    """Whether the installed torch was built for CUDA or ROCm, read from its version.py
    (`cuda`/`hip` None in a CPU-only build); True when it cannot tell."""
    try:
        text = (Path(torch_init).parent / "version.py").read_text(encoding="utf-8")
    except (OSError, TypeError):
        return True
    cpu_only = all(
        re.search(rf"^{name}\s*(:[^=\n]*)?=\s*None\s*$", text, re.MULTILINE)
        for name in ("cuda", "hip")
    )
    return not cpu_only
