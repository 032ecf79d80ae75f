"""Typed generations: ``dtype=int|float|bool|str`` as regexes and parsers.

* ``int``: ``-?(0|[1-9][0-9]*)`` -> ``int``;
* ``float``: a JSON number (optional fraction and exponent) -> ``float``;
* ``bool``: ``true|false|True|False`` -> ``bool``;
* ``str``: a JSON double-quoted string with every JSON escape -> the unquoted ``str``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.numbers import INTEGER, NUMBER
from lmprog.fsm.json_schema.strings import UNIT_TOKEN


@dataclass(frozen=True)
class DType:
    name: str
    pattern: str
    parse: Callable[[str], object]


def _parse_bool(text: str) -> bool:
    return text.lower() == "true"


DTYPES = {
    "int": DType("int", INTEGER, int),
    "float": DType("float", NUMBER, float),
    "bool": DType("bool", "true|false|True|False", _parse_bool),
    "str": DType("str", f'"{UNIT_TOKEN.text}*"', json.loads),
}


def resolve_dtype(dtype) -> DType:
    """The DType of ``int``/``float``/``bool``/``str`` (the types or their names)."""
    name = dtype.__name__ if isinstance(dtype, type) else dtype
    if not isinstance(name, str) or name not in DTYPES:
        raise ConstraintError(f"unsupported dtype {dtype!r}: use int, float, bool or str")
    return DTYPES[name]
