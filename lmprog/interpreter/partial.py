"""The JSON value of a gen's text as it streams (`state.partial_iter`).

The text so far is read by pydantic-core's partial JSON mode (jiter's `allow_partial`); a
string still open and a number at the end are held back, so every value reported is one the
finished text also holds. Design: docs/design/frontend.md.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import from_json

_NUMBER_CHARS = frozenset("0123456789.eE+-")


class PartialJSON:
    """A growing text and its JSON value so far: `feed(piece)` and `finish()` return the
    value in a list when it changed (else an empty list); `value()` reads it any time."""

    def __init__(self, partial_strings: bool = False) -> None:
        self._parts: list[str] = []
        self._length = 0
        self._partial_strings = partial_strings
        self._in_string = False
        self._escaped = False
        self._string_start = 0  # where the open string's quote is (while _in_string)
        self._last: tuple[bool, Any] = (False, None)

    def feed(self, piece: str) -> list[Any]:
        self._scan(piece)
        return self._changed(self.value())

    def finish(self) -> list[Any]:
        """The value of the whole text, if it differs from the last one reported."""
        return self._changed(self.value(final=True))

    def _changed(self, now: tuple[bool, Any]) -> list[Any]:
        if not now[0] or now == self._last:
            return []
        self._last = now
        return [now[1]]

    def _scan(self, piece: str) -> None:
        """Append `piece`, keeping whether the text ends inside a string (linear overall)."""
        in_string, escaped, start = self._in_string, self._escaped, self._string_start
        for i, ch in enumerate(piece, self._length):
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string, start = True, i
        self._in_string, self._escaped, self._string_start = in_string, escaped, start
        self._parts.append(piece)
        self._length += len(piece)

    @property
    def text(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def value(self, final: bool = False) -> tuple[bool, Any]:
        """(whether there is a value yet, the value). `final`: the text is all there is; a
        whole JSON text is then read as it is (a number at its end is complete)."""
        text = self.text
        if final:
            try:
                return True, from_json(text)
            except ValueError:  # cut short (max_tokens): what is complete of it
                pass
        text = self._complete_part(text)
        if not text.strip():
            return False, None
        mode: Any = "trailing-strings" if self._partial_strings else True
        try:
            return True, from_json(text, allow_partial=mode)
        except ValueError as e:
            raise ValueError(
                f"the text so far is not the start of a JSON value ({e}): partial values "
                f"are read from a gen whose output is JSON (json_schema=...); text: {text[:80]!r}"
            ) from None

    def _complete_part(self, text: str) -> str:
        if self._in_string:
            return text if self._partial_strings else text[: self._string_start]
        end = len(text)
        while end and text[end - 1] in _NUMBER_CHARS:
            end -= 1
        if end < len(text) and text[end] in "-0123456789":  # a number ends the text
            return text[:end]
        return text  # (a trailing "e" of true/false is no number: it starts with a letter)
