"""Strict generation: what a schema lists, and nothing it merely leaves open.

JSON Schema leaves an object open unless it says otherwise: ``{"properties": {"name": ...}}``
also accepts ``{"name": "Ava", "gender": ..., "skills": [...]}``, so a model under its exact
grammar may invent keys until max_tokens. Users of structured output expect the keys they
listed (xgrammar's ``strict_mode``, SGLang's and vLLM's default; Outlines; OpenAI's
``strict``). With ``strict=True`` (``Constraint.from_json_schema``'s default) the grammar is
written from the terms below instead of the spec's, each a subset of the spec's values, so
every generated text is still valid under the schema:

* an object whose schema lists its keys (``properties`` or ``required``, even empty) gets no
  other key, as if ``additionalProperties: false``, unless a keyword governs the other keys:
  ``additionalProperties`` (``true`` or a schema keeps them; ``false`` closes anyway),
  ``patternProperties``, ``unevaluatedProperties`` or ``propertyNames``, in this schema or in
  one ``allOf``/``$ref`` combines with it. Listed keys of every part combine: ``allOf`` of
  ``{"properties": {"a": ...}}`` and ``{"properties": {"b": ...}}`` writes a and b;
* an array with ``prefixItems`` (draft 7: ``items`` as a list) and no ``items`` (nor
  ``additionalItems``/``unevaluatedItems``) gets no item past the prefix;
* where closing would leave the object or array with no value (``minProperties`` beyond the
  listed keys, ``contains`` past the prefix, ``not`` asking for another key), it stays open.

Unchanged: a bare ``{"type": "object"}`` or ``{"type": "array"}`` (free-form: any keys, any
items, as JSON mode and ``dict[str, Any]`` mean), ``{}``/``true`` (any value), an ``items``
schema (a list of any length), ``required`` and optional keys, and every other keyword.
``strict=False`` is the spec's reading, for validation and conformance measurements.
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
