"""`select` on a completions endpoint: choice logprobs from echoed prompt logprobs.

One request scores every choice; the tokens overlapping a choice's characters are its
score (a token straddling the boundary counts with the choice; no token healing).
Design: docs/design/endpoints.md.
"""

from __future__ import annotations

from typing import Any

from lmprog.core.errors import BackendError
from lmprog.core.protocol import ChoiceScore

# What "no context" is on an endpoint: the first token of a prompt gets no logprob, and a
# BOS token cannot be sent as text, so unconditional scores follow a single newline.
UNCONDITIONAL_CONTEXT = "\n"


def echoed_spans(choice: Any, full: str) -> list[tuple[int, int, float | None]]:
    """(start, end, logprob) of each echoed prompt token of `full`, in order."""
    lp = choice.logprobs
    if lp is None or not lp.tokens or lp.token_logprobs is None:
        raise BackendError(
            "the endpoint returned no prompt logprobs (echo=True, logprobs=0), so select cannot "
            "score choices there; use gen(...) instead, or a server whose /v1/completions echoes logprobs"
        )
    shift = max(0, (choice.text or "").find(full))  # a server that echoes a BOS marker first
    offsets = lp.text_offset
    if offsets is None or len(offsets) != len(lp.tokens):
        offsets = _offsets_from_end(lp.tokens, len(full) + shift, choice.text or "")
    spans = []
    for i, (start, logprob) in enumerate(zip(offsets, lp.token_logprobs)):
        end = offsets[i + 1] if i + 1 < len(offsets) else start + len(lp.tokens[i])
        spans.append((start - shift, end - shift, logprob))
    return [(s, e, p) for s, e, p in spans if s < len(full)]  # drop generated tokens, if any


def _offsets_from_end(tokens: list[str], prompt_end: int, echoed: str) -> list[int]:
    """Token start offsets without text_offset: laid forward when the token strings spell
    the echoed text, else backward from where the prompt ends (a BOS marker, byte tokens)."""
    if "".join(tokens) == echoed:
        starts, at = [], 0
        for t in tokens:
            starts.append(at)
            at += len(t)
        return starts
    starts, at = [], prompt_end
    for t in reversed(tokens):
        at -= len(t)
        starts.append(at)
    return starts[::-1]


def choice_logprobs(
    spans: list[tuple[int, int, float | None]], boundary: int, choice: str
) -> tuple[float, ...]:
    """Logprobs of the tokens that overlap text after `boundary` (the choice's characters)."""
    picked = tuple(float(p) for s, e, p in spans if e > boundary and p is not None)
    if not picked:
        raise BackendError(
            f"choice {choice!r} got no scored token from the endpoint (the first token of a "
            "prompt has no logprob, and the prompt was empty)"
        )
    return picked


def score_choices(
    choices: list[Any], prompt: str, options: tuple[str, ...], unconditional: bool
) -> tuple[list[ChoiceScore], int]:
    """ChoiceScores from one echoed response (choices in request order: every
    prompt+option, then, with `unconditional`, every UNCONDITIONAL_CONTEXT+option); and
    the number of prompt tokens before the first option."""
    n = len(options)
    scores = []
    first_spans: list[tuple[int, int, float | None]] = []
    for i, option in enumerate(options):
        spans = echoed_spans(choices[i], prompt + option)
        first_spans = first_spans or spans
        cond = choice_logprobs(spans, len(prompt), option)
        free = None
        if unconditional:
            context = UNCONDITIONAL_CONTEXT
            free = choice_logprobs(
                echoed_spans(choices[n + i], context + option), len(context), option
            )
        scores.append(
            ChoiceScore(token_logprobs=cond, token_ids=(), unconditional_token_logprobs=free)
        )
    prompt_tokens = sum(1 for _, e, _ in first_spans if e <= len(prompt))
    return scores, prompt_tokens
