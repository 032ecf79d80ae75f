"""Prompt text that knows where its control tokens may be, and its tokenization.

    ids = encode_prompt(tokenizer, prompt)   # a Prompt, or a str: the caller's whole prompt

A `Prompt` is the text plus the character spans in which special-token strings are control
tokens (the template's markers, the model's own output); everywhere else they are encoded
as plain text, so a user's text cannot close their turn. Design: docs/design/foundations.md.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

Spans = tuple[tuple[int, int], ...]


class Prompt(str):
    """A str whose `control` spans (sorted (start, end) character ranges) are where
    special-token strings are control tokens; outside them they are text. Concatenating or
    slicing gives a plain str (use `extend`)."""

    control: Spans

    def __new__(cls, text: str, control: Sequence[tuple[int, int]] = ()) -> Prompt:
        self = super().__new__(cls, text)
        self.control = _merged(control, len(text))
        return self

    def __reduce__(self) -> Any:
        return (Prompt, (str(self), self.control))


def control_spans(prompt: str) -> Spans | None:
    """The control spans of `prompt`, or None for a plain str (every special token counts)."""
    return prompt.control if isinstance(prompt, Prompt) else None


def extend(prompt: str, text: str) -> str:
    """`prompt + text`, keeping `prompt`'s control spans (`text` is user text)."""
    if isinstance(prompt, Prompt):
        return Prompt(str(prompt) + text, prompt.control)
    return prompt + text


def extend_control(prompt: str, text: str) -> str:
    """`prompt + text`, `text` being control text (template markers, the model's own output:
    its special-token strings are control tokens)."""
    spans = control_spans(prompt)
    if spans is None or not text:
        return prompt + text
    return Prompt(str(prompt) + text, (*spans, (len(prompt), len(prompt) + len(text))))


def cut(prompt: str, end: int) -> str:
    """`prompt[:end]`, keeping a `Prompt`'s control spans within it."""
    spans = control_spans(prompt)
    if spans is None:
        return prompt[:end]
    return Prompt(str(prompt)[:end], [(a, min(b, end)) for a, b in spans if a < end])


def user_text(like: str, text: str) -> str:
    """`text` as user text when `like` is a `Prompt` (no control spans), else a plain str."""
    return Prompt(text) if isinstance(like, Prompt) else text


def _merged(spans: Sequence[tuple[int, int]], length: int) -> Spans:
    out: list[tuple[int, int]] = []
    for start, end in sorted((max(0, int(a)), min(length, int(b))) for a, b in spans):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return tuple(out)


# ---- tokenization --------------------------------------------------------------------------

_lock = threading.Lock()
_special: dict[int, tuple[Any, re.Pattern[str] | None]] = {}  # id(tokenizer) -> (it, pattern)


def special_token_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """A regex matching the tokenizer's special added tokens (longest first), or None."""
    key = id(tokenizer)
    with _lock:
        hit = _special.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    strings: set[str] = set()
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(decoder, dict):
        for token in decoder.values():
            content = getattr(token, "content", None)
            if isinstance(content, str) and content and getattr(token, "special", True):
                strings.add(content)
    for content in getattr(tokenizer, "all_special_tokens", None) or ():
        if isinstance(content, str) and content:
            strings.add(content)
    pattern = (
        re.compile("|".join(re.escape(s) for s in sorted(strings, key=len, reverse=True)))
        if strings
        else None
    )
    with _lock:
        _special[key] = (tokenizer, pattern)  # keeps the tokenizer alive: a handful per process
    return pattern


def injected_spans(tokenizer: Any, prompt: str) -> list[tuple[int, int]]:
    """Where `prompt` holds special-token strings outside its control spans (none for a
    plain str): the ones `encode_prompt` encodes as text."""
    control = control_spans(prompt)
    if control is None:
        return []
    pattern = special_token_pattern(tokenizer)
    if pattern is None:
        return []
    out = []
    for m in pattern.finditer(prompt):
        if not any(a <= m.start() and m.end() <= b for a, b in control):
            out.append(m.span())
    return out


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of `prompt` (no BOS added): a plain str as the tokenizer reads it; a
    `Prompt`'s special-token strings outside its control spans as plain text."""
    text = str(prompt)
    injected = injected_spans(tokenizer, prompt)
    if not injected:
        return list(tokenizer.encode(text, add_special_tokens=False))
    ids: list[int] = []
    pos = 0
    for start, end in injected:
        if pos < start:
            ids += tokenizer.encode(text[pos:start], add_special_tokens=False)
        ids += encode_as_text(tokenizer, text[start:end])
        pos = end
    if pos < len(text):
        ids += tokenizer.encode(text[pos:], add_special_tokens=False)
    return ids


def encode_as_text(tokenizer: Any, text: str) -> list[int]:
    """`text` tokenized with no added token recognised (a special-token string becomes the
    tokens of its characters), as transformers' `split_special_tokens` reads it, thread-safe."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "model"):
        try:
            return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        except TypeError:  # a tokenizer without the option: one token per character group
            return [t for ch in text for t in tokenizer.encode(ch, add_special_tokens=False)]

    def run(piece: str) -> list[int]:
        if backend.normalizer is not None:
            piece = backend.normalizer.normalize_str(piece)
        splits = [piece]
        if backend.pre_tokenizer is not None:
            splits = [s for s, _ in backend.pre_tokenizer.pre_tokenize_str(piece)]
        return [t.id for s in splits for t in backend.model.tokenize(s)]

    # After a newline, so a SentencePiece pre-tokenizer adds no word-start space here (the
    # text continues a prompt); the newline's own tokens are then dropped (transformers'
    # encode_marked_chat does the same).
    newline = run("\n")
    ids = run("\n" + text)
    if newline and ids[: len(newline)] == newline:
        return ids[len(newline) :]
    return run(text)


# ---- whole-conversation renders (a chat template over messages) ------------------------------
# A render interleaves the template's markers with message contents; to tell them apart the
# special-token strings of every content are wrapped in these private-use characters first
# (transformers' mark_control_tokens does the same), then `unmark` takes them out again.
_OPEN, _CLOSE = "\U000f0000", "\U000f0001"


def mark_special(obj: Any, tokenizer: Any) -> Any:
    """`obj` (a str, or lists/dicts of them: messages, tools) with the special-token strings
    of every string value wrapped in markers; marker characters already there are dropped."""
    pattern = special_token_pattern(tokenizer)

    def mark(value: Any) -> Any:
        if isinstance(value, str):
            value = value.replace(_OPEN, "").replace(_CLOSE, "")
            return pattern.sub(lambda m: _OPEN + m.group(0) + _CLOSE, value) if pattern else value
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [mark(v) for v in value]
        return value

    return mark(obj)


def unmark(rendered: str) -> Prompt:
    """The `Prompt` of a render of `mark_special`ed values: the markers removed, the
    special-token strings they wrapped outside the control spans (text), everything else
    (the template's own text) inside them. A marker a template split from its token is
    dropped."""
    out: list[str] = []
    literal: list[tuple[int, int]] = []
    length = 0
    pos = 0
    while True:
        start = rendered.find(_OPEN, pos)
        stray = rendered.find(_CLOSE, pos)
        if stray != -1 and (start == -1 or stray < start):  # a lone closing marker
            out.append(rendered[pos:stray])
            length += stray - pos
            pos = stray + 1
            continue
        if start == -1:
            out.append(rendered[pos:])
            length += len(rendered) - pos
            break
        end = rendered.find(_CLOSE, start + 1)
        nested = rendered.find(_OPEN, start + 1)
        out.append(rendered[pos:start])
        length += start - pos
        if end == -1 or (nested != -1 and nested < end):  # a lone opening marker
            pos = start + 1
            continue
        token = rendered[start + 1 : end]
        out.append(token)
        literal.append((length, length + len(token)))
        length += len(token)
        pos = end + 1
    text = "".join(out)
    control, at = [], 0
    for a, b in literal:
        if at < a:
            control.append((at, a))
        at = b
    if at < len(text):
        control.append((at, len(text)))
    return Prompt(text, control)
