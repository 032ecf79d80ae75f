"""Typed generations: ``dtype=int|float|bool|str`` as regexes and parsers.

* ``int``: ``-?(0|[1-9][0-9]*)`` -> ``int``;
* ``float``: a JSON number (optional fraction and exponent) -> ``float``;

a number may end with one space or newline, its ``terminators``: as in SGLang (whose typed
numbers are ``[0-9]+[ \n]*`` with stop strings " " and "\n"), a model that wants to go on
with a word after the number ends it there instead of being forced to write more digits; a
gen adds the terminators as stop strings, so they are not part of the text;
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
    terminators: tuple[str, ...] = ()


def _parse_bool(text: str) -> bool:
    return text.lower() == "true"


_NUMBER_END = (" ", "\n")


def _number(name: str, pattern: str, parse: Callable[[str], object]) -> DType:
    return DType(name, f"(?:{pattern})[ \n]?", lambda text: parse(text.rstrip(" \n")), _NUMBER_END)


DTYPES = {
    "int": _number("int", INTEGER, int),
    "float": _number("float", NUMBER, float),
    "bool": DType("bool", "true|false|True|False", _parse_bool),
    "str": DType("str", f'"{UNIT_TOKEN.text}*"', json.loads),
}


def resolve_dtype(dtype) -> DType:
    """The DType of ``int``/``float``/``bool``/``str`` (the types or their names)."""
    name = dtype.__name__ if isinstance(dtype, type) else dtype
    if not isinstance(name, str) or name not in DTYPES:
        raise ConstraintError(f"unsupported dtype {dtype!r}: use int, float, bool or str")
    return DTYPES[name]
