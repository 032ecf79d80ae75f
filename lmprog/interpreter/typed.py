"""`state.parsed(name, as_type)`: the parsed value checked against the type its caller names.

A variable's name says nothing of its type to a type checker; the type passed beside it
does (`parsed`'s overloads return it), so it is checked here, at run time, where the value
is: a plain class by `isinstance`, any other type (`list[Model]`, `Literal[...]`, a union)
by pydantic's strict validation, which converts nothing.
"""

from __future__ import annotations

import typing
from typing import Any


def checked_type(value: Any, as_type: Any, where: str) -> Any:
    """`value` if it is of `as_type`; else TypeError naming `where`, both types and the value."""
    if typing.get_origin(as_type) is None and isinstance(as_type, type):
        if isinstance(value, as_type):
            return value
    else:
        import pydantic  # lazy: only a generic as_type needs it

        try:
            adapter = pydantic.TypeAdapter(as_type)
        except pydantic.PydanticUserError:  # not a type pydantic reads
            raise TypeError(f"{where}: as_type must be a type, got {as_type!r}") from None
        try:
            adapter.validate_python(value, strict=True)
            return value
        except pydantic.ValidationError:
            pass
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise TypeError(
        f"{where} is a {type(value).__name__} ({shown}), not {_name(as_type)}: pass the type "
        "the gen was given (json_schema=... or dtype=...)"
    )


def _name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) and typing.get_origin(tp) is None else repr(tp)
