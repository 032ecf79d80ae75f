"""Pythonic tool calls, where a template asks for them (Llama 3.2's, vLLM's pythonic one).

    [get_weather(city="Paris", days=3), ping()]

`pythonic_calls` builds the constraint; `PythonicCallReader` reads the calls back, whole or as
they stream. Design: docs/design/server.md#pythonic-calls.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm import compose as c

from .streamed_calls import StreamedCalls

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """One call as the model writes it (Python literals)."""
    args = ", ".join(f"{k}={_literal(v)}" for k, v in arguments.items())
    return f"{name}({args})"


def _literal(value: Any) -> str:
    if value is True or value is False or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def _value(schema: Any, strict: bool) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "boolean" and set(schema) <= {"type", "description", "title", "default"}:
        return c.choice(c.text("True"), c.text("False"))
    if kind == "null":
        return c.text("None")
    sub = schema if isinstance(schema, (dict, bool)) else {}
    return c.embed(Constraint.from_json_schema(sub, strict=strict))


def _args(schema: dict[str, Any], strict: bool) -> Any:
    """The keyword arguments: any in-order subset of the parameters holding the required
    ones, ", " between (built from the last parameter back)."""
    props = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    items = []
    for key, sub in props.items():
        if not _NAME.fullmatch(key):
            raise ConstraintError(f"parameter name {key!r} is not a Python identifier")
        items.append((c.seq(c.text(f"{key}="), _value(sub, strict)), key in required))
    rest: Any = c.seq()  # after an item was written
    first: Any = c.seq()  # none written yet
    for item, needed in reversed(items):
        later = c.seq(c.text(", "), item, rest)
        now = c.seq(item, rest)
        rest, first = (later, now) if needed else (c.choice(later, rest), c.choice(now, first))
    return first


def pythonic_calls(
    tools: list[tuple[str, dict[str, Any] | None, bool]], max_calls: int | None
) -> Any:
    """The calls' grammar: "[" one or more calls to any of `tools` ((name, parameters schema,
    strict)) ", " between, at most `max_calls`, "]"."""
    one = c.choice(
        *(
            c.seq(c.text(f"{name}("), _args(params or {}, strict), c.text(")"))
            for name, params, strict in tools
        )
    )
    more = None if max_calls is None else max_calls - 1
    return c.seq(c.text("["), one, c.rep(c.seq(c.text(", "), one), 0, more), c.text("]"))


def _scan(text: str, names: frozenset[str]) -> tuple[list[tuple[str, str | None, str]], bool, bool]:
    """(calls begun: (name, its whole call text or None while open, its text up to its last
    argument written whole, closed with ")"), closed: the list ended, strayed: the text is
    not calls)."""
    if not text.startswith("["):
        return [], False, not "[".startswith(text)
    calls: list[tuple[str, str | None, str]] = []
    pos = 1
    while True:
        m = _NAME.match(text, pos)
        if m is None or m.end() == len(text):
            typed = text[pos:]
            return calls, False, bool(typed) and not any(n.startswith(typed) for n in names)
        if text[m.end()] != "(" or m.group() not in names:
            return calls, False, True
        end, comma = _closing(text, m.end())
        if end is None:
            calls.append((m.group(), None, text[m.start() : comma] + ")"))
            return calls, False, False
        calls.append((m.group(), text[m.start() : end], text[m.start() : end]))
        if text.startswith(", ", end):
            pos = end + 2
        elif text.startswith("]", end):
            return calls, True, end + 1 != len(text)
        else:
            return calls, False, not ", ".startswith(text[end:]) and text[end:] != ""


def _closing(text: str, open_at: int) -> tuple[int | None, int]:
    """(the position after the ")" matching the "(" at `open_at`, None if not written yet;
    where the last "," between its arguments is, or open_at + 1 if none)."""
    depth, quote, escaped, comma = 0, "", False, open_at + 1
    for i in range(open_at, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1, comma
        elif ch == "," and depth == 1:
            comma = i
    return None, comma


def _arguments(call: str) -> dict[str, Any] | None:
    try:
        node = ast.parse(call, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call) or node.args:
        return None
    out = {}
    for kw in node.keywords:
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:  # JSON's true/false/null inside a container
            out[kw.arg] = json.loads(ast.get_source_segment(call, kw.value) or "null")
    return out


class PythonicCallReader(StreamedCalls):
    """CallReader's interface over the pythonic layout (see formats.CallReader)."""

    def __init__(self, fmt: Any, names: frozenset[str], *, answers: bool) -> None:
        self.fmt, self.names, self.answers = fmt, names, answers
        self.text = ""
        self.mode = "calls" if not answers else ""
        self._sent: list[tuple[str, str]] = []  # (id, arguments text sent) per call
        self._finished = False

    def feed(self, piece: str) -> list[dict[str, Any]]:
        self.text += piece
        if self.mode == "content":
            return [{"content": piece}] if piece else []
        if self.mode == "":
            if self.text.startswith("["):
                self.mode = "calls"
            elif self.text:
                self.mode = "content"
                return [{"content": self.text}]
            else:
                return []
        return self._deltas()

    def finish(self) -> list[dict[str, Any]]:
        self._finished = True
        if self.mode == "":
            self.mode = "content"
            return []
        return [] if self.mode == "content" else self._deltas()

    def _calls(self) -> list[tuple[str, dict[str, Any] | None, str]]:
        """(name, arguments or None while open, the arguments' JSON text known so far: a
        prefix of the whole call's, each argument once written whole) of each call begun."""
        calls, _, _ = _scan(self.text, self.names)
        out: list[tuple[str, dict[str, Any] | None, str]] = []
        for name, whole, known in calls:
            args = _arguments(whole) if whole is not None else None
            if args is not None:
                out.append((name, args, json.dumps(args, ensure_ascii=False)))
                continue
            done = _arguments(known) if whole is None else None
            out.append(
                (name, None, json.dumps(done, ensure_ascii=False)[:-1] if done is not None else "")
            )
        return out

    @property
    def cut(self) -> bool:
        if self.mode != "calls":
            return False
        calls, closed, strayed = _scan(self.text, self.names)
        return not closed or strayed

    @property
    def content(self) -> str | None:
        if self.mode == "content":
            return self.text
        if self.mode != "calls" or not self._finished or not self.cut:
            return None
        whole = [t for _, t, _ in _scan(self.text, self.names)[0] if t is not None]
        if not whole:
            return self.text or None
        last = self.text.rindex(whole[-1]) + len(whole[-1])
        return self.text[last:].lstrip(", ") or None
