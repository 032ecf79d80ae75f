"""Token logprobs in the two OpenAI layouts.

chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
completions: {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}] | None,
              "text_offset": [...]}        (text_offset: where each token starts in the choice's text)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lmprog.core.protocol import GenerateResult, TokenLogprob


def _finite(x: float) -> float:
    """JSON has no -inf: a masked-out token's logprob is reported as -9999 (as OpenAI does)."""
    return x if math.isfinite(x) else -9999.0


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="surrogatepass"))


def visible_logprobs(result: GenerateResult) -> tuple[TokenLogprob, ...]:
    """The logprobs of the tokens in the text: a stop token (EOS, stop_token_ids) that ended
    the choice is not part of it, as in OpenAI's responses."""
    tokens = tuple(result.logprobs or ())
    if (
        isinstance(result.matched_stop, int)
        and tokens
        and tokens[-1].token_id == result.matched_stop
    ):
        return tokens[:-1]
    return tokens


def chat_logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": t.token,
                "logprob": _finite(t.logprob),
                "bytes": _bytes(t.token),
                "top_logprobs": [
                    {"token": a.token, "logprob": _finite(a.logprob), "bytes": _bytes(a.token)}
                    for a in t.top
                ],
            }
            for t in tokens
        ],
        "refusal": None,
    }


def completion_logprobs(
    texts: Sequence[str], tokens: Sequence[TokenLogprob | None], offsets: Sequence[int], top: int
) -> dict[str, Any]:
    """One entry per token: its text, its logprob (None where none exists: the first prompt
    token), its start offset in the choice's text; `top`: alternatives asked for."""
    assert len(texts) == len(tokens) == len(offsets)
    return {
        "tokens": list(texts),
        "token_logprobs": [_finite(t.logprob) if t is not None else None for t in tokens],
        "top_logprobs": [_top_dict(t) if t is not None else None for t in tokens] if top else None,
        "text_offset": list(offsets),
    }


def generated_logprobs(tokens: Sequence[TokenLogprob], start: int, top: int) -> dict[str, Any]:
    """completion_logprobs of generated tokens whose text begins at offset `start`."""
    return completion_logprobs(
        [t.token for t in tokens], tokens, running_offsets(tokens, start), top
    )


def _top_dict(t: TokenLogprob) -> dict[str, float]:
    return {a.token: _finite(a.logprob) for a in t.top}


def running_offsets(tokens: Sequence[TokenLogprob], start: int) -> list[int]:
    """Start offsets of generated tokens, each token's text following the previous one's."""
    out, pos = [], start
    for t in tokens:
        out.append(pos)
        pos += len(t.token)
    return out
