r"""Typed generations: ``dtype=int|float|bool|str`` as regexes and parsers.

SGLang's patterns (``sglang.lang.ir``): ``int`` ``[-+]?[0-9]+``, ``float``
``[-+]?[0-9]*\.?[0-9]+``, ``bool`` ``True|False``, ``str`` ``"[\w\d\s]*"`` (parsed to the
``str`` between the quotes). A number ends where the model writes one of its ``terminators``
(a space, a newline, punctuation), which a gen adds as stop strings, instead of SGLang's
``[ \n]*``. Design: docs/design/constraints.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from lmprog.core.errors import ConstraintError


@dataclass(frozen=True)
class DType:
    name: str
    pattern: str
    parse: Callable[[str], object]
    terminators: tuple[str, ...] = ()


def _parse_bool(text: str) -> bool:
    return text == "True"


_INT_END = (" ", "\n", ",", ".", ";", ")", "]", "}")
_FLOAT_END = (" ", "\n", ",", ";", ")", "]", "}")  # "." continues a float

# SGLang's patterns (sglang.lang.ir), their trailing [ \n]* left to the terminators
INT = r"[-+]?[0-9]+"
FLOAT = r"[-+]?[0-9]*\.?[0-9]+"
BOOL = r"True|False"
STR = r'"[\x09-\x0d 0-9A-Z_a-z]*"'  # "[\w\d\s]*" as lmprog's regexes read it (ASCII)


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
    "int": _number("int", INT, int, _INT_END),
    "float": _number("float", FLOAT, float, _FLOAT_END),
    "bool": DType("bool", BOOL, _parse_bool),
    "str": DType("str", STR, lambda text: text[1:-1]),  # no escapes: the text between quotes
}


def resolve_dtype(dtype: object) -> DType:
    """The DType of ``int``/``float``/``bool``/``str`` (the types or their names)."""
    name = dtype.__name__ if isinstance(dtype, type) else dtype
    if not isinstance(name, str) or name not in DTYPES:
        raise ConstraintError(f"unsupported dtype {dtype!r}: use int, float, bool or str")
    return DTYPES[name]
