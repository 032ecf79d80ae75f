"""Compressed FSM and jump-forward: append the text a constraint forces in one step.

    r = jump_forward(guide, output_ids, tokenizer, max_new_tokens=...)
    output_ids = r.apply(output_ids)   # engine: drop r.drop_last_n_tokens KV, feed the new ids

The forced bytes are llguidance's, cached per position on the index; they are re-encoded
with the last `lookback` tokens, so the result is the tokenizer's own tokenization. On return
the guide has advanced through exactly the result's tokens. Design: docs/design/constraints.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmprog.fsm.guide import Guide

MAX_FORCED_BYTES = 4096  # one jump appends at most this much; the rest in the next
MAX_SEGMENTS = 16  # texts and special tokens one jump appends, alternating
_FORCED_SPECIAL = re.compile(rb"\xff\[(\d+)\]")  # llguidance's forced bytes: b"\xff[id]"


@dataclass(frozen=True)
class JumpResult:
    """Roll back `drop_last_n_tokens` output tokens, then append `new_token_ids`."""

    drop_last_n_tokens: int = 0
    new_token_ids: tuple[int, ...] = ()

    @property
    def is_noop(self) -> bool:
        return not self.new_token_ids and not self.drop_last_n_tokens

    def apply(self, output_ids: Sequence[int]) -> list[int]:
        """The output ids after the jump (a new list)."""
        kept = len(output_ids) - self.drop_last_n_tokens
        return [*output_ids[:kept], *self.new_token_ids]


NOOP = JumpResult()


def forced_text(guide: Guide) -> str:
    """The text the constraint forces next from the guide's position ('' if none).

    Cut at the last complete UTF-8 character; the full bytes are `guide.forced_bytes()`.
    """
    return _utf8_prefix(guide.forced_bytes()).decode()


def jump_forward(
    guide: Guide,
    output_ids: Sequence[int],
    tokenizer: Any,
    *,
    enabled: bool = True,
    lookback: int = 2,
    max_new_tokens: int | None = None,
) -> JumpResult:
    """Append the forced text after `output_ids`, retokenizing the boundary; mutates `guide`.

    `output_ids` are the tokens generated under this constraint so far (the guide advanced
    through exactly these). `tokenizer` must have `encode(text, add_special_tokens=False)`.
    `max_new_tokens` bounds len(new) - drop (the engine's remaining max_tokens budget).
    A special token the grammar forces (`<|call|>`) is appended as its id, with the text
    before and after it; the retokenized window never reaches back across one. Returns NOOP when nothing is forced, when disabled, or when the tokenizer cannot
    reproduce the text byte for byte (e.g. SentencePiece's leading space).
    """
    if len(output_ids) != guide.num_tokens:
        raise ValueError(
            f"output_ids has {len(output_ids)} tokens but the guide advanced through {guide.num_tokens}"
        )
    if not enabled or guide.eos_consumed:
        return NOOP
    out = list(output_ids)
    drop, new = 0, list[int]()
    for _ in range(MAX_SEGMENTS):
        forced = guide.forced_bytes()[:MAX_FORCED_BYTES]
        room = None if max_new_tokens is None else max_new_tokens - len(new) + drop
        if not forced or (room is not None and room <= 0):
            break
        if forced.startswith(b"\xff"):  # a special token the grammar names: its id itself
            token = _forced_special(guide, forced)
            if token is None:
                break
            guide.advance(token)
            out.append(token)
            new.append(token)
            continue
        # the text up to the next special token, retokenized with the tokens before it
        plan = _retokenize(guide, out, forced.split(b"\xff", 1)[0], tokenizer, lookback)
        if plan is None:
            break
        step = _commit(guide, out, plan[0], plan[1] if room is None else plan[1][: room + plan[0]])
        if step.is_noop:
            break
        out = step.apply(out)
        if step.drop_last_n_tokens > len(new):
            drop += step.drop_last_n_tokens - len(new)
            new = []
        else:
            del new[len(new) - step.drop_last_n_tokens :]
        new.extend(step.new_token_ids)
        if b"\xff" not in forced or not guide.forced_bytes().startswith(b"\xff"):
            break  # (no special token forced, the text held back, or the end of it)
    return JumpResult(drop, tuple(new)) if drop or new else NOOP


# ---- internals -----------------------------------------------------------------------------


def _retokenize(
    guide: Guide, output_ids: list[int], forced: bytes, tokenizer: Any, lookback: int
) -> tuple[int, list[int]] | None:
    """(tokens to drop, tokens to append), before hold-back; None if not reproducible."""
    vocab = guide.index.vocab
    k = min(lookback, len(output_ids))
    for j in range(1, k + 1):
        if vocab.token_bytes[output_ids[-j]] is None:
            k = j - 1  # never across a special token: the window is text after the last one
            break
    while (
        0 < k < len(output_ids)
        and _starts_mid_char(vocab.token_bytes[output_ids[-k]])
        and vocab.token_bytes[output_ids[-k - 1]] is not None
    ):
        k += 1  # the window must start on a character boundary to be decodable on its own
    old = output_ids[len(output_ids) - k :]
    head = vocab.decode(old)
    text = _utf8_prefix(head + forced)
    if len(text) <= len(head):
        return None
    try:
        new = list(tokenizer.encode(text.decode(), add_special_tokens=False))
        if vocab.decode(new) != text:
            return None
    except (UnicodeDecodeError, ValueError):
        return None
    keep = 0
    while keep < min(len(old), len(new)) and old[keep] == new[keep]:
        keep += 1
    return k - keep, new[keep:]


def _commit(guide: Guide, output_ids: list[int], drop: int, new: list[int]) -> JumpResult:
    """Check the new tokens walk from the state before the dropped ones, hold back the last
    one if the model could extend it, and apply to the guide only if the jump adds text."""
    trial = guide.copy()
    trial.rollback(drop)
    try:
        trial.advance_all(new[:-1])
        if new and _extendable(trial, new[-1]):
            new = new[:-1]
        else:
            trial.advance_all(new[-1:])
    except ValueError:  # e.g. the tokenizer produced a special token: jump nothing
        return NOOP
    vocab = guide.index.vocab
    if len(vocab.decode(new)) <= len(vocab.decode(output_ids[len(output_ids) - drop :])):
        return NOOP
    guide.rollback(drop)
    guide.advance_all(new)
    return JumpResult(drop, tuple(new))


def _forced_special(guide: Guide, forced: bytes) -> int | None:
    """The special token `forced` starts with (llguidance spells one b"\\xff[id]"), if the
    guide takes it here (never EOS, which the engine decides)."""
    found = _FORCED_SPECIAL.match(forced)
    if found is None:
        return None
    token = int(found.group(1))
    if token == guide.index.eos_token_id or not guide.is_allowed(token):
        return None
    return token


def _extendable(guide: Guide, token_id: int) -> bool:
    """Could the model pick, instead of `token_id`, an allowed token that extends it?"""
    ids = guide.index.vocab.extensions(token_id)
    if len(ids) == 0:
        return False
    words = guide.bitmask_words()
    return bool(((words[ids >> 5] >> (ids & 31)) & 1).any())


def _starts_mid_char(b: bytes | None) -> bool:
    if not b:
        return False
    return 0x80 <= b[0] < 0xC0


def _utf8_prefix(b: bytes) -> bytes:
    """The longest prefix of b that is valid UTF-8 (cuts a character split at the end)."""
    try:
        b.decode()
        return b
    except UnicodeDecodeError as exc:
        return b[: exc.start]
