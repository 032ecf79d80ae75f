"""ToolPlan: a request's tools as the constraint on its text, lmprog's tool note, and the
reader of its calls.

tool_choice "required" / a named function: one or more calls; "auto": calls or an answer;
"none": only an answer. Design: docs/design/server.md#tool-calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm import compose as c
from lmprog.fsm.regex import ANY_CHAR, alt, cat, charset_regex, cs, lit, rep
from lmprog.fsm.thinking import prefixed

from ..errors import APIError
from ..schemas.chat import NamedToolChoice, Tool
from .formats import GENERIC, PYTHONIC_FAMILY, XML_FAMILY, CallReader, ToolFormat
from .pythonic_calls import PythonicCallReader, pythonic_calls
from .xml_calls import XmlCallReader, xml_calls

_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
_INSTRUCTIONS = (
    "You can call these functions (JSON Schema of their arguments shown):\n{tools}\n"
    'To call one, answer with only a JSON object: {{"name": <function name>, '
    '"arguments": <arguments object>}}.'
)
_SEVERAL = " To call several, write one such object per line."


@dataclass(frozen=True)
class ToolPlan:
    """constraint: what the whole text must match (None: free text); calls: matches exactly
    the tool calls (None: tools are off); prompt: lmprog's tool note for the system message
    (None: the template describes the tools, or tools are off); format: the call layout;
    names: the callable tools; answers: an answer instead of calls is allowed (auto);
    max_calls: None or the most calls per choice."""

    constraint: Constraint | None
    calls: Constraint | None
    prompt: str | None
    format: ToolFormat = GENERIC
    names: frozenset[str] = frozenset()
    answers: bool = True
    max_calls: int | None = None
    schemas: dict[str, Any] = field(default_factory=dict, compare=False)  # name -> parameters
    headed: bool = False  # the constraint writes the message headers (harmony's channels)
    # the markers the constraint takes as special tokens, name -> id (plan_tools' `specials`)
    specials: Mapping[str, int] = field(default_factory=dict, compare=False)

    def reader(self) -> CallReader:
        """A reader of one choice's text (see CallReader); only when tools are on."""
        assert self.calls is not None
        if self.format.layout == XML_FAMILY:
            return XmlCallReader(self.format, self.schemas, answers=self.answers)  # type: ignore[return-value]
        if self.format.layout == PYTHONIC_FAMILY:
            return PythonicCallReader(self.format, self.names, answers=self.answers)  # type: ignore[return-value]
        return CallReader(self.format, self.names, answers=self.answers, max_calls=self.max_calls)

    def parse(self, text: str) -> CallReader:
        """The whole text of a finished choice, read: its `content`, `tool_calls`, `cut`."""
        reader = self.reader()
        reader.feed(text)
        reader.finish()
        return reader


def plan_tools(
    tools: Sequence[Tool] | None,
    choice: str | NamedToolChoice | None,
    text: Constraint | None,
    fmt: ToolFormat = GENERIC,
    *,
    parallel: bool = True,
    specials: Mapping[str, int] | None = None,
) -> ToolPlan:
    """`text`: the response_format constraint of plain answers (None: free text); `fmt`: the
    template's call format (formats.tool_format); `parallel`: parallel_tool_calls;
    `specials`: the format's markers the model's tokenizer has as special tokens, name -> id
    (`ToolFormat.special_markers`), which the constraint takes as those ids (the model writes
    them so), not as their text."""
    specials = specials or {}
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        return ToolPlan(text, None, None, fmt, specials=specials)
    _check_unique(tools)
    args = [_arguments(t, i) for i, t in enumerate(tools)]  # every schema checked, even unchosen
    choice = choice or "auto"
    if (
        choice == "none"
    ):  # an answer, not something that reads as a call (a history of them invites one)
        if fmt.answer_opener:  # an answer under its header (harmony's final channel)
            if text is not None:  # any constraint, a grammar too, nested under the header
                answer = prefixed(text, fmt.answer_opener, specials)
                return ToolPlan(answer, None, None, fmt, headed=True, specials=specials)
            headed = c.constraint(_opened_answer(fmt, None, specials), "answer")
            return ToolPlan(headed, None, None, fmt, headed=True, specials=specials)
        answer = text or Constraint("regex", _not_starting_with(fmt.marker).text, "answer")
        return ToolPlan(answer, None, None, fmt, specials=specials)
    chosen = _chosen(tools, choice)
    max_calls = 1 if not parallel else fmt.max_calls
    if fmt.layout in (XML_FAMILY, PYTHONIC_FAMILY):
        build = xml_calls if fmt.layout == XML_FAMILY else pythonic_calls
        calls = _own_calls(build, tools, chosen, max_calls)
    else:
        calls = _calls(
            fmt, [(t.function.name, args[tools.index(t)]) for t in chosen], max_calls, specials
        )
    calls_c = c.constraint(calls, "tool calls")
    prompt = None
    if not fmt.native or fmt.note:
        note = fmt.note or _INSTRUCTIONS
        prompt = note.format(tools="\n".join(_describe(t) for t in tools))
        prompt += _SEVERAL if max_calls != 1 and not fmt.note else ""
    names = frozenset(t.function.name for t in chosen)
    schemas = {t.function.name: t.function.parameters or _NO_PARAMETERS for t in chosen}
    headed = bool(fmt.answer_opener)
    plan = ToolPlan(
        calls_c, calls_c, prompt, fmt, names, choice == "auto", max_calls, schemas, headed,
        specials,
    )  # fmt: skip
    if choice != "auto":
        return plan
    if fmt.answer_opener:
        answer = _opened_answer(fmt, text, specials)
    else:
        answer = c.embed(text) if text is not None else c.regex(_not_starting_with(fmt.marker))
    either_c = c.constraint(c.choice(calls, answer), "tool calls or answer")
    return ToolPlan(
        either_c, calls_c, prompt, fmt, names, True, max_calls, schemas, headed, specials
    )


def _own_calls(
    build: Any, tools: Sequence[Tool], chosen: Sequence[Tool], max_calls: int | None
) -> Any:
    """Calls of a layout with a builder of its own (Qwen3-Coder's XML, pythonic); a 400
    naming a tool whose parameters it cannot write."""
    for t in chosen:
        i = list(tools).index(t)
        try:
            build([(t.function.name, t.function.parameters, t.function.strict is not False)], 1)
        except ConstraintError as exc:
            raise APIError(
                400,
                f"invalid parameters schema of tool {t.function.name!r}: {exc}",
                param=f"tools[{i}].function.parameters",
                code="invalid_schema",
            ) from None
    own = [(t.function.name, t.function.parameters, t.function.strict is not False) for t in chosen]
    return build(own, max_calls)


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


def _arguments(tool: Tool, index: int) -> Constraint:
    """The constraint of `tool`'s arguments (its parameters schema): strict unless the
    function says `strict: false` (then JSON Schema's reading: unlisted keys allowed)."""
    schema = tool.function.parameters if tool.function.parameters is not None else _NO_PARAMETERS
    try:
        return Constraint.from_json_schema(schema, strict=tool.function.strict is not False)
    except ConstraintError as exc:
        raise APIError(
            400,
            f"invalid parameters schema of tool {tool.function.name!r}: {exc}",
            param=f"tools[{index}].function.parameters",
            code="invalid_schema",
        ) from None


def _calls(
    fmt: ToolFormat,
    tools: list[tuple[str, Constraint]],
    max_calls: int | None,
    specials: Mapping[str, int],
) -> Any:
    """opener call (separator call){0,max_calls-1} closer, a call being any of `tools`: the
    call's JSON text cut as JSON tokens around its arguments' grammar (so that it lines up
    with a JSON answer beside it), the format's markers one lexeme each (or, in `specials`,
    their special tokens)."""

    def json_text(s: str) -> Any:
        return c.marked_text(s, specials, c.json_text)

    one = c.choice(
        *(
            c.seq(
                json_text(fmt.head + fmt.name_text(name) + fmt.args_key),
                c.embed(args),
                json_text(fmt.tail),
            )
            for name, args in tools
        )
    )
    more = None if max_calls is None else max_calls - 1
    rest = c.rep(c.seq(json_text(fmt.separator), one), 0, more) if fmt.separator else None
    return c.seq(
        c.marked_text(fmt.opener, specials),
        one,
        rest if rest is not None else c.seq(),
        c.marked_text(fmt.closer, specials),
    )


def _opened_answer(fmt: ToolFormat, text: Constraint | None, specials: Mapping[str, int]) -> Any:
    """An answer under the format's header: the header, then `text` (None: any non-empty
    text)."""
    body = c.embed(text) if text is not None else c.regex(rep(charset_regex(ANY_CHAR), 1, None))
    return c.seq(c.marked_text(fmt.answer_opener, specials), body)


def _not_starting_with(marker: str) -> Any:
    """Any non-empty text that does not start with `marker` (a proper prefix of it is fine).
    (Not the empty text: the token index cannot be built for a pattern whose start state
    accepts.)"""
    anything = rep(charset_regex(ANY_CHAR), 0, None)
    options = []
    for i in range(len(marker)):
        options.append(cat(lit(marker[:i]), charset_regex(ANY_CHAR - cs(marker[i])), anything))
        if i:
            options.append(lit(marker[:i]))
    return alt(*options)


def _describe(tool: Tool) -> str:
    f = tool.function
    entry = {
        "name": f.name,
        "description": f.description or "",
        "parameters": f.parameters if f.parameters is not None else _NO_PARAMETERS,
    }
    return json.dumps(entry, ensure_ascii=False)
