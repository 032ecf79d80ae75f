"""Constraints built from parts: literal text, regexes and other constraints in sequence,
union and repetition, as one grammar. The server's tool calls need it.

    from lmprog.fsm import compose as c
    call = c.seq(c.json_text('{"name": "f", "arguments": '), c.embed(args), c.json_text("}"))
    constraint = c.constraint(c.choice(call, c.embed(answer)), "tool call or answer")

Parts: `text(s)` (one lexeme), `json_text(s)` (cut at JSON tokens), `special(name, id)` (a
special token itself; `marked_text` spells a text's markers so), `regex(r)` and
`embed(constraint)` (not an EBNF grammar: ConstraintError); each is cut into lexemes as the
parts it competes with are. Design: docs/design/constraints.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import cast

from lmprog.core.errors import ConstraintError
from lmprog.fsm import json_schema
from lmprog.fsm.constraint import Constraint, SchemaOptions
from lmprog.fsm.json_schema.emit.lark import (
    Choice,
    Frag,
    Ref,
    Rep,
    Seq,
    choice,
    rep,
    seq,
    to_lark,
    tok,
)
from lmprog.fsm.regex import R, lit, raw

__all__ = [
    "seq", "choice", "rep", "text", "json_text", "marked_text", "special", "special_markers",
    "regex", "embed", "constraint",
]  # fmt: skip
_ = (seq, choice, rep)  # re-exported: the combinators of the parts


def text(s: str) -> Frag | None:
    """The literal text `s` as one lexeme (nothing for "")."""
    return tok(lit(s)) if s else seq()


def regex(r: R | None) -> Frag | None:
    """A regex fragment as one lexeme."""
    return tok(r)


# JSON tokens of a literal text: a string, ws + closing punctuation, ws + separator + ws,
# opening punctuation + ws, a number or a literal name; anything else runs to the next of them.
_JSON_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"|\s*[,:]\s*|\s*[}\]]|[{\[]\s*|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null'
)


def json_text(s: str) -> Frag | None:
    """The literal text `s`, cut into lexemes at JSON token boundaries."""
    parts, at = [], 0
    for m in _JSON_TOKEN.finditer(s):
        if m.start() > at:
            parts.append(text(s[at : m.start()]))
        parts.append(text(m.group()))
        at = m.end()
    if at < len(s):
        parts.append(text(s[at:]))
    return seq(*parts)


_NAMEABLE = re.compile(r"<[^\s<>\[\]]+>")  # a special token Lark names as it is: <|call|>


def special(name: str, token_id: int) -> Ref:
    """The special token `name` (id `token_id`) as itself: that one id, not its text. Named
    in the grammar as `<|call|>` where llguidance's Lark reads the name, else `<[id]>`."""
    return Ref(name if _NAMEABLE.fullmatch(name) else f"<[{token_id}]>")


def special_markers(tokenizer: object | None, texts: Iterable[str]) -> dict[str, int]:
    """The special tokens of a Hugging Face `tokenizer` whose names occur in `texts` (a
    format's fixed text: `ToolFormat.fixed_texts`, `ReasoningFormat.marker_texts`, gpt-oss's
    `<|channel|>`), name -> id ({} for none, and for no tokenizer: an endpoint's)."""
    if tokenizer is None:
        return {}
    names = set(getattr(tokenizer, "all_special_tokens", None) or ())
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            names.add(str(getattr(added, "content", added)))
    texts = [t for t in texts if t]
    found = sorted(n for n in names if n and any(n in t for t in texts))
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if not found or not callable(convert):
        return {}
    return {n: i for n, i in zip(found, convert(found)) if isinstance(i, int)}


def marked_text(
    s: str, specials: Mapping[str, int], part: Callable[[str], Frag | None] = text
) -> Frag | None:
    """`part(s)` (`text` or `json_text`), where each occurrence of a name in `specials` (a
    special token's name -> its id: the markers a model writes as special tokens) is that
    token (`special`)."""
    if not specials or not any(name in s for name in specials):
        return part(s)
    names = sorted(specials, key=len, reverse=True)
    pieces = re.split("(" + "|".join(map(re.escape, names)) + ")", s)
    return seq(
        *(
            special(piece, specials[piece]) if i % 2 else part(piece)
            for i, piece in enumerate(pieces)
            if piece
        )
    )


class _Embedded(Ref):
    """A reference to an embedded JSON schema grammar's start rule (named when written)."""

    __slots__ = ("constraint",)

    def __init__(self, c: Constraint) -> None:
        super().__init__("")
        self.constraint = c


def embed(c: Constraint) -> Frag:
    """A constraint as a part: one lexeme (regex, choices, dtype) or its grammar (JSON schema)."""
    if c.lark is None:
        return tok(raw(c.pattern))
    if c.kind != "json_schema":
        raise ConstraintError(
            f"a {c.kind} grammar cannot be combined with other parts (tool calls); use a JSON "
            "schema or a regex"
        )
    if c.check is not None:
        c = _lengths_in_lexemes(c)
    if c.check is not None:
        raise ConstraintError(
            "a schema checked as decoded (uniqueItems, 'not' over it or over "
            "additionalProperties) cannot be combined with other parts (tool calls)"
        )
    return _Embedded(c)


def _lengths_in_lexemes(c: Constraint) -> Constraint:
    """A JSON schema constraint compiled again with every string length in its lexemes
    (``json_schema.terms.lengths`` leaves some to the check, which a composed grammar runs
    without)."""
    # a json_schema constraint's options are from_json_schema's, its source the JSON text
    options = cast(SchemaOptions, dict(c.options))
    grammar = json_schema.build_grammar(
        json.loads(cast(str, c.source)),
        whitespace=options.get("whitespace"),
        max_recursion_depth=options.get("max_recursion_depth", json_schema.DEFAULT_RECURSION_DEPTH),
        any_depth=options.get("any_depth", json_schema.DEFAULT_ANY_DEPTH),
        strict=options.get("strict", True),
        count_lengths=False,
        key_order=options.get("key_order", "schema"),
    )
    return replace(c, lark=grammar.lark, check=grammar.check)


def constraint(root: Frag | None, what: str) -> Constraint:
    """The parts as one constraint: kind "ebnf", its source the Lark text (`what` names it
    in errors). Embedded grammars are renamed apart in the order they appear, so equal parts
    give equal text (and one cached token index)."""
    if root is None:
        raise ConstraintError(f"{what}: the parts accept no text")
    prefixes: dict[str, str] = {}
    extra: list[str] = []
    stack, seen = [root], set()
    while stack:  # depth first, left to right: a deterministic order
        f = stack.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f, _Embedded):
            key = f.constraint.cache_key
            if key not in prefixes:
                prefixes[key] = f"e{len(prefixes)}_"
                lark = f.constraint.lark
                assert lark is not None  # (embed takes a constraint with a grammar)
                extra += _renamed(lark, prefixes[key])
            f.name = prefixes[key] + "start"
        elif isinstance(f, Seq):
            stack.extend(reversed(f.parts))
        elif isinstance(f, Choice):
            stack.extend(reversed(f.options))
        elif isinstance(f, Rep):
            stack.append(f.item)
    lark = to_lark(root) + "".join(line + "\n" for line in extra)
    return Constraint("ebnf", "", lark, lark=lark)


# The names `json_schema.emit.lark.to_lark` writes: rules start, any, sN, refN, uN/uNm (parametric),
# terminals TN; nothing else in a rule line is a name of the grammar (operators, %if calls)
_NAME = re.compile(r"\b(?:start|any|s\d+|ref\d+|u\d+m?|T\d+)\b")


def _renamed(lark: str, prefix: str) -> list[str]:
    """The lines of a grammar written by `json_schema.emit.lark.to_lark` with every rule and
    terminal name prefixed (terminal bodies are regex text, left alone)."""
    upper = prefix.upper()

    def rename(m: re.Match[str]) -> str:
        name: str = m.group()
        return (upper if name[0] == "T" else prefix) + name

    out = []
    for line in lark.splitlines():
        if line[:1] == "T":  # a terminal: only its name
            name, _, body = line.partition(": ")
            out.append(f"{upper}{name}: {body}")
        else:
            out.append(_NAME.sub(rename, line))
    return out
