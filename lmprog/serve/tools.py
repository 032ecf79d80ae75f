"""Tool calls: the tools' description for the prompt, the constraint that makes a call's
arguments match its tool's parameter schema, and reading a call back out of the text.

A call is written as one JSON object in a fixed layout (the fixed parts are jump-forwarded):

    {"name": "get_weather", "arguments": {"city": "Paris"}}

tool_choice "required" / a named function: the text must be a call (to any tool / to that
one); "auto": a call, or non-empty text that does not start with "{" (or, with response_format, text
matching it); "none": only that answer. At most one call per choice.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.regex import ANY_CHAR, alt, cat, charset_regex, cs, lit, raw, rep

from .chat_schemas import NamedToolChoice, Tool
from .errors import APIError

_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
_INSTRUCTIONS = (
    "You can call these functions (JSON Schema of their arguments shown):\n{tools}\n"
    'To call one, answer with only a JSON object: {{"name": <function name>, '
    '"arguments": <arguments object>}}.'
)


@dataclass(frozen=True)
class ToolPlan:
    """constraint: what the whole text must match (None: free text); calls: matches exactly a
    tool call (None: tools are off); prompt: the tool description for the system message."""

    constraint: Constraint | None
    calls: Constraint | None
    prompt: str | None

    def parse(self, text: str) -> dict[str, Any] | None:
        """The OpenAI tool_call for `text`, or None when it is plain content."""
        if self.calls is None or not self.calls.matches(text):
            return None
        call = json.loads(text)
        return {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {
                "name": call["name"],
                "arguments": json.dumps(call["arguments"], ensure_ascii=False),
            },
        }


def plan_tools(
    tools: Sequence[Tool] | None, choice: str | NamedToolChoice | None, text: Constraint | None
) -> ToolPlan:
    """`text`: the response_format constraint of plain answers (None: free text)."""
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        return ToolPlan(text, None, None)
    _check_unique(tools)
    choice = choice or "auto"
    if (
        choice == "none"
    ):  # an answer, not something that reads as a call (a history of calls invites one)
        answer = text or Constraint("regex", _free_text().text, "answer")
        return ToolPlan(answer, None, None)
    chosen = _chosen(tools, choice)
    calls = alt(*(_call_regex(t, tools.index(t)) for t in chosen))
    calls_c = Constraint("regex", calls.text, "tool calls")
    prompt = _INSTRUCTIONS.format(tools="\n".join(_describe(t) for t in tools))
    if choice != "auto":
        return ToolPlan(calls_c, calls_c, prompt)
    answer = raw(f"(?:{text.pattern})") if text is not None else _free_text()
    either = alt(raw(f"(?:{calls.text})", atomic=True), answer)
    return ToolPlan(Constraint("regex", either.text, "tool calls or answer"), calls_c, prompt)


def _check_unique(tools: Sequence[Tool]) -> None:
    names = [t.function.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise APIError(400, f"two tools are named {name!r}", param=f"tools[{i}].function.name")


def _chosen(tools: Sequence[Tool], choice: str | NamedToolChoice) -> list[Tool]:
    if isinstance(choice, NamedToolChoice):
        match = [t for t in tools if t.function.name == choice.function.name]
        if not match:
            raise APIError(
                400,
                f"tool_choice names {choice.function.name!r}, which is not in tools",
                param="tool_choice",
            )
        return match
    return list(tools)


def _call_regex(tool: Tool, index: int) -> Any:
    schema = tool.function.parameters if tool.function.parameters is not None else _NO_PARAMETERS
    try:
        args = Constraint.from_json_schema(schema)
    except ConstraintError as exc:
        raise APIError(
            400,
            f"invalid parameters schema of tool {tool.function.name!r}: {exc}",
            param=f"tools[{index}].function.parameters",
            code="invalid_schema",
        ) from None
    head = '{"name": ' + json.dumps(tool.function.name) + ', "arguments": '
    return cat(lit(head), raw(f"(?:{args.pattern})", atomic=True), lit("}"))


def _free_text() -> Any:
    """Any non-empty text that does not open a JSON object. (Not the empty text: the token
    index cannot be built for a pattern whose start state accepts.)"""
    first = charset_regex(ANY_CHAR - cs("{"))
    return cat(first, rep(charset_regex(ANY_CHAR), 0, None))


def _describe(tool: Tool) -> str:
    f = tool.function
    entry = {
        "name": f.name,
        "description": f.description or "",
        "parameters": f.parameters if f.parameters is not None else _NO_PARAMETERS,
    }
    return json.dumps(entry, ensure_ascii=False)
