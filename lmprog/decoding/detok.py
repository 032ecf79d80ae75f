"""Streaming text out of generated tokens: incremental detokenizing and stop strings.

    tokens ──> IncrementalDetokenizer ──> final text pieces ──> StopMatcher ──> stream / result
               (holds an incomplete UTF-8     (holds a tail that could still become a stop
                character back)                 string; cuts at the first stop)

Both are per-request cursors with no shared state; the concatenation of everything they
emit is exactly the request's final text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lmprog.core.sampling import stop_regex_match
from lmprog.core.tokenizer import FastTokenizer

# Prompt tokens decoded with the first output tokens, so a tokenizer that drops a leading
# space when decoding a sequence's first token (SentencePiece) still yields " word".
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns token ids into text one token at a time, never splitting a character.

    Each step decodes a short window (the last emitted tokens plus the new ones) and emits
    what the new tokens added. While the window's text ends in U+FFFD the last character is
    incomplete (a multi-byte UTF-8 sequence split across tokens) and nothing is emitted;
    `flush()` emits whatever is left, replacement characters included, at the end.
    """

    def __init__(
        self, tokenizer: Any, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True
    ):
        context = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._decode_ids = text_decoder(tokenizer, skip_special_tokens)
        self._ids: list[int] = context
        self._prefix_offset = 0  # window start
        self._read_offset = len(context)  # tokens before this are already emitted
        self._n_context = len(context)
        self._skip = 0  # characters of the next piece already emitted (see `splice`)

    @property
    def token_ids(self) -> list[int]:
        """The generated ids pushed so far (without the prompt context)."""
        return self._ids[self._n_context :]

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now final ("" while a character is split)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def splice(self, drop: int, new_ids: Sequence[int]) -> str:
        """Replace the last `drop` tokens by `new_ids` (jump-forward's retokenization).

        The caller guarantees the new tokens' text extends the dropped tokens' text, so
        the output stays append-only: text already emitted for the dropped tokens is not
        emitted again.
        """
        cut = len(self._ids) - drop
        if drop < 0 or cut < self._n_context:
            raise ValueError(
                f"cannot drop {drop} tokens: only {len(self.token_ids)} were generated"
            )
        start = min(self._prefix_offset, cut)
        if start == cut:
            start = max(0, cut - _CONTEXT_TOKENS)
        if self._read_offset > cut:  # some dropped tokens' text is out already
            window = self._ids[start : self._read_offset]
            self._skip += len(self._decode(window)) - len(self._decode(self._ids[start:cut]))
            self._read_offset = cut
        self._prefix_offset = start
        self._ids[cut:] = list(new_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """The text of tokens not emitted yet (an incomplete character becomes U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if not final and (
            len(full_text) <= len(prefix_text) + self._skip or full_text.endswith(_REPLACEMENT)
        ):
            return ""
        piece = full_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        skipped = min(self._skip, len(piece))
        self._skip -= skipped
        return piece[skipped:]

    def _decode(self, ids: list[int]) -> str:
        return self._decode_ids(ids) if ids else ""


# transformers' fast tokenizers whose decode(ids, skip_special_tokens, clean_up_tokenization_spaces=
# False) is exactly their Rust tokenizer's decode(ids, skip_special_tokens) (v5 and v4 names).
_STOCK_DECODE = ("PreTrainedTokenizerBase.decode",)
_STOCK_FAST_DECODE = ("TokenizersBackend._decode", "PreTrainedTokenizerFast._decode")


def text_decoder(tokenizer: Any, skip_special_tokens: bool = True) -> Callable[[list[int]], str]:
    """ids -> tokenizer.decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces=False).

    For a transformers fast tokenizer with the stock decoding methods (no subclass override)
    that is its Rust tokenizer's decode: called directly, it gives the same text ~5x faster
    (0.6 instead of 3 us; the detokenizer decodes twice per generated token). Any other
    tokenizer is called through its own `decode`.
    """
    cls = type(tokenizer)
    backend: Any = getattr(tokenizer, "_tokenizer", None)  # the Rust tokenizer, if any
    if cls is FastTokenizer:  # lmprog's cached tokenizer: its decode is the Rust one's
        fast_decode = backend.decode
        return lambda ids: fast_decode(ids, skip_special_tokens=skip_special_tokens)
    stock = (
        getattr(getattr(cls, "decode", None), "__qualname__", None) in _STOCK_DECODE
        and getattr(getattr(cls, "_decode", None), "__qualname__", None) in _STOCK_FAST_DECODE
        and cls.__module__.startswith("transformers.")
        and hasattr(backend, "decode")
    )
    if stock:
        backend_decode = backend.decode
        return lambda ids: backend_decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(
        ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
    )


class StopMatcher:
    """Finds the first stop string to complete in streamed text; the stop is never emitted.

    `push(text)` returns the part of the text seen so far that can no longer be the start
    of a stop string; a tail that could be is held back until later text settles it.
    """

    def __init__(self, stops: Sequence[str]):
        for s in stops:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        self._stops = tuple(stops)
        self._held = ""
        self.matched: str | None = None

    def push(self, text: str) -> str:
        """Add text; return what is safe to emit. After a match, returns "" forever."""
        if self.matched is not None:
            return ""
        buf = self._held + text
        hit = self._first_stop(buf)
        if hit is not None:
            at, stop = hit
            self.matched = stop
            self._held = ""
            return buf[:at]
        keep = self._longest_stop_prefix_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    @property
    def held(self) -> str:
        """The tail held back while it could still become a stop string."""
        return self._held

    def flush(self) -> str:
        """At the end of generation: the held tail (it never became a stop)."""
        held, self._held = self._held, ""
        return held

    def _first_stop(self, buf: str) -> tuple[int, str] | None:
        """The stop occurrence that completes first (then the one starting first).

        "Completes first" makes the result independent of how the text was split into
        pieces: it is the stop a token-by-token check would have seen first.
        """
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            at = buf.find(stop)
            if at >= 0 and (best is None or (at + len(stop), at) < best[:2]):
                best = (at + len(stop), at, stop)
        return None if best is None else (best[1], best[2])

    def _longest_stop_prefix_suffix(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of some stop."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best


class TextStream:
    """Detokenizer + stop matcher for one request: push tokens, get final text pieces.

    Stop strings are only looked for once `arm()` has been called (after `min_tokens`
    output tokens); text before that is emitted as it comes. So are `stop_regex` patterns
    (SGLang's): once `re.search` finds one in the output so far, the stream ends there with
    the whole output kept (matched_stop is the pattern), as SGLang keeps it.
    """

    def __init__(
        self,
        tokenizer: Any,
        stops: Sequence[str],
        prompt_ids: Sequence[int] = (),
        armed: bool = True,
        stop_regex: Sequence[str] = (),
        skip_special_tokens: bool = True,
    ):
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
        self._stops = StopMatcher(stops) if stops else None
        self._regex = tuple(stop_regex)
        self._matched_regex: str | None = None
        self._armed = armed
        self._pieces: list[str] = []

    @property
    def matched_stop(self) -> str | None:
        if self._stops is not None and self._stops.matched is not None:
            return self._stops.matched
        return self._matched_regex

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def arm(self) -> None:
        self._armed = True

    def push(self, token_id: int) -> str:
        return self._emit(self._detok.push(token_id))

    def splice(self, drop: int, new_ids: Sequence[int]) -> str:
        """Jump-forward: the last `drop` tokens become `new_ids` (text only grows)."""
        return self._emit(self._detok.splice(drop, new_ids))

    def finish(self) -> str:
        """Flush everything held back (call once, when generation ends)."""
        piece = self._emit(self._detok.flush())
        if self._stops is not None and self._stops.matched is None:
            tail = self._stops.flush()
            self._pieces.append(tail)
            piece += tail
        return piece

    def _emit(self, text: str) -> str:
        if self._stops is not None and self._armed:
            text = self._stops.push(text)
        if text:
            self._pieces.append(text)
        if self._regex and self._armed and self.matched_stop is None:
            held = self._stops.held if self._stops is not None else ""
            self._matched_regex = stop_regex_match(self._regex, self.text + held)
            if self._matched_regex is not None and held:  # the whole output is kept
                text += self._stops.flush()  # type: ignore[union-attr]
                self._pieces.append(held)
        return text
