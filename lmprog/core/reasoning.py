"""A reasoning model's output, split into its thinking and its answer by the family's rules.

    fmt = reasoning_format(template.source)          # chosen from the chat template, or
    fmt = named_format("deepseek-r1")                # named (lmprog serve --reasoning-parser)
    opened = fmt.prompt_state(prompt)                # "open", "closed" or "none"
    reasoning, answer = fmt.split(text, opened)      # a finished output
    splitter = fmt.splitter(opened)                  # a streamed one
    for kind, piece in splitter.feed(chunk): ...     # kind "reasoning" or "answer"
    splitter.finish()

Families: deepseek-r1, qwen3, magistral, gpt-oss; their markers, and when the model starts
thinking: docs/design/reasoning.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

PromptState = Literal["open", "closed", "none"]
REASONING, ANSWER = "reasoning", "answer"


@dataclass(frozen=True)
class ReasoningFormat:
    """name: the family; start/end: the block's markers; forced: output before the end marker
    is reasoning even without the start marker (DeepSeek-R1); answer_header: a header the
    model writes before its answer, up to and including this text (gpt-oss:
    `<|channel|>final<|message|>`), dropped from the answer unless it names a recipient
    (`call_mark`: a gpt-oss tool call's header, `<|channel|>commentary to=functions.f
    <|constrain|>json<|message|>`, is kept for the tool-call reader); after_end: what the
    model writes after the end marker before the next part (gpt-oss: `<|start|>assistant`,
    a message's role; else whitespace); answer_prefix: the header a constrained answer is
    given (gpt-oss: its final channel's)."""

    name: str
    start: str
    end: str
    forced: bool = False
    answer_header: str = ""
    call_mark: str = ""
    after_end: str = ""
    answer_prefix: str = ""

    def prompt_state(self, prompt: str) -> PromptState:
        """How the prompt leaves the block: its end opens one ("open"), closes one
        ("closed": thinking is off), or neither ("none")."""
        tail = prompt.rstrip()
        if self.start and tail.endswith(self.start):
            return "open"
        if tail.endswith(self.end):
            return "closed"
        return "none"

    @property
    def marker_texts(self) -> tuple[str, ...]:
        """The markers and headers the model writes around its thinking and answer (what a
        constraint after the thinking spells: `fsm.compose.special_markers` finds which of
        them are special tokens of a tokenizer)."""
        return (self.start, self.end, self.answer_header, self.after_end, self.answer_prefix)

    def marked_by_special_tokens(self, tokenizer: Any) -> bool:
        """Whether a special token of `tokenizer` is part of the markers (gpt-oss's
        `<|channel|>`, Magistral's `[THINK]` where they are control tokens): its output must
        then be detokenized with them (SamplingParams.skip_special_tokens=False) to split."""
        markers = (self.start, self.end, self.answer_header, self.after_end)
        specials = getattr(tokenizer, "all_special_tokens", None) or ()
        return any(tok and any(tok in m for m in markers) for tok in specials)

    def split(self, text: str, state: PromptState = "none") -> tuple[str | None, str]:
        """(reasoning or None, answer) of a whole output."""
        splitter = self.splitter(state)
        parts: dict[str, list[str]] = {REASONING: [], ANSWER: []}
        for kind, piece in splitter.feed(text) + splitter.finish():
            parts[kind].append(piece)
        reasoning = "".join(parts[REASONING]) if splitter.reasoned else None
        return reasoning, "".join(parts[ANSWER])

    def splitter(self, state: PromptState = "none") -> ReasoningSplitter:
        return ReasoningSplitter(self, state)


FORMATS: dict[str, ReasoningFormat] = {
    "deepseek-r1": ReasoningFormat("deepseek-r1", "<think>", "</think>", forced=True),
    "qwen3": ReasoningFormat("qwen3", "<think>", "</think>"),
    "magistral": ReasoningFormat("magistral", "[THINK]", "[/THINK]"),
    "gpt-oss": ReasoningFormat(
        "gpt-oss",
        "<|channel|>analysis<|message|>",
        "<|end|>",
        answer_header="<|message|>",
        call_mark=" to=",
        after_end="<|start|>assistant",
        answer_prefix="<|channel|>final<|message|>",
    ),
}
# other servers' names for the same rules (SGLang's and vLLM's --reasoning-parser)
ALIASES = {
    "deepseek_r1": "deepseek-r1",
    "deepseek-v3": "qwen3",
    "deepseek_v3": "qwen3",
    "qwen3-thinking": "deepseek-r1",
    "qwen3_thinking": "deepseek-r1",
    "gpt_oss": "gpt-oss",
    "mistral": "magistral",
}


def named_format(name: str) -> ReasoningFormat | None:
    """The format called `name` ("none": no reasoning); ValueError naming the known ones."""
    if name == "none":
        return None
    key = ALIASES.get(name, name)
    if key not in FORMATS:
        known = ", ".join(sorted([*FORMATS, "none", "auto"]))
        raise ValueError(f"unknown reasoning parser {name!r}; known: {known}")
    return FORMATS[key]


def reasoning_format(template_source: str, name: str | None = "auto") -> ReasoningFormat | None:
    """The reasoning format `name` gives ("auto" or None: the one the chat template's source
    shows; None when it shows none)."""
    if name not in (None, "auto"):
        return named_format(name)
    source = template_source
    if "<|channel|>" in source and "analysis" in source:
        return FORMATS["gpt-oss"]
    if "[THINK]" in source and "[/THINK]" in source:
        return FORMATS["magistral"]
    if "</think>" in source:
        # DeepSeek-R1's templates ("<｜Assistant｜>") start the answer thinking; DeepSeek-V3.1's
        # switch it on and off with `thinking` and write the block themselves.
        forced = "<｜Assistant｜>" in source and "thinking is defined" not in source
        return FORMATS["deepseek-r1" if forced else "qwen3"]
    return None


class ReasoningSplitter:
    """Splits a streamed output: `feed(piece)` returns the (kind, text) pieces that are sure,
    holding back a possible marker split across pieces and whitespace that may be trimmed;
    `finish()` the rest. `reasoned`: a reasoning part was seen (or the prompt opened one)."""

    def __init__(self, fmt: ReasoningFormat, state: PromptState = "none") -> None:
        self.fmt = fmt
        self._buf = ""
        self._trail = ""  # reasoning whitespace held until more reasoning follows
        if state == "open" or (state == "none" and fmt.forced):
            self._mode = "think"  # start marker optional: skipped if the model writes it
            self._maybe_start = True
            self.reasoned = state == "open"
        elif state == "closed":
            self._mode, self._maybe_start, self.reasoned = "answer", False, False
        else:
            self._mode, self._maybe_start, self.reasoned = "before", False, False
        self._lead = True  # at the start of the current part (whitespace dropped)

    def feed(self, piece: str) -> list[tuple[str, str]]:
        self._buf += piece
        out: list[tuple[str, str]] = []
        while True:
            step = self._step(final=False, out=out)
            if not step:
                return out

    def finish(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while self._step(final=True, out=out):
            pass
        if self._buf:
            kind = REASONING if self._mode in ("think", "header") else ANSWER
            if self._mode == "before":
                kind = ANSWER
            text = self._buf.rstrip() if kind == REASONING else self._buf
            self._emit(out, kind, text)
            self._buf = ""
        return out

    # Each step consumes what it can be sure of; True when it changed mode (run again).
    def _step(self, final: bool, out: list[tuple[str, str]]) -> bool:
        fmt, buf = self.fmt, self._buf
        if self._mode == "before":
            stripped = buf.lstrip()
            if stripped.startswith(fmt.start):
                self._buf = stripped[len(fmt.start) :]
                self._mode, self.reasoned, self._lead = "think", True, True
                return True
            if fmt.start.startswith(stripped) and not final:
                return False  # maybe the start marker: wait
            self._mode = "header" if fmt.answer_header else "answer"
            return True
        if self._mode == "think":
            if self._maybe_start:
                stripped = buf.lstrip()
                if stripped.startswith(fmt.start):
                    self._buf, self._maybe_start = stripped[len(fmt.start) :], False
                    self.reasoned = True
                    return True
                if fmt.start.startswith(stripped) and not final:
                    return False
                self._maybe_start = False
            at = buf.find(fmt.end)
            if at >= 0:
                self.reasoned = True
                self._emit(out, REASONING, buf[:at].rstrip())
                self._trail = ""
                self._buf = buf[at + len(fmt.end) :]
                self._mode = "header" if fmt.answer_header else "answer"
                self._lead = True
                return True
            keep = 0 if final else _partial_suffix(buf, fmt.end)
            self._emit(out, REASONING, buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        if self._mode == "header":
            return self._header(final, out)
        self._emit(out, ANSWER, buf)
        self._buf = ""
        return False

    def _header(self, final: bool, out: list[tuple[str, str]]) -> bool:
        """A message header before the answer (gpt-oss): the role written after the end
        marker dropped, then the header dropped up to its answer_header, or kept whole as
        the answer's start where it names a recipient (a tool call); text that opens no
        header is the answer as it is (a constrained answer written without one)."""
        fmt = self.fmt
        buf = self._buf.lstrip()
        if fmt.after_end and buf.startswith(fmt.after_end):
            buf = buf[len(fmt.after_end) :]
        elif fmt.after_end.startswith(buf) and buf and not final:
            return False
        opens = "<|" if fmt.answer_header.startswith("<|") else fmt.answer_header[:1]
        if not buf.startswith(opens) and not (opens.startswith(buf) and not final):
            self._buf, self._mode = buf, "answer"
            return True
        at = buf.find(fmt.answer_header)
        if at >= 0:
            header = buf[: at + len(fmt.answer_header)]
            keep = bool(fmt.call_mark) and fmt.call_mark in header
            self._buf = buf if keep else buf[len(header) :]
            self._mode, self._lead = "answer", True
            return True
        if final:  # no answer header: what follows is the answer
            self._buf, self._mode = buf, "answer"
            return True
        self._buf = buf
        return False

    def _emit(self, out: list[tuple[str, str]], kind: str, text: str) -> None:
        """Append text of `kind`, dropping the whitespace that opens a part and holding the
        reasoning's trailing whitespace until more reasoning follows."""
        if kind == REASONING:
            if self._lead:
                text = text.lstrip()
            if not text:
                return
            self._lead, self.reasoned = False, True
            body = text.rstrip()
            if not body:
                self._trail += text
                return
            text, self._trail = self._trail + body, text[len(body) :]
        else:
            self._trail = ""
            if self._lead:
                text = text.lstrip()
                if not text:
                    return
                self._lead = False
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
