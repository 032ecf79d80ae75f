"""An object's members in any order (``key_order="any"``). The grammar ``matches`` and
prefilled text are read with; generation writes members in the schema's order (``objects``).

An object of n optional keys has n! orders, so the members are a loop instead, written with
llguidance's parametric rules (``lark.Loop``): one bit of a 64-bit parameter per key that must
not repeat, set as its member is written and tested before it may be written again; the object
may close once the bits of the required keys are all set (and, under min/maxProperties, the
number of bits set is within them). The parser expands a (rule, parameter) pair only when the
text reaches it, so the grammar stays linear in the number of keys. Exact, with no check at
decode time, branch by branch of a union (each branch's loop carries its own parameter)::

    { m_i (sep m_j)* }      m_i = "key_i": value_i, or a key of the additional members

Keyed: the required keys first (bits 0..r-1), then the optional named keys while bits remain.
The others -- optional keys past 64 bits, and the keys of ``additionalProperties``/
``patternProperties`` (regions) -- may be written any number of times: JSON's last member
wins, and each of their values is valid, so a repeated one leaves a valid object (the
canonical order allows the same). Written in canonical order instead (``NotImplemented``):
objects with nothing to reorder, more than 64 required keys, a minProperties/maxProperties
that needs counting beside keys that may repeat, and the ``not``-over-object facets
(``some``, ``some_values``), which ``members`` counts as it goes.
"""

from __future__ import annotations

from types import NotImplementedType

from lmprog.fsm.json_schema.emit.lark import Frag, choice, loop
from lmprog.fsm.json_schema.emit.sequences import Slot
from lmprog.fsm.json_schema.emit.writer import Writer
from lmprog.fsm.json_schema.terms.nodes import ObjT

KEYED = 64  # bits of a parametric rule's parameter


def unordered(
    named: list[tuple[str, Slot]], free: Frag | None, t: ObjT, em: Writer
) -> Frag | None | NotImplementedType:
    """The object ``t`` with its members in any order: ``named`` its keys' members in
    canonical order (Slot.lo 1 = required), ``free`` the members of its other keys (None:
    none). NotImplemented where canonical order is the one written (see the module)."""
    if t.some or t.some_values or len(named) + (free is not None) < 2 or not named:
        return NotImplemented  # type: ignore[no-any-return]  # typeshed types it Any
    required = [slot.item for _, slot in named if slot.lo]
    optional = [slot.item for _, slot in named if not slot.lo]
    if len(required) > KEYED:
        return NotImplemented  # type: ignore[no-any-return]  # typeshed types it Any
    counted = t.min_props > len(required) or (
        t.max_props is not None and (free is not None or len(named) > t.max_props)
    )
    if counted:  # every key keyed: the bits set count the distinct keys
        if free is not None or len(named) > KEYED:
            return NotImplemented  # type: ignore[no-any-return]  # typeshed types it Any
        body = loop(required + optional, None, em.sep, len(required), t.min_props, t.max_props)
    else:
        room = KEYED - len(required)
        rest = choice(free, *optional[room:])
        body = loop(required + optional[:room], rest, em.sep, len(required), 0, None)
    empty_ok = not required and t.min_props == 0
    return em.container("{", body, empty_ok, "}")
