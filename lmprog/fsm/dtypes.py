"""Typed generations: ``dtype=int|float|bool|str`` as regexes and parsers.

* ``int``: ``-?(0|[1-9][0-9]*)`` -> ``int``;
* ``float``: a JSON number (optional fraction and exponent) -> ``float``;

a number ends where the model writes one of its ``terminators`` (a space, a newline or the
punctuation that follows a number in prose and JSON), followed by anything in the same token:
as in SGLang (whose typed numbers are ``[0-9]+[ \n]*`` with stop strings " " and "\n"), a model
that wants to go on after the number (" hours", ".\n", ",") ends it there instead of being
forced to write more digits; a gen adds the terminators as stop strings, so neither they nor
what follows them are part of the text;
* ``bool``: ``true|false|True|False`` -> ``bool``;
* ``str``: a JSON double-quoted string with every JSON escape -> the unquoted ``str``.
"""

from __future__ import annotations

import json
import re
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


_INT_END = (" ", "\n", ",", ".", ";", ")", "]", "}")
_FLOAT_END = (" ", "\n", ",", ";", ")", "]", "}")  # "." continues a float


def _number(
    name: str, pattern: str, parse: Callable[[str], object], ends: tuple[str, ...]
) -> DType:
    end_class = "".join("\\" + c if c in "]\\^-" else c for c in ends).replace("\n", "\\n")
    return DType(
        name,
        f"(?:{pattern})(?:[{end_class}][\\s\\S]*)?",
        lambda text: parse(re.split(f"[{re.escape(''.join(ends))}]", text, maxsplit=1)[0]),
        ends,
    )


DTYPES = {
    "int": _number("int", INTEGER, int, _INT_END),
    "float": _number("float", NUMBER, float, _FLOAT_END),
    "bool": DType("bool", "true|false|True|False", _parse_bool),
    "str": DType("str", f'"{UNIT_TOKEN.text}*"', json.loads),
}


def resolve_dtype(dtype) -> DType:
    """The DType of ``int``/``float``/``bool``/``str`` (the types or their names)."""
    name = dtype.__name__ if isinstance(dtype, type) else dtype
    if not isinstance(name, str) or name not in DTYPES:
        raise ConstraintError(f"unsupported dtype {dtype!r}: use int, float, bool or str")
    return DTYPES[name]
