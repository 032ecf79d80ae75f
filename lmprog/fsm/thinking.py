"""A constraint that applies after a reasoning model's thinking: free thinking, the end
marker, then the constrained answer, as one grammar.

    c = after_thinking(answer, start="<think>", end="</think>", opened=True)

The thinking is one lexeme that ends at the first end marker; the answer's grammar is nested
whole (`%lark {...}`), so any constraint composes. With `opened=False` the block is optional.
Design: docs/design/constraints.md.
"""

from __future__ import annotations

from lmprog.core.errors import ConstraintError
from lmprog.fsm.compose import _lengths_in_lexemes
from lmprog.fsm.constraint import Constraint
from lmprog.fsm.json_schema.emit.lark import regex_terminal
from lmprog.fsm.regex import lit, raw

_WS = "[ \\t\\r\\n]*"
_ANY = "(?s:.*)"


def thinking_lexeme(start: str, end: str, opened: bool) -> str:
    """The Lark terminal of a thinking block: (start marker unless opened) text without the
    end marker, the end marker, whitespace."""
    if not end:
        raise ConstraintError("a reasoning format needs an end marker")
    e = regex_terminal(lit(end))[1:-1]
    s = "" if opened else regex_terminal(lit(start))[1:-1]
    return f"/{s}{_ANY}{e}{_WS}/ & ~/{_ANY}{e}{_ANY}{e}{_ANY}/"


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


def after_thinking(answer: Constraint, *, start: str, end: str, opened: bool) -> Constraint:
    """`answer` after a thinking block (docs/design/constraints.md)."""
    think = f"THINK: {thinking_lexeme(start, end, opened)}\n"
    body = answer_grammar(answer)
    head = "start: THINK answer\n" if opened else "start: THINK answer | answer\n"
    lark = head + think + "answer: %lark {\n" + body + "}\n"
    return Constraint("ebnf", "", lark, lark=lark)
