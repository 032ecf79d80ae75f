"""JSON Schema to a grammar: lmprog's own compiler.

    lark = build_grammar(schema, whitespace=None, strict=True, key_order="schema")

A text the grammar accepts is always a valid instance; a valid instance is accepted in
lmprog's canonical shape (declared key order, bounded whitespace, canonical numbers and
strings), and a schema whose valid set cannot be written exactly raises ``ConstraintError``
naming the keyword and the JSON path. Stages: ``read`` (documents to nodes), ``terms`` (the
intermediate form), ``emit`` (the grammar). The canonical shape, the keywords read and what
is refused: docs/design/json-schema.md.
"""

from __future__ import annotations

import hashlib
import json
import sys
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.emit.emitter import Emitter
from lmprog.fsm.json_schema.emit.lark import derives_text, fragment_limit, to_lark
from lmprog.fsm.json_schema.emit.strings import LITERALS, read_spellings
from lmprog.fsm.json_schema.read.builder import Builder
from lmprog.fsm.json_schema.read.drafts import upgrade
from lmprog.fsm.json_schema.read.refs import Registry
from lmprog.fsm.json_schema.terms.lengths import counted_apart
from lmprog.fsm.json_schema.terms.nodes import Unroll, work_limit
from lmprog.fsm.regex import Chars, Concat, R, Repeat, compile_user_regex, parse_regex, raw
from lmprog.fsm.regex.charset import CharSet
from lmprog.fsm.regex.fragments import pattern_limit

if TYPE_CHECKING:
    from pydantic import TypeAdapter

    from lmprog.fsm.checks import JsonChecks

# A schema document: a JSON object or a boolean, as json.loads reads it.
Document: TypeAlias = "dict[str, Any] | bool"

DEFAULT_WHITESPACE = r"[ ]?"
DEFAULT_RECURSION_DEPTH = 3
DEFAULT_ANY_DEPTH = None  # unbounded: "any value" is a recursive rule
# Bounds on the work one schema can ask for: the nesting of the schema document (dicts and
# lists), and the length of the regex it becomes (which can grow exponentially with nesting)
DEFAULT_MAX_SCHEMA_DEPTH = 128
DEFAULT_MAX_PATTERN_CHARS = 1_000_000
# Work units (schema objects built, term pairs met) one compile may spend: the largest real
# schemas measured take under a tenth of it (docs/benchmarks.md), it runs out in well under
# a second of CPU
MAX_WORK = 15_000
KEY_ORDERS = ("schema", "any")

__all__ = [
    "NoValue",
    "build_grammar",
    "load_schema",
    "python_type",
    "DEFAULT_WHITESPACE",
    "DEFAULT_RECURSION_DEPTH",
    "DEFAULT_ANY_DEPTH",
    "DEFAULT_MAX_SCHEMA_DEPTH",
    "DEFAULT_MAX_PATTERN_CHARS",
    "LITERALS",
]


def load_schema(schema: object) -> object:  # (json.loads: any JSON value, checked later)
    """A schema document (dict or bool) from a dict, a JSON string, a pydantic model class or a
    Python type pydantic describes (``python_type``)."""
    if isinstance(schema, (dict, bool)):
        return schema
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"json_schema string is not valid JSON: {e}") from None
        except RecursionError:
            raise ConstraintError("json_schema string nests too deeply to parse") from None
    if python_type(schema) is None:
        raise TypeError(
            "json_schema must be a dict, a JSON string, a pydantic model class or a Python type "
            f"(Literal[...], list[int], a dataclass, an Enum...), got {type(schema).__name__}"
        )
    try:
        if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            return schema.model_json_schema()
        return _type_schema(schema)
    except RecursionError:
        raise ConstraintError(
            f"the type {_type_name(schema)} nests too deeply for a JSON schema"
        ) from None


def python_type(schema: object) -> object | None:
    """``schema`` if it is a Python type form (a class: pydantic model, dataclass, TypedDict,
    Enum, int...; or a typing form: ``Literal[...]``, ``list[int]``, ``dict[str, int]``,
    ``Optional[...]``, ``X | Y``); else None. Its values parse back as that type."""
    if isinstance(schema, type) or typing.get_origin(schema) is not None:
        return schema
    return None


def type_adapter(tp: Any) -> TypeAdapter[Any]:
    """pydantic's TypeAdapter of a Python type form: what writes its JSON schema and parses a
    generated text back (a ``typing.TypedDict``, which pydantic takes only from Python 3.12,
    read as the same ``typing_extensions.TypedDict``)."""
    from pydantic import TypeAdapter

    return TypeAdapter(_portable(tp))


def _portable(tp: Any) -> Any:
    """``tp`` with every ``typing.TypedDict`` in it (nested in lists, dicts, unions, other
    TypedDicts) rebuilt as a ``typing_extensions.TypedDict`` of the same keys, types and
    required keys; other forms unchanged."""
    if sys.version_info >= (3, 12):
        return tp
    if typing.is_typeddict(tp) and type(tp).__module__ == "typing":
        return _typeddict(tp)
    args = typing.get_args(tp)
    origin: Any = typing.get_origin(tp)
    if not args or origin is None or origin is typing.Literal:
        return tp
    new = tuple(_portable(a) for a in args)
    if new == args:
        return tp
    if origin is typing.Annotated:
        annotated = (new[0], *tp.__metadata__)
        return typing.Annotated[annotated]
    if origin in (typing.Union, types.UnionType):
        return typing.Union[new]  # noqa: UP007 - a tuple of arguments: no | form
    if isinstance(origin, type):  # a generic class: list, dict, tuple, ...
        return origin[new]  # type: ignore[index]  # a builtin generic subscripts at run time
    return tp.copy_with(new)


_PORTED: dict[type, type] = {}
_PORTING: set[type] = set()  # being read: a type met again inside is recursive


def _typeddict(tp: Any) -> Any:
    found = _PORTED.get(tp)
    if found is None:
        import typing_extensions as te

        refused = ConstraintError(
            f"json_schema={tp.__name__}: on Python < 3.12 a typing.TypedDict that refers to "
            "itself or to a local type cannot be read; declare it with typing_extensions.TypedDict"
        )
        if tp in _PORTING:
            raise refused
        _PORTING.add(tp)
        try:
            hints = typing.get_type_hints(tp, include_extras=True)
            fields = {
                k: (te.Required if k in tp.__required_keys__ else te.NotRequired)[_portable(v)]
                for k, v in hints.items()
            }
        except NameError:  # a key's type is a name it cannot see
            raise refused from None
        finally:
            _PORTING.discard(tp)
        found = _PORTED[tp] = te.TypedDict(tp.__name__, fields)  # type: ignore[operator]  # fields known at run time only
        found.__module__, found.__qualname__ = tp.__module__, tp.__qualname__
    return found


def _type_schema(tp: Any) -> dict[str, Any]:
    """The JSON schema pydantic writes for ``tp`` (what it validates, so a generated text
    parses back as ``tp``)."""
    from pydantic import PydanticUserError

    try:
        return type_adapter(tp).json_schema()
    except PydanticUserError as e:  # includes PydanticSchemaGenerationError
        raise ConstraintError(
            f"json_schema={_type_name(tp)}: pydantic cannot describe this type as a JSON "
            f"schema: {str(e).splitlines()[0]}"
        ) from None


def _type_name(tp: object) -> str:
    return tp.__name__ if isinstance(tp, type) else repr(tp)


def _nesting(document: object, limit: int) -> int:
    """Depth of dict/list nesting of a JSON document, counted up to limit + 1 (iterative)."""
    deepest, stack = 0, [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth > limit:
                return depth
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return deepest


def build_grammar(
    schema: object,
    *,
    whitespace: str | None = None,
    max_recursion_depth: int = DEFAULT_RECURSION_DEPTH,
    any_depth: int | None = DEFAULT_ANY_DEPTH,
    max_schema_depth: int = DEFAULT_MAX_SCHEMA_DEPTH,
    max_pattern_chars: int = DEFAULT_MAX_PATTERN_CHARS,
    strict: bool = True,
    count_lengths: bool = True,
    key_order: str = "schema",
    read_spellings: bool | str = False,
) -> Grammar:
    """The grammar of a JSON schema document (Lark text, and the check of distinct items
    where the schema asks for them over open sets); ConstraintError if it has none that is
    exact, if the document nests deeper than `max_schema_depth` dicts and lists, or if its
    grammar (or one of its lexemes' regexes) would grow past `max_pattern_chars` characters.
    `strict`: objects and tuples get only what the schema lists (``strict``); False: the
    spec's reading (objects open unless the schema closes them). `count_lengths`: leave the
    maxLength of some strings to the check (``lengths``); False: every length in the lexemes
    (a grammar that runs without its check, such as a part of a composed one). `key_order`:
    "schema" writes each object's members in canonical order (``objects``), "any" in every
    order (``unordered``). `read_spellings`: True: the strings of patterns, formats, enum/const
    values and keys in every JSON spelling (escapes, surrogate pairs) and integers also
    written ``2.0``/``1e2``, as ``Constraint.spelled`` takes them; ``"literals"``: the same
    but for the characters of patterns with a repetition and of formats, kept canonical
    (``Constraint.reading``, read over a model's tokens); False: in canonical spelling."""
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool, got {type(strict).__name__}")
    if key_order not in KEY_ORDERS:
        raise ValueError(f"key_order must be one of {KEY_ORDERS}, got {key_order!r}")
    if not (isinstance(read_spellings, bool) or read_spellings == LITERALS):
        raise TypeError(f"read_spellings must be a bool or {LITERALS!r}, got {read_spellings!r}")
    for name, value, least in (
        ("max_recursion_depth", max_recursion_depth, 0),
        ("any_depth", 0 if any_depth is None else any_depth, 0),
        ("max_schema_depth", max_schema_depth, 1),
        ("max_pattern_chars", max_pattern_chars, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    ws = raw(DEFAULT_WHITESPACE) if whitespace is None else _whitespace(whitespace)
    document = upgrade(load_schema(schema))
    depth = _nesting(document, max_schema_depth)
    if depth > max_schema_depth:
        raise ConstraintError(
            f"the schema nests more than max_schema_depth={max_schema_depth} levels of objects "
            "and arrays; flatten it or raise max_schema_depth"
        )
    try:
        registry = Registry(document)
        try:
            grammar = _grammar(
                document,
                ws,
                max_recursion_depth,
                any_depth,
                max_pattern_chars,
                registry,
                strict,
                count_lengths,
                key_order,
                read_spellings,
            )
        except Unroll:  # recursion under allOf/not/unevaluated*: unrolled to a bounded depth
            grammar = _unrolled(
                lambda depth: _grammar(
                    document,
                    ws,
                    depth,
                    any_depth,
                    max_pattern_chars,
                    registry,
                    strict,
                    count_lengths,
                    key_order,
                    read_spellings,
                    unroll=True,
                ),
                max_recursion_depth,
            )
    except RecursionError:
        raise ConstraintError(
            "the schema (with its $refs unrolled) nests too deeply to compile; flatten it or "
            "lower max_recursion_depth"
        ) from None
    if len(grammar.lark) > max_pattern_chars:
        raise ConstraintError(
            f"the schema's grammar has {len(grammar.lark):,} characters, past "
            f"max_pattern_chars={max_pattern_chars:,}; simplify the schema or raise "
            "max_pattern_chars"
        )
    return grammar


class NoValue(ConstraintError):
    """The schema accepts no JSON value at all (``false``, ``{"not": {}}``, an ``allOf`` of
    disjoint types...): exactly, not a bound the compiler gave up at."""


class _TooShallow(Exception):
    """An unrolled schema has no value within its recursion bound, but was cut there."""


MAX_UNROLL_DEPTH = 24  # how deep an unrolled schema that needs it is unrolled at most


def _unrolled(compile_at: Callable[[int], Grammar], depth: int) -> Grammar:
    """The grammar unrolled ``depth`` times; where no value ends within that many levels of a
    recursive reference (``allOf`` asking for a chain of five ``next`` members beside a
    recursive node: every instance nests deeper than the bound), unrolled deeper (twice
    as deep each time, up to MAX_UNROLL_DEPTH), as long as compiling stays within its work."""
    first = shallow = depth
    while True:
        try:
            return compile_at(depth)
        except _TooShallow:
            if depth >= MAX_UNROLL_DEPTH:
                raise ConstraintError(
                    f"the schema accepts no JSON value within {MAX_UNROLL_DEPTH} levels of its "
                    "recursive $refs (an allOf or not over a recursive reference asks for "
                    "deeper instances)"
                ) from None
            shallow, depth = depth, min(max(2 * depth, depth + 1), MAX_UNROLL_DEPTH)
        except ConstraintError as e:
            if depth == first:
                raise
            raise ConstraintError(
                f"the schema accepts no JSON value within {shallow} levels of its recursive "
                f"$refs, and unrolled {depth} levels deep: {e}"
            ) from None


def _grammar(
    document: Document,
    ws: R,
    max_recursion_depth: int,
    any_depth: int | None,
    max_chars: int,
    registry: Registry,
    strict: bool,
    count_lengths: bool,
    key_order: str,
    spellings: bool | str,
    unroll: bool = False,
) -> Grammar:
    limits = pattern_limit(max_chars), fragment_limit(max_chars), work_limit(MAX_WORK)
    with limits[0], limits[1], limits[2], read_spellings(spellings):
        builder = Builder(document, max_recursion_depth, unroll, registry)
        node = builder.build_root(document)
        emitter = Emitter(ws, any_depth, builder.bodies, strict, key_order == "any")
        if count_lengths:
            emitter.counted = counted_apart(node, builder.bodies)
        out = emitter.node(node)
        if out is None and builder.cut:
            raise _TooShallow
        if out is None:
            raise NoValue("the schema accepts no JSON value")
        if not derives_text(out, emitter.rules):
            raise ConstraintError(
                "the schema accepts no JSON value: it refers to itself ($ref) with nothing "
                "written before the reference comes back, so it never ends"
            )
        text = to_lark(out, emitter.rules)
    if not (emitter.checked or emitter.counted):
        return Grammar(text, None)
    from lmprog.fsm.checks import JsonChecks

    # the check is part of the constraint: name it in the text, which keys the token index
    digest = hashlib.sha256(json.dumps(document, sort_keys=True, default=repr).encode()).hexdigest()
    text += f"// items, keys or lengths checked as decoded, schema {digest[:24]}\n"
    return Grammar(text, JsonChecks(node, builder.bodies, emitter.counted))


class Grammar(NamedTuple):
    """A schema's grammar (Lark text) and the check the guide runs beside it (None: none)."""

    lark: str
    check: JsonChecks | None


_JSON_WHITESPACE = CharSet.of(" \t\n\r")


def _whitespace(pattern: str) -> R:
    """The whitespace regex, checked to match only JSON whitespace (space, tab, newline,
    carriage return): anything else would make invalid JSON, and would let the lexer cut a
    punctuation lexeme wrong."""
    parsed = parse_regex(pattern, "python")
    stack = [b.node for b in parsed.branches]
    while stack:
        node = stack.pop()
        if isinstance(node, Chars):
            if not (node.chars - _JSON_WHITESPACE).is_empty():
                raise ConstraintError(
                    f"whitespace {pattern!r} matches characters other than JSON whitespace "
                    "(space, tab, newline, carriage return)"
                )
        elif isinstance(node, Repeat):
            stack.append(node.node)
        else:
            stack.extend(node.parts if isinstance(node, Concat) else node.options)
    return R(compile_user_regex(pattern), False, True)
