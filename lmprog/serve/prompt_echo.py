"""`echo` on /v1/completions: the prompt's own tokens, offsets and logprobs.

Prompt logprobs come from the Runtime's prefill (`generate(..., logprob_start_len=0)`); other
backends cannot return them. Design: docs/design/server.md#completions-and-echo.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmprog.core.protocol import Backend, TokenLogprob
from lmprog.core.sampling import SamplingParams

from .errors import APIError


@dataclass(frozen=True)
class EchoedPrompt:
    """One entry per prompt token: its text, its logprob (None for the first token, and for
    all of them unless asked) and its start offset in `text`."""

    text: str
    tokens: tuple[str, ...]
    logprobs: tuple[TokenLogprob | None, ...]
    offsets: tuple[int, ...]


def encode_prompt(tokenizer: Any, text: str) -> tuple[int, ...]:
    """Token ids of a text prompt as the Runtime makes them (BOS first if the model wants one)."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    bos = getattr(tokenizer, "bos_token_id", None)
    if getattr(tokenizer, "add_bos_token", False) and bos is not None and ids[:1] != [bos]:
        ids.insert(0, bos)
    return tuple(ids)


def token_offsets(tokenizer: Any, ids: Sequence[int]) -> tuple[str, list[str], list[int]]:
    """(decoded text, each token's text, each token's start offset in the text). Byte-level
    tokens that split a character make per-token decoding disagree with the whole; then
    each prefix is decoded (a token inside a character starts where that character does)."""
    text = tokenizer.decode(list(ids))
    pieces = [tokenizer.decode([i]) for i in ids]
    if "".join(pieces) == text:
        offsets, pos = [], 0
        for p in pieces:
            offsets.append(pos)
            pos += len(p)
        return text, pieces, offsets
    return text, pieces, [_prefix_len(tokenizer, ids[:k], text) for k in range(len(ids))]


def _prefix_len(tokenizer: Any, ids: Sequence[int], text: str) -> int:
    """Length of the text before `ids` end: a prefix ending inside a character decodes with
    replacement characters the whole text does not have; those are not counted."""
    prefix = tokenizer.decode(list(ids))
    while prefix.endswith("\ufffd") and not text.startswith(prefix):
        prefix = prefix[:-1]
    return len(prefix)


def echoed_prompt(backend: Backend, ids: Sequence[int], top: int | None) -> EchoedPrompt:
    """The prompt's text and token offsets, and with `top` not None its token logprobs
    (`top` alternatives each). Blocking: call from a worker thread."""
    tokenizer = backend.tokenizer
    text, pieces, offsets = token_offsets(tokenizer, ids)
    if top is None:
        return EchoedPrompt(text, tuple(pieces), (None,) * len(ids), tuple(offsets))
    if not _has_prompt_logprobs(backend):
        raise APIError(
            400,
            f"echo with logprobs needs prompt logprobs, which the "
            f"{type(backend).__name__} backend does not provide",
            param="echo",
        )
    params = SamplingParams(max_tokens=0, top_logprobs_num=top)
    result = backend.generate([list(ids)], params, logprob_start_len=0)[0]  # type: ignore[call-arg]
    scored = tuple(result.prompt_logprobs or ())
    assert len(scored) == len(ids) - 1, (len(scored), len(ids))
    return EchoedPrompt(text, tuple(pieces), (None, *scored), tuple(offsets))


def _has_prompt_logprobs(backend: Backend) -> bool:
    from lmprog.backends.runtime import Runtime

    return isinstance(backend, Runtime)
