"""Strict generation: what a schema lists, and nothing it merely leaves open.

With ``strict=True`` (``Constraint.from_json_schema``'s default) an object whose schema lists
its keys gets no other key unless a keyword governs them, and ``prefixItems`` without
``items`` gets no further item: each term is a subset of the spec's values, so every generated
text is still valid; ``{"type": "object"}`` stays any object. What is closed and what stays
open: docs/design/json-schema.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import overload

from lmprog.fsm.json_schema.terms.algebra import normalize_arr, normalize_obj
from lmprog.fsm.json_schema.terms.nodes import NEVER, ArrT, KeyRule, ObjT


@overload
def generated(t: ObjT) -> ObjT: ...
@overload
def generated(t: ArrT) -> ArrT: ...
def generated(t: ArrT | ObjT) -> ArrT | ObjT:
    """The term as strict generation writes it (``t`` itself when nothing is left open)."""
    if isinstance(t, ObjT):
        return _object(t)
    if isinstance(t, ArrT):
        return _array(t)
    return t


def _object(t: ObjT) -> ObjT:
    if not t.listed or t.eval_all or t.eval_patterns or not t.names.top:
        return t  # free-form, or a keyword says what other keys may be
    closed = normalize_obj(replace(t, rules=t.rules + (KeyRule((), NEVER),)))
    return t if closed is None else closed


def _array(t: ArrT) -> ArrT:
    if not t.prefix or t.eval_all or t.rest.never:
        return t
    closed = normalize_arr(replace(t, rest=NEVER))
    return t if closed is None else closed
