"""``Constraint``: a compiled output constraint, as an immutable value.

Every constructor validates and compiles at once, so a bad regex or schema raises
``ConstraintError`` before any token is spent. A regex, choices or dtype constraint holds
``pattern``, a regex matched against the whole output, written in the syntax subset that Python
``re``, interegular and Rust's ``regex`` (the token engine, llguidance) all read the same way
(see ``lmprog.fsm.regex``); a JSON schema or EBNF constraint holds ``lark``, a grammar in
llguidance's Lark syntax. The token index consumes either. Design: docs/design/constraints.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ParamSpec, TypedDict, TypeVar, cast

from lmprog.core.errors import ConstraintError
from lmprog.fsm import json_schema
from lmprog.fsm.deadline import default_deadline
from lmprog.fsm.dtypes import resolve_dtype
from lmprog.fsm.regex import alt, check_not_only_empty, compile_user_regex, lit

if TYPE_CHECKING:
    from lmprog.fsm.checks import JsonChecks

KINDS = ("regex", "json_schema", "choices", "dtype", "ebnf")
# What reads a JSON text (``Constraint.reading``): any run of JSON's four whitespace characters
READ_WHITESPACE_CHARS = " \t\n\r"
READ_WHITESPACE = r"[ \t\n\r]*"
# The grammar of a JSON schema that accepts no value, read with strict=False: no text matches
# it (an intersection of two disjoint lexemes); nothing can be generated from it
NO_VALUE_LARK = "start: NO_VALUE\nNO_VALUE: /a/ & /b/\n"

_P = ParamSpec("_P")
_T = TypeVar("_T")

# One compile option: its name and value (``Constraint.options``).
Option = tuple[str, "str | int | bool | None"]


class SchemaOptions(TypedDict):
    """``from_json_schema``'s options, as ``Constraint.options`` holds them."""

    whitespace: str | None
    max_recursion_depth: int
    any_depth: int | None
    strict: bool
    key_order: str
    max_schema_depth: int
    max_pattern_chars: int


def _bounded(build: Callable[_P, _T]) -> Callable[_P, _T]:
    """A constructor compiling within the deadline in force (``lmprog.fsm.deadline``: the
    caller's, else DEFAULT_COMPILE_S)."""

    @functools.wraps(build)
    def bounded(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with default_deadline():
            return build(*args, **kwargs)

    return bounded


@dataclass(frozen=True)
class Constraint:
    """What a generation must match. Build with the ``from_*`` constructors.

    ``kind``: "regex" | "json_schema" | "choices" | "dtype"; ``source``: what it was built from
    (the regex, the schema as JSON text in its own key order -- the order the grammar writes
    object properties in, so an endpoint given this schema produces the same order -- the
    tuple of choices, the dtype name);
    ``options``: compile options that shaped the constraint (e.g. whitespace);
    ``lark``: for "json_schema" and "ebnf", the grammar in llguidance's Lark syntax, which the
    token engine runs (``pattern`` is then "": a grammar has no regex);
    ``check``: what the guide checks beside the grammar (``lmprog.fsm.checks``: distinct
    items), named in ``lark`` so that it is part of the cache key; None: nothing.
    """

    kind: str
    pattern: str
    source: object
    options: tuple[Option, ...] = field(default=())
    lark: str | None = None
    check: JsonChecks | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown constraint kind {self.kind!r}; expected one of {KINDS}")
        if not isinstance(self.pattern, str):
            raise TypeError("pattern must be a str")

    # ------------------------------------------------------------------ constructors

    @classmethod
    @_bounded
    def from_regex(cls, pattern: str) -> Constraint:
        """A Python-style regex matched against the whole output (leading ``^``/trailing ``$``
        are allowed and redundant; ``\\d \\w \\s`` are ASCII classes)."""
        emitted = compile_user_regex(pattern)
        check_not_only_empty(pattern)
        return _checked(cls("regex", emitted, pattern))

    @classmethod
    @_bounded
    def from_json_schema(
        cls,
        schema: object,
        *,
        whitespace: str | None = None,
        max_recursion_depth: int = json_schema.DEFAULT_RECURSION_DEPTH,
        any_depth: int | None = json_schema.DEFAULT_ANY_DEPTH,
        max_schema_depth: int = json_schema.DEFAULT_MAX_SCHEMA_DEPTH,
        max_pattern_chars: int = json_schema.DEFAULT_MAX_PATTERN_CHARS,
        strict: bool = True,
        key_order: str = "schema",
    ) -> Constraint:
        """A JSON schema (dict, JSON string, pydantic model class, or a Python type pydantic
        describes: ``Literal[...]``, ``list[int]``, ``dict[str, int]``, a TypedDict, a dataclass,
        an Enum, ``Optional``/unions of them); see ``lmprog.fsm.json_schema`` for the exact
        language.

        ``strict`` (default True, for generation): an object whose schema lists its keys
        (``properties``/``required``) gets no other key unless ``additionalProperties`` (true or
        a schema), ``patternProperties``, ``unevaluatedProperties`` or ``propertyNames`` speak
        for them, and ``prefixItems`` without ``items`` gets no further item; what strict
        generates is always valid under the schema (``lmprog.fsm.json_schema.terms.strict`` says
        exactly what it closes and what it leaves open: ``{"type": "object"}`` stays any
        object). ``strict=False`` is JSON Schema's own reading (an object accepts unlisted keys
        unless the schema forbids them), for validation with ``matches`` and for users who want
        it. ``matches`` judges by the reading the constraint was built with (strict or not),
        in any key order and whitespace.

        ``key_order``: the order generation writes an object's keys in: "schema" (default) the
        schema's own (``properties`` in declaration order, each optional one left out or
        written; jump-forward writes the keys), "any" whichever order the model picks (each key
        at most once, the required ones before the object closes). Texts are read in any order
        either way: ``matches``/``parse`` and guides of ``reading`` (prefilled text, a tool's
        or another server's output) accept an object's members in every order.

        ``whitespace``: regex allowed between JSON tokens in generation (default
        ``[ ]?``; JSON whitespace characters only; texts are read with any); recursive ``$ref`` is a rule of the grammar
        (any depth), except where ``allOf``/``not``/``unevaluated*`` must look inside it: there
        it is unrolled ``max_recursion_depth`` times; ``any_depth``: container nesting of values
        under an unconstrained schema (None: unbounded). Limits on the work one schema may ask for
        (ConstraintError naming the limit past them): ``max_schema_depth`` levels of dicts
        and lists in the document (default 128), ``max_pattern_chars`` characters of the
        grammar it becomes (default 1,000,000). The constraint holds a grammar (``lark``),
        which the token engine runs; ``pattern`` is ""."""
        document = json_schema.load_schema(schema)
        source = json.dumps(document, ensure_ascii=False, default=repr)
        try:
            grammar = json_schema.build_grammar(
                document,
                whitespace=whitespace,
                max_recursion_depth=max_recursion_depth,
                any_depth=any_depth,
                max_schema_depth=max_schema_depth,
                max_pattern_chars=max_pattern_chars,
                strict=strict,
                key_order=key_order,
            )
        except json_schema.NoValue:
            if strict is not False:  # (strict=True for generation: nothing to generate)
                raise
            grammar = json_schema.Grammar(NO_VALUE_LARK, None)
        options: tuple[Option, ...] = (
            ("whitespace", whitespace),
            ("max_recursion_depth", max_recursion_depth),
            ("any_depth", any_depth),
            ("strict", strict),
            ("key_order", key_order),
            ("max_schema_depth", max_schema_depth),
            ("max_pattern_chars", max_pattern_chars),
        )
        made = cls("json_schema", "", source, options, lark=grammar.lark, check=grammar.check)
        return made if made.accepts_nothing else _checked(made)

    @classmethod
    def from_choices(cls, choices: Iterable[str]) -> Constraint:
        """Exactly one of the given strings."""
        if isinstance(choices, str) or not all(isinstance(c, str) for c in choices):
            raise ConstraintError("choices must be a list of strings")
        strings = tuple(choices)
        if not strings:
            raise ConstraintError("choices must not be empty")
        return cls("choices", alt(*(lit(c) for c in strings)).text, strings)

    @classmethod
    @_bounded
    def from_ebnf(cls, grammar: str) -> Constraint:
        """A context-free grammar in the GBNF dialect of llama.cpp grammars and SGLang's
        ``ebnf`` (``root ::= ...``; a Lark grammar with a ``start:`` rule is taken too).
        Recursion works at any depth. ConstraintError for a malformed grammar, a rule used
        but not defined, or a ``root`` that can never finish; see ``lmprog.fsm.grammar``."""
        from lmprog.fsm.grammar import ebnf_to_lark

        lark = ebnf_to_lark(grammar)
        return _checked(cls("ebnf", "", grammar, lark=lark))

    @classmethod
    def from_dtype(cls, dtype: type | str) -> Constraint:
        """``int``, ``float``, ``bool`` or ``str`` (the types or their names)."""
        d = resolve_dtype(dtype)
        return cls("dtype", d.pattern, d.name)

    # ------------------------------------------------------------------ use

    @property
    def strict(self) -> bool | None:
        """For a JSON schema, whether it was built for strict generation (see
        ``from_json_schema``); None for the other kinds."""
        if self.kind != "json_schema":
            return None
        strict = dict(self.options).get("strict")
        return None if strict is None else bool(strict)

    @property
    def accepts_nothing(self) -> bool:
        """A JSON schema read with ``strict=False`` that accepts no value (``false``,
        ``{"not": {}}``): ``matches`` is False for every text, and generating from it is a
        ConstraintError where its index is built. With ``strict=True`` (generation) such a
        schema is a ConstraintError where it is given."""
        return self.lark == NO_VALUE_LARK

    @property
    def reading(self) -> Constraint:
        """The constraint that reads texts token by token (a guide of its index reads a
        prefilled text): the same values, an object's members accepted in any order
        (``key_order="any"``), any JSON whitespace between tokens (a text a user, a tool
        or ``json.dumps(..., indent=2)`` wrote; generation keeps its bounded ``whitespace``)
        and every JSON spelling of literal strings (keys, enum/const values, strings bound
        only by excluded values or by patterns without a repetition: ``\\u00e9`` as
        ``json.dumps`` escapes by default) and of numbers (``2.0``, ``1e2`` where exact);
        itself where none is a matter (not a JSON schema, or a grammar that comes out the
        same). Built on first use, then kept. ``spelled`` reads every spelling of patterns'
        characters too."""
        found = self.__dict__.get("_reading")
        if found is None:
            found = self._read_in_any_order(spellings=json_schema.LITERALS)
            object.__setattr__(self, "_reading", found)
        return found

    @property
    def spelled(self) -> Constraint:
        """``reading``, and every JSON spelling of the characters of patterns and formats too
        (``read_spellings``): what ``matches`` judges with. Its lexemes are an alternative of
        spellings per character, so it is read over bytes (``matches``): over a model's
        vocabulary, masks of a counted repetition of them can pass llguidance's lexer limits."""
        found = self.__dict__.get("_spelled")
        if found is None:
            found = self._read_in_any_order(spellings=True)
            object.__setattr__(self, "_spelled", found)
        return found

    def _read_in_any_order(self, spellings: bool | str) -> Constraint:
        if self.kind != "json_schema" or self.accepts_nothing:
            return self
        # a json_schema constraint's options are from_json_schema's, its source the JSON text
        options = dict(self.options)
        options["key_order"] = "any"
        options["whitespace"] = READ_WHITESPACE
        options["read_spellings"] = spellings
        document = json.loads(cast(str, self.source))
        try:
            grammar = json_schema.build_grammar(document, **cast(SchemaOptions, options))
        except ConstraintError:
            if not spellings:
                raise
            options["read_spellings"] = False  # spellings past max_pattern_chars
            grammar = json_schema.build_grammar(document, **cast(SchemaOptions, options))
        if grammar.lark == self.lark:
            return self
        return Constraint(
            "json_schema",
            "",
            self.source,
            tuple(options.items()),
            lark=grammar.lark,
            check=grammar.check,
        )

    @property
    def cache_key(self) -> str:
        """A stable key of the pattern or grammar (the token index depends on nothing else)."""
        text = self.pattern if self.lark is None else "lark:" + self.lark
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def matches(self, text: str) -> bool:
        """Whether the whole ``text`` satisfies the constraint (no model involved), an object's
        members in any order, any JSON whitespace and any spelling (``spelled``). Checked by
        the token engine over a
        one-byte-per-token vocabulary: linear in the text, for any pattern size (a generated
        pattern is never handed to Python's ``re``)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if self.accepts_nothing:
            return False
        from lmprog.fsm.index import matches_bytes

        if self.kind == "json_schema":  # a JSON text: whitespace around the value, too
            text = text.strip(READ_WHITESPACE_CHARS)
        return matches_bytes(self.spelled, text.encode("utf-8", "surrogatepass"))

    def parse(self, text: str) -> object:
        """The value of a matching output: int/float/bool/str for dtypes, else the text itself.
        Raises ConstraintError if ``text`` does not match."""
        if not self.matches(text):
            raise ConstraintError(f"output {text[:80]!r} does not match the {self.kind} constraint")
        if self.kind == "dtype":
            return resolve_dtype(self.source).parse(text)
        return text


def _checked(constraint: Constraint) -> Constraint:
    """The constraint, once llguidance has compiled it and walked its first tokens over a
    byte vocabulary (``index.check_grammar``, cached by its text): what llguidance refuses,
    or a limit its first tokens reach, is a ConstraintError where the constraint is built
    (``gen()``, a request's fields), not in the first request that runs it."""
    from lmprog.fsm.index import check_grammar

    check_grammar(constraint)
    return constraint
