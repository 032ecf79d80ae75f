"""Qwen3-Coder's XML tool calls: each parameter in a tag of its own, a string as raw text.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

`xml_calls` builds the constraint; `XmlCallReader` reads the calls back, whole or as they
stream. Design: docs/design/server.md#xml-calls-qwen3-coder.
"""

from __future__ import annotations

import json
import re
from typing import Any

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm import compose as c

from .streamed_calls import StreamedCalls

OPEN, CLOSE = "<tool_call>\n<function=", "</function>\n</tool_call>"
PARAM_END = "\n</parameter>\n"
# text ending at its first "\n</parameter>\n" (nothing may follow it in the lexeme: the marker
# overlaps itself, so "two occurrences" would not tell llguidance's lexer where it ends)
_STRING = "/(?s:.*)\\n<\\/parameter>\\n/ & ~/(?s:.*)\\n<\\/parameter>\\n(?s:.+)/"


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """One call as Qwen3-Coder writes it."""
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
        f"{PARAM_END}"
        for k, v in arguments.items()
    )
    return f"{OPEN}{name}>\n{params}{CLOSE}"


_ANNOTATIONS = frozenset({"type", "description", "title", "default", "examples", "$comment"})


def _is_string(schema: Any) -> bool:
    """Written as raw text: a plain string (no pattern, format or length: those are written
    as a JSON string, which the constraint can check), or one of string choices."""
    if not isinstance(schema, dict):
        return False
    if _choices(schema) is not None:
        return True
    return schema.get("type") == "string" and set(schema) <= _ANNOTATIONS


def _choices(schema: dict[str, Any]) -> list[str] | None:
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values and all(isinstance(v, str) for v in values):
        return list(values)
    return None


def _value(schema: Any, strict: bool) -> Any:
    """A parameter's value: raw text for a string (one of its choices for an enum), else
    its schema's JSON."""
    choices = _choices(schema) if isinstance(schema, dict) else None
    if choices is not None:
        return c.seq(c.choice(*(c.text(v) for v in choices)), c.text(PARAM_END))
    if _is_string(schema):
        return _string_lexeme()
    sub = schema if isinstance(schema, (dict, bool)) else {}
    return c.seq(c.embed(Constraint.from_json_schema(sub, strict=strict)), c.text(PARAM_END))


def _string_lexeme() -> Any:
    from lmprog.fsm.json_schema.emit.lark import tok

    return tok(_STRING)


def _one(name: str, parameters: dict[str, Any] | None, strict: bool) -> Any:
    schema = parameters or {}
    props = schema.get("properties") or {}
    if not isinstance(props, dict):
        raise ConstraintError("parameters.properties must be an object")
    required = set(schema.get("required") or ())
    parts = []
    for key, sub in props.items():
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", key):
            raise ConstraintError(f"parameter name {key!r} cannot be written as an XML tag")
        param = c.seq(c.text(f"<parameter={key}>\n"), _value(sub, strict))
        parts.append(param if key in required else c.choice(param, c.seq()))
    return c.seq(c.text(f"{OPEN}{name}>\n"), *parts, c.text(CLOSE))


def xml_calls(tools: list[tuple[str, dict[str, Any] | None, bool]], max_calls: int | None) -> Any:
    """The calls' grammar: one or more calls to any of `tools` ((name, parameters schema,
    strict)), "\\n" between them, at most `max_calls`."""
    one = c.choice(*(_one(name, params, strict) for name, params, strict in tools))
    more = None if max_calls is None else max_calls - 1
    return c.seq(one, c.rep(c.seq(c.text("\n"), one), 0, more))


_CALL = re.compile(
    r"<tool_call>\n<function=([A-Za-z0-9_-]+)>\n(.*?)</function>\n</tool_call>", re.S
)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>\n", re.S)


def _converted(value: str, schema: Any) -> Any:
    if _is_string(schema):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


class XmlCallReader(StreamedCalls):
    """CallReader's interface over Qwen3-Coder's layout (see formats.CallReader)."""

    def __init__(self, fmt: Any, schemas: dict[str, Any], *, answers: bool) -> None:
        self.fmt, self.schemas, self.answers = fmt, schemas, answers
        self.text = ""
        self.mode = "calls" if not answers else ""
        self._sent: list[tuple[str, str]] = []  # (id, arguments text sent) per call
        self._finished = False

    def feed(self, piece: str) -> list[dict[str, Any]]:
        self.text += piece
        if self.mode == "content":
            return [{"content": piece}] if piece else []
        if self.mode == "" and not self._decide():
            return []
        if self.mode == "content":
            return [{"content": self.text}]
        return self._deltas()

    def finish(self) -> list[dict[str, Any]]:
        self._finished = True
        if self.mode == "":
            self.mode = "content"
            return [{"content": self.text}] if self.text else []
        return [] if self.mode == "content" else self._deltas()

    def _decide(self) -> bool:
        if self.text.startswith(OPEN[: len("<tool_call>")]):
            self.mode = "calls"
        elif not "<tool_call>".startswith(self.text):
            self.mode = "content"
        return self.mode != ""

    def _calls(self) -> list[tuple[str, dict[str, Any] | None, str]]:
        """(name, arguments or None while unfinished, the arguments' JSON text known so
        far) of each call begun so far."""
        out: list[tuple[str, dict[str, Any] | None, str]] = []
        pos = 0
        for m in _CALL.finditer(self.text):
            if m.start() != pos and self.text[pos : m.start()] != "\n":
                break
            args = self._params(m.group(1), m.group(2))
            out.append((m.group(1), args, json.dumps(args, ensure_ascii=False)))
            pos = m.end()
        rest = self.text[pos:].lstrip("\n")
        head = re.match(r"<tool_call>\n<function=([A-Za-z0-9_-]+)>\n?", rest)
        if head and head.group(1) in self.schemas:
            out.append((head.group(1), None, self._known(head.group(1), rest[head.end() :])))
        return out

    def _params(self, name: str, body: str) -> dict[str, Any]:
        params = self.schemas.get(name, {}).get("properties") or {}
        return {k: _converted(v, params.get(k)) for k, v in _PARAM.findall(body)}

    def _known(self, name: str, body: str) -> str:
        """The JSON text of an open call's arguments as far as it is known, a prefix of the
        whole call's (`json.dumps` of its arguments): the parameters written whole, then a
        string parameter's text as it is written (less what may begin its end tag)."""
        done = self._params(name, body)
        known = json.dumps(done, ensure_ascii=False)[:-1]  # without the closing brace
        last = max((m.end() for m in _PARAM.finditer(body)), default=0)
        open_param = re.match(r"<parameter=([^>\n]+)>\n", body[last:])
        params = self.schemas.get(name, {}).get("properties") or {}
        if open_param is None or not _is_string(params.get(open_param.group(1))):
            return known
        raw = body[last + open_param.end() :]
        held = next((k for k in range(len(PARAM_END), 0, -1) if raw.endswith(PARAM_END[:k])), 0)
        value = json.dumps(raw[: len(raw) - held], ensure_ascii=False)[:-1]  # string still open
        key = json.dumps(open_param.group(1), ensure_ascii=False)
        return f"{known}{', ' if done else ''}{key}: {value}"

    @property
    def content(self) -> str | None:
        if self.mode == "content":
            return self.text
        if self.mode != "calls" or not self._finished or not self.cut:
            return None
        whole = [m.end() for m in _CALL.finditer(self.text)]
        return self.text[whole[-1] :].lstrip("\n") if whole else self.text or None

    @property
    def cut(self) -> bool:
        if self.mode != "calls":
            return False
        calls = self._calls()
        return not calls or calls[-1][1] is None or not self.text.rstrip("\n").endswith(CLOSE)
