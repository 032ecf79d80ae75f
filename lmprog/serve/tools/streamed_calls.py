"""Streaming the calls of a tool-call layout read as text (xml_calls, pythonic_calls).

The OpenAI deltas of each call begun (its id and name once, then its arguments' JSON text as it
grows) and the finished calls, over the layout's own `_calls()`.
"""

from __future__ import annotations

import json
from typing import Any

# (name, arguments or None while the call is open, the arguments' JSON text known so far)
Call = tuple[str, dict[str, Any] | None, str]


class StreamedCalls:
    """A reader's `_deltas()` and `tool_calls` from its `_calls()`; the reader sets `fmt`
    (for call ids), `mode` and `_sent` (id, arguments text sent) per call."""

    fmt: Any
    mode: str
    _sent: list[tuple[str, str]]

    def _calls(self) -> list[Call]:
        raise NotImplementedError

    def _deltas(self) -> list[dict[str, Any]]:
        out = []
        for i, (name, _, known) in enumerate(self._calls()):
            if i == len(self._sent):
                self._sent.append((self.fmt.new_id(), ""))
                first = {"index": i, "id": self._sent[i][0], "type": "function"}
                out.append({**first, "function": {"name": name, "arguments": ""}})
            call_id, sent = self._sent[i]
            # the arguments known only grow (in text the constraint lets through)
            if len(known) > len(sent) and known.startswith(sent):
                self._sent[i] = (call_id, known)
                out.append({"index": i, "function": {"arguments": known[len(sent) :]}})
        return [{"tool_calls": [d]} for d in out]

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        if self.mode != "calls":
            return []
        return [
            {
                "id": sent[0],
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
            for sent, (name, args, _) in zip(self._sent, self._calls(), strict=False)
            if args is not None
        ]
