"""An object's members in any order (``key_order="any"``). The grammar ``matches`` and
prefilled text are read with; generation writes members in the schema's order (``objects``).

The members are a loop of llguidance's parametric rules (``lark.Loop``): one bit of a 64-bit
parameter per key that must not repeat, so the grammar stays linear in the number of keys.
What is written in canonical order instead: docs/design/json-schema.md.
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
