"""Tool-call formats: how a model family writes its calls, chosen from its chat template.

    opener  head "<name>" args_key <arguments> tail  [separator head ... tail]*  closer

Formats: generic, hermes, llama3, mistral, deepseek, qwen3-coder, pythonic, gemma3, harmony
(gpt-oss) (`tool_format` picks one from the template).
`read_calls` reads (a prefix of) text back into calls; `CallReader` does it as a choice's text
grows. Each format's layout: docs/design/server.md#call-formats.
"""

from __future__ import annotations

import json
import secrets
import string
import uuid
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from lmprog.core.chat import ChatTemplate

from .pythonic_calls import call_text as python_call
from .xml_calls import call_text as xml_call


@dataclass(frozen=True)
class ToolFormat:
    """One family's call layout (see the module docstring). `max_calls`: None, or the most
    calls one message may hold (Llama 3's templates render one); `native`: the template
    describes the tools and the layout and renders earlier calls (no tool note);
    `id_length`: the call id length a template requires."""

    family: str
    marker: str
    head: str
    args_key: str
    tail: str
    separator: str
    opener: str = ""
    closer: str = ""
    max_calls: int | None = None
    native: bool = True
    id_length: int | None = None
    quoted_name: bool = True  # the name as a JSON string (else as it is: DeepSeek's)
    arguments_text: bool = False  # earlier calls' arguments go to the template as JSON text
    note: str = ""  # a tool note for a native template that lists no tools ({tools}: them)
    layout_of: str = ""  # another family whose builder and reader it uses (gemma3: pythonic)
    answer_opener: str = ""  # the header an answer opens with (harmony: its final channel's)
    stop_tail: bool = False  # the tail is a stop token the text may lack (harmony's <|call|>)
    results_as_user: bool = False  # tool results go to the template as user turns (gemma3)

    @property
    def layout(self) -> str:
        """The family whose call builder and reader this format uses."""
        return self.layout_of or self.family

    def marked_by_special_tokens(self, tokenizer: Any) -> bool:
        """Whether a special token of `tokenizer` is part of the layout's fixed text
        (gpt-oss's `<|channel|>`, `<|call|>`): its output must be detokenized with them."""
        fixed = (self.marker, self.head, self.args_key, self.tail, self.answer_opener)
        specials = getattr(tokenizer, "all_special_tokens", None) or ()
        return any(tok and any(tok in f for f in fixed) for tok in specials)

    @property
    def fixed_texts(self) -> tuple[str, ...]:
        """The layout's fixed text (markers, headers), the name and arguments aside."""
        return (self.opener, self.closer, self.separator, self.head, self.args_key, self.tail,
                self.answer_opener)  # fmt: skip

    def name_text(self, name: str) -> str:
        return json.dumps(name) if self.quoted_name else name

    def call_text(self, name: str, arguments: Any) -> str:
        """One call as the model writes it (earlier calls of a history in the generic format)."""
        if self.layout == XML_FAMILY:
            return xml_call(name, arguments)
        if self.layout == PYTHONIC_FAMILY:
            return python_call(name, arguments)
        args = json.dumps(arguments, ensure_ascii=False)
        return f"{self.head}{self.name_text(name)}{self.args_key}{args}{self.tail}"

    def calls_text(self, calls: list[tuple[str, Any]]) -> str:
        return self.opener + self.separator.join(self.call_text(*c) for c in calls) + self.closer

    def new_id(self) -> str:
        if self.id_length is None:
            return f"call_{uuid.uuid4().hex[:24]}"
        alphabet = string.ascii_letters + string.digits
        return "".join(secrets.choice(alphabet) for _ in range(self.id_length))


GENERIC = ToolFormat("generic", "{", '{"name": ', ', "arguments": ', "}", "\n", native=False)
HERMES = ToolFormat(
    "hermes", "<tool_call>", '<tool_call>\n{"name": ', ', "arguments": ', "}\n</tool_call>", "\n"
)
LLAMA3 = ToolFormat("llama3", "{", '{"name": ', ', "parameters": ', "}", "", max_calls=1)
# Mistral's templates require 9-character alphanumeric call ids (its tokenizer's own rule).
MISTRAL = ToolFormat(
    "mistral", "[TOOL_CALLS]", '{"name": ', ', "arguments": ', "}", ", ", "[TOOL_CALLS] [", "]",
    id_length=9,
)  # fmt: skip


# DeepSeek-R1's (and V3's) templates: calls between special-token markers, the name as it is,
# the arguments in a json code block; the templates list no tools, so lmprog's note does.
_DEEPSEEK_CALL = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n"
    "ARGUMENTS\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)
DEEPSEEK = ToolFormat(
    "deepseek",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
    "\n```json\n",
    "\n```<｜tool▁call▁end｜>",
    "\n",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    quoted_name=False,
    arguments_text=True,
    note=(
        "You can call these functions (JSON Schema of their arguments shown):\n{tools}\n"
        f"To call one, answer with only: {_DEEPSEEK_CALL} (NAME: the function's name, "
        "ARGUMENTS: its arguments as a JSON object)."
    ),
)


# Qwen3-Coder's: XML tags per parameter (xml_calls.py builds and reads them; the JSON layout
# fields below are unused but for the marker and the separator)
XML_FAMILY = "qwen3-coder"
QWEN3_CODER = ToolFormat(
    XML_FAMILY, "<tool_call>", "<tool_call>\n<function=", ">\n", "</function>\n</tool_call>", "\n"
)


# Pythonic calls, where the template asks for them (Llama 3.2's pythonic template):
# [f(a=1), g()] (pythonic_calls.py builds and reads them)
PYTHONIC_FAMILY = "pythonic"
PYTHONIC = ToolFormat(PYTHONIC_FAMILY, "[", "", "(", ")", ", ", "[", "]", quoted_name=False)


# Gemma 3: no tool tokens and a template that lists no tools; Google documents its calls as a
# Python list of calls (ai.google.dev/gemma/docs/capabilities/function-calling), the
# pythonic layout, asked for by lmprog's note; results go back as user turns (the template
# allows only user and model turns, alternating) in a tool_output block, as Google's Gemma
# guides show them.
GEMMA3 = ToolFormat(
    "gemma3",
    "[",
    "",
    "(",
    ")",
    ", ",
    "[",
    "]",
    quoted_name=False,
    native=False,
    note=(
        "You have access to functions (JSON Schema of their arguments shown):\n{tools}\n"
        "If you decide to call any of them, answer with only a Python list of the calls, in "
        "the format [func_name1(param_name1=value1, param_name2=value2), func_name2()], "
        "and no other text."
    ),
    layout_of=PYTHONIC_FAMILY,
    results_as_user=True,
)


# gpt-oss (OpenAI's harmony format): a call is a message to the recipient functions.NAME on
# the commentary channel, JSON arguments, ended by <|call|> (a stop token: one call per
# message). After the generation prompt `<|start|>assistant` the model writes
#     <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
# or its answer <|channel|>final<|message|>TEXT; after its thinking (analysis channel) it
# writes `<|start|>assistant` first, which the reasoning format drops (core/reasoning).
HARMONY = ToolFormat(
    "harmony",
    "<|channel|>commentary to=functions.",
    "<|channel|>commentary to=functions.",
    " <|constrain|>json<|message|>",
    "<|call|>",
    "",
    max_calls=1,
    quoted_name=False,
    answer_opener="<|channel|>final<|message|>",
    stop_tail=True,
)


def tool_format(template: ChatTemplate) -> ToolFormat:
    """The call format of `template`, by the markers in its source."""
    return _format_of(template.source)


@lru_cache(maxsize=32)
def _format_of(source: str) -> ToolFormat:
    if "<｜tool▁calls▁begin｜>" in source and "function<｜tool▁sep｜>" in source.replace(
        "' + tool['type'] + '", "function"
    ):
        return DEEPSEEK
    if "<function=" in source and "<parameter=" in source and "<tool_call>" in source:
        return QWEN3_CODER
    if "params_name1=params_value1" in source:  # "[func_name1(params_name1=params_value1, ..."
        return PYTHONIC
    if "[TOOL_CALLS]" in source:
        return MISTRAL if "[TOOL_CALLS] [" in source else replace(MISTRAL, opener="[TOOL_CALLS][")
    if "<tool_call>" in source and "<function=" not in source and "<arg_key>" not in source:
        return HERMES
    if "<|start_header_id|>" in source and ("ipython" in source or "<|python_tag|>" in source):
        return LLAMA3
    if "<|channel|>" in source and "to=" in source and "functions." in source:
        return HARMONY
    if "<start_of_turn>" in source:
        return GEMMA3
    return GENERIC


# -- reading calls back ----------------------------------------------------------------------


@dataclass
class ReadCall:
    """A call read so far: its arguments text (complete, or the part written so far), whether
    its tail was read, whether its arguments are a whole JSON value, and where it starts."""

    name: str
    arguments: str
    done: bool
    whole: bool = False
    start: int = 0


@dataclass
class ReadCalls:
    """calls: the calls read; closed: the layout ended (the closer, or the last call done
    where nothing has to follow); strayed: the text left the layout after `calls`; pending:
    where a call whose name or arguments are not whole yet starts (None: none)."""

    calls: list[ReadCall]
    closed: bool = False
    strayed: bool = False
    pending: int | None = None


_PARTIAL = -1


def _expect(text: str, pos: int, fixed: str) -> int | None:
    """The position after `fixed` at `pos`; _PARTIAL if the text ends inside it; None if the
    text differs."""
    if text.startswith(fixed, pos):
        return pos + len(fixed)
    return _PARTIAL if fixed.startswith(text[pos:]) else None


def read_calls(
    fmt: ToolFormat,
    text: str,
    names: frozenset[str],
    max_calls: int | None,
    final: bool,
    memo: dict[int, list[int]] | None = None,
) -> ReadCalls:
    """The calls in `text`, a prefix of the format's layout (all of it when `final`), up to
    where the text leaves the layout, if it does (`strayed`). `memo`: kept by a caller that
    reads a growing text again, so arguments are scanned once (see json_value_end)."""
    pos = _expect(text, 0, fmt.opener)
    if pos is None or pos == _PARTIAL:
        return ReadCalls([], strayed=pos is None)
    calls: list[ReadCall] = []
    while True:
        start = pos
        call, pos = _read_call(fmt, text, pos, names, final, memo)
        if call is None:
            return ReadCalls(calls, strayed=pos is None, pending=start if pos == _PARTIAL else None)
        calls.append(call)
        if not call.done:
            pending = None if call.whole else call.start
            return ReadCalls(calls, strayed=pos is None, pending=pending)
        more = max_calls is None or len(calls) < max_calls
        after = _expect(text, pos, fmt.separator) if more and fmt.separator else None
        if after is not None and after != _PARTIAL:
            pos = after
            continue
        end = _expect(text, pos, fmt.closer)
        if end is None or end == _PARTIAL:  # inside the separator or the closer, or neither
            return ReadCalls(calls, strayed=end is None and after is None)
        if end != len(text):
            return ReadCalls(calls, strayed=True)
        return ReadCalls(calls, closed=bool(fmt.closer) or final)


def _read_call(
    fmt: ToolFormat,
    text: str,
    pos: int,
    names: frozenset[str],
    final: bool,
    memo: dict[int, list[int]] | None,
) -> tuple[ReadCall | None, int | None]:
    """(the call at pos, the position after it); (None, _PARTIAL) before its name is whole,
    (None, None) where the text is not a call."""
    pos = _expect(text, pos, fmt.head)
    if pos is None or pos == _PARTIAL:
        return None, pos
    if pos == len(text):
        return None, _PARTIAL
    if not fmt.quoted_name:
        return _read_bare_call(fmt, text, pos, names, final, memo)
    if text[pos] != '"':
        return None, None
    close = text.find('"', pos + 1)
    if close == -1:
        typed = text[pos + 1 :]
        return None, _PARTIAL if any(n.startswith(typed) for n in names) else None
    name = text[pos + 1 : close]
    return _read_rest(fmt, text, pos, close + 1, name, names, final, memo)


def _read_bare_call(
    fmt: ToolFormat,
    text: str,
    pos: int,
    names: frozenset[str],
    final: bool,
    memo: dict[int, list[int]] | None,
) -> tuple[ReadCall | None, int | None]:
    """A call whose name is written as it is (not a JSON string): the longest tool name
    there, then the arguments' key."""
    end = pos
    while end < len(text) and (text[end].isalnum() or text[end] in "_-"):
        end += 1
    typed = text[pos:end]
    if end == len(text):
        return None, _PARTIAL if any(n.startswith(typed) for n in names) else None
    return _read_rest(fmt, text, pos, end, typed, names, final, memo)


def _read_rest(
    fmt: ToolFormat,
    text: str,
    pos: int,
    after_name: int,
    name: str,
    names: frozenset[str],
    final: bool,
    memo: dict[int, list[int]] | None,
) -> tuple[ReadCall | None, int | None]:
    """The call from its name on (`pos`: where the name starts; `after_name`: after it)."""
    if name not in names:
        return None, None
    start, pos = pos - len(fmt.head), _expect(text, after_name, fmt.args_key)
    if pos is None:
        return None, None
    if pos == _PARTIAL:
        return ReadCall(name, "", False, start=start), _PARTIAL
    end, whole = json_value_end(text, pos, final, memo)
    if not whole:
        return ReadCall(name, text[pos:end], False, start=start), end
    after = _expect(text, end, fmt.tail)
    if after is None:  # the arguments are read, what follows is not the call's tail
        return ReadCall(name, text[pos:end], False, True, start), None
    if after == _PARTIAL and final and fmt.stop_tail and end == len(text):
        after = end  # the tail was the stop token, not in the text
    done = after != _PARTIAL
    return ReadCall(name, text[pos:end], done, True, start), after if done else end


def json_value_end(
    text: str, pos: int, final: bool, memo: dict[int, list[int]] | None = None
) -> tuple[int, bool]:
    """(end, whole): text[pos:end] surely belongs to the JSON value starting at `pos`; whole:
    the value ends there. A number or literal at the end of the text may go on, so it is
    held back unless `final`. With `memo`, an unfinished object, array or string's scan
    state is kept under `pos` and the next call (on the same text, grown) resumes it: a
    streamed call's arguments cost linear time, not quadratic."""
    n = len(text)
    if pos < n and text[pos] not in '{["':
        i = pos
        while i < n and text[i] in "-+.0123456789eEtrufalsn":
            i += 1
        if i < n or final:
            return i, i > pos
        return pos, False
    state = memo.get(pos) if memo is not None else None
    if state is not None and state[1] < 0:  # scanned whole before
        return state[0], True
    start, depth, in_string, escaped = state or (pos, 0, False, False)
    for i in range(start, n):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
                if depth == 0:
                    return _ended(memo, pos, i + 1)
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return _ended(memo, pos, i + 1)
    if memo is not None and n > pos:
        memo[pos] = [n, depth, in_string, escaped]
    return n, False


def _ended(memo: dict[int, list[int]] | None, pos: int, end: int) -> tuple[int, bool]:
    if memo is not None:
        memo[pos] = [end, -1, False, False]  # depth -1: whole
    return end, True


class CallReader:
    """One choice's text, read as it grows: an answer (content) or calls in `fmt`'s layout.

    `feed(piece)` returns the OpenAI delta entries the piece completes, `finish()` the rest;
    then `tool_calls`, `content` and `cut`. A call cut short is never returned as a call.
    The details: docs/design/server.md#call-formats."""

    def __init__(
        self,
        fmt: ToolFormat,
        names: frozenset[str],
        *,
        answers: bool,
        max_calls: int | None,
    ) -> None:
        self.fmt, self.names, self.answers, self.max_calls = fmt, names, answers, max_calls
        self.text = ""
        self.mode = "calls" if not answers else ""  # "", "content" or "calls"
        self._sent: list[list[Any]] = []  # [id, name, arguments sent] per call
        self._read: ReadCalls | None = None
        self._memo: dict[int, list[int]] = {}  # read_calls' scans of the arguments so far
        self._finished = False

    def feed(self, piece: str) -> list[dict[str, Any]]:
        self.text += piece
        if self.mode == "content":
            return [{"content": piece}] if piece else []
        return self._advance(final=False)

    def finish(self) -> list[dict[str, Any]]:
        self._finished = True
        if self.mode == "":  # empty, or a proper prefix of the marker: an answer
            self.mode = "content"
            return [{"content": self.text}] if self.text else []
        if self.mode == "content":
            return []
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[dict[str, Any]]:
        if self.mode == "":
            opener = self.fmt.answer_opener
            if self.text.startswith(self.fmt.marker):
                self.mode = "calls"
            elif opener and self.text.startswith(opener):  # an answer's header: dropped
                self.mode, self.text = "content", self.text[len(opener) :]
                return [{"content": self.text}] if self.text else []
            elif not self.fmt.marker.startswith(self.text) and not (
                opener.startswith(self.text) and not final and opener
            ):
                self.mode = "content"
                return [{"content": self.text}]
            else:
                return []
        read = read_calls(self.fmt, self.text, self.names, self.max_calls, final, self._memo)
        if read.strayed and not read.calls and self.answers:  # not a call after all: an answer
            self.mode = "content"
            return [{"content": self.text}]
        # Calls whose text strays later (not under the calls' constraint) keep what was read.
        self._read = read
        return self._deltas(read.calls)

    def _deltas(self, calls: list[ReadCall]) -> list[dict[str, Any]]:
        out = []
        for i, call in enumerate(calls):
            if i == len(self._sent):
                self._sent.append([self.fmt.new_id(), call.name, 0])
                out.append(
                    {
                        "index": i,
                        "id": self._sent[i][0],
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                )
            fresh = call.arguments[self._sent[i][2] :]
            if fresh:
                self._sent[i][2] = len(call.arguments)
                out.append({"index": i, "function": {"arguments": fresh}})
        return [{"tool_calls": [d]} for d in out]

    @property
    def content(self) -> str | None:
        if self.mode == "content":
            return self.text
        read = self._read
        if self.mode != "calls" or not self._finished or read is None or read.pending is None:
            return None
        unfinished = self.text if not self.tool_calls else self.text[read.pending :]
        return unfinished or None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        calls = self._read.calls if self._read is not None and self.mode == "calls" else []
        return [
            {
                "id": sent[0],
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for sent, call in zip(self._sent, calls, strict=False)
            if call.whole
        ]

    @property
    def cut(self) -> bool:
        """The text is calls that did not end (a call, its tail or the closer missing, or
        text after them)."""
        return self.mode == "calls" and (self._read is None or not self._read.closed)
