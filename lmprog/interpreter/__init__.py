"""The lmprog interpreter: runs programs' IR nodes against a backend.

Each state has a worker thread draining its queue of nodes; the program's own thread runs
ahead and blocks only where it reads a value. Forks and batch items run concurrently.
Design: docs/design/frontend.md.
"""

from lmprog.interpreter.defaults import (
    flush_cache,
    get_server_info,
    global_config,
    resolve_backend,
    set_backend_factory,
    set_default_backend,
)
from lmprog.interpreter.function import Function
from lmprog.interpreter.state import ProgramState

__all__ = [
    "Function",
    "ProgramState",
    "flush_cache",
    "get_server_info",
    "global_config",
    "resolve_backend",
    "set_backend_factory",
    "set_default_backend",
]
