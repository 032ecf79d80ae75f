"""A constraint that applies after a reasoning model's thinking: free thinking, the end
marker, then the constrained answer, as one grammar.

    c = after_thinking(answer, start="<think>", end="</think>", opened=True)

The thinking is one lexeme that ends at the first end marker; the answer's grammar is nested
whole (`%lark {...}`), so any constraint composes. With `opened=False` the block is optional.
Design: docs/design/constraints.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from lmprog.core.errors import ConstraintError
from lmprog.core.reasoning import PromptState, ReasoningFormat
from lmprog.fsm.compose import _lengths_in_lexemes, special
from lmprog.fsm.constraint import Constraint
from lmprog.fsm.json_schema.emit.lark import regex_terminal
from lmprog.fsm.regex import lit, raw

_WS = "[ \\t\\r\\n]*"
_ANY = "(?s:.*)"


def thinking_lexeme(start: str, end: str, opened: bool, after_end: str = "") -> str:
    """The Lark terminal of a thinking block: (start marker unless opened) text without the
    end marker, the end marker, then `after_end` (whitespace when "")."""
    if not end:
        raise ConstraintError("a reasoning format needs an end marker")
    e = regex_terminal(lit(end))[1:-1]
    s = "" if opened else regex_terminal(lit(start))[1:-1]
    after = regex_terminal(lit(after_end))[1:-1] if after_end else _WS
    return f"/{s}{_ANY}{e}{after}/ & ~/{_ANY}{e}{_ANY}{e}{_ANY}/"


def answer_grammar(answer: Constraint) -> str:
    """The Lark grammar of `answer` alone (start rule `start`)."""
    if answer.lark is None:
        return "start: " + regex_terminal(raw(answer.pattern)) + "\n"
    if answer.kind == "json_schema" and answer.check is not None:
        answer = _lengths_in_lexemes(answer)
    if answer.check is not None:
        raise ConstraintError(
            "a schema checked as decoded (uniqueItems, 'not' over it or over "
            "additionalProperties) cannot follow a reasoning model's thinking"
        )
    assert answer.lark is not None  # a JSON schema's grammar, compiled again
    return answer.lark


def after_thinking(
    answer: Constraint,
    *,
    start: str,
    end: str,
    opened: bool,
    after_end: str = "",
    prefix: str = "",
    specials: Mapping[str, int] | None = None,
) -> Constraint:
    """`answer` after a thinking block (docs/design/constraints.md); `after_end`: the text
    the model writes after the end marker (gpt-oss: `<|start|>assistant`; "": whitespace);
    `prefix`: a header the answer opens with (gpt-oss: its final channel's); `specials`: the
    markers' special tokens in the model's tokenizer, name -> id (gpt-oss's `<|channel|>`),
    which the grammar takes as those ids (`_special_rules`)."""
    specials = specials or {}
    if end in specials:  # a rule of lexemes and special tokens
        name, think = "think", _special_rules(start, end, opened, after_end, specials)
    else:  # one lexeme
        name, think = "THINK", f"THINK: {thinking_lexeme(start, end, opened, after_end)}\n"
    head = f"start: {name} answer\n" if opened else f"start: {name} answer | answer\n"
    lark = head + think + _answer_rules(answer, prefix, specials)
    return Constraint("ebnf", "", lark, lark=lark)


def _special_rules(
    start: str, end: str, opened: bool, after_end: str, specials: Mapping[str, int]
) -> str:
    """The rule `think` of a block whose end marker is a special token: (the start marker
    unless opened) any text (no text token is the end marker), the end marker's id, then
    `after_end` (whitespace when ""), each marker's special tokens as their ids."""
    parts = [] if opened else [_marked(start, specials)]
    parts += ["THINK_TEXT?", _marked(end, specials)]
    parts.append(_marked(after_end, specials) if after_end else "THINK_WS?")
    lark = f"think: {' '.join(p for p in parts if p)}\nTHINK_TEXT: /(?s:.+)/\n"
    return lark + ("" if after_end else f"THINK_WS: /{_WS[:-1]}+/\n")


def _marked(text: str, specials: Mapping[str, int]) -> str:
    """`text` in Lark: literal strings, each special token's name in it as that token."""
    if not text:
        return ""
    names = sorted(specials, key=len, reverse=True)
    pieces = re.split("(" + "|".join(map(re.escape, names)) + ")", text) if names else [text]
    out = []
    for i, piece in enumerate(pieces):
        if piece:
            out.append(
                special(piece, specials[piece]).name
                if i % 2
                else json.dumps(piece, ensure_ascii=False)
            )
    return " ".join(out)


def prefixed(
    answer: Constraint, prefix: str, specials: Mapping[str, int] | None = None
) -> Constraint:
    """`answer` after the literal header `prefix` (itself when ""; its special tokens, in
    `specials`, as their ids)."""
    if not prefix:
        return answer
    lark = "start: answer\n" + _answer_rules(answer, prefix, specials or {})
    return Constraint("ebnf", "", lark, lark=lark)


def _answer_rules(answer: Constraint, prefix: str, specials: Mapping[str, int]) -> str:
    body = "%lark {\n" + answer_grammar(answer) + "}\n"
    if not prefix:
        return "answer: " + body
    if any(name in prefix for name in specials):
        return f"answer: {_marked(prefix, specials)} body\nbody: " + body
    return f"answer: HEADER body\nHEADER: {regex_terminal(lit(prefix))}\nbody: " + body


def for_format(
    answer: Constraint,
    fmt: ReasoningFormat,
    state: PromptState,
    *,
    headed: bool = False,
    specials: Mapping[str, int] | None = None,
) -> Constraint:
    """`answer` after `fmt`'s thinking, for a prompt that left the block `state` ("open" or
    "none"); `headed`: the answer writes its own message header (a gpt-oss tool call's),
    else it is given the format's answer_prefix; `specials`: see `after_thinking`."""
    return after_thinking(
        answer,
        start=fmt.start,
        end=fmt.end,
        opened=state != "none",
        after_end=fmt.after_end,
        prefix="" if headed else fmt.answer_prefix,
        specials=specials,
    )


def answer_only(
    answer: Constraint,
    fmt: ReasoningFormat,
    *,
    headed: bool = False,
    specials: Mapping[str, int] | None = None,
) -> Constraint:
    """The answer's constraint once the thinking is written (a budget's second call): with
    the format's answer_prefix unless `headed` (`specials`: see `after_thinking`)."""
    return answer if headed else prefixed(answer, fmt.answer_prefix, specials)
