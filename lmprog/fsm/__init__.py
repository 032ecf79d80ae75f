"""Constrained decoding: constraints compiled to regexes or grammars, and the token-level
machinery.

``Constraint`` (regex, JSON schema, choices, dtype, EBNF) lives here; the token index, guides, masks and
jump-forward (``TokenIndex``, ``Guide``, ...) are exported lazily when their modules exist, so that
importing the compilers pulls in neither torch nor the token engine (llguidance).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from lmprog.core.errors import ConstraintError
from lmprog.fsm.constraint import Constraint

if TYPE_CHECKING:
    from lmprog.fsm.guide import Guide
    from lmprog.fsm.index import TokenIndex

__all__ = ["Constraint", "ConstraintError", "TokenIndex", "Guide"]

_LAZY = {"TokenIndex": "lmprog.fsm.index", "Guide": "lmprog.fsm.guide"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lmprog.fsm' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise AttributeError(f"lmprog.fsm.{name} is not available ({e})") from e
    globals()[name] = value
    return value
