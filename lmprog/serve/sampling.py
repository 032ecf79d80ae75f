"""Request fields -> one SamplingParams per choice, checked against the server's limits.

params = sampling_params(body, limits, max_tokens=16, logprobs=2)
per_choice = choice_params(params, n)       # seed, seed+1, ... so seeded choices differ
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from lmprog.core.sampling import SAMPLING_FIELDS, SamplingParams

from .errors import APIError
from .limits import ServerLimits
from .schemas.completions import SamplingFields


def sampling_params(
    body: SamplingFields, limits: ServerLimits, *, max_tokens: int | None, logprobs: int | None
) -> SamplingParams:
    """The SamplingParams of a request (`max_tokens`: the endpoint's chosen value, None for
    its default; `logprobs`: None for none, else the number of alternatives per token)."""
    check_supported(body)
    tokens = limits.output_tokens if max_tokens is None else max_tokens
    if tokens > limits.max_tokens:
        raise APIError(
            400,
            f"max_tokens is {tokens}; this server allows at most {limits.max_tokens}",
            param="max_tokens",
            code="max_tokens_too_large",
        )
    if logprobs is not None and logprobs > limits.max_logprobs:
        raise APIError(
            400,
            f"at most {limits.max_logprobs} logprobs per token, got {logprobs}",
            param="logprobs",
        )
    fields: dict[str, Any] = {
        "max_tokens": tokens,
        "stop": stop_strings(body.stop, limits),
        "stop_token_ids": tuple(body.stop_token_ids or ()),
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "min_tokens": body.min_tokens,
        "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty,
        "repetition_penalty": body.repetition_penalty,
        "ignore_eos": body.ignore_eos,
        "seed": body.seed,
        "return_logprob": logprobs is not None,
        "top_logprobs_num": logprobs or 0,
    }
    try:
        return SamplingParams().merged(fields)
    except (TypeError, ValueError) as exc:
        raise APIError(400, str(exc), param=_param_of(str(exc))) from None


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """n copies; with a seed, choice i uses seed + i (reproducible, yet not n equal copies)."""
    if params.seed is None or n == 1:
        return [params] * n
    return [dataclasses.replace(params, seed=(params.seed + i) % (2**63)) for i in range(n)]


def choices_of(body: SamplingFields, limits: ServerLimits) -> int:
    n = 1 if body.n is None else body.n
    if n > limits.max_n:
        raise APIError(
            400,
            f"n is {n}; this server allows at most {limits.max_n} (max_n, lmprog serve --max-n)",
            param="n",
        )
    return n


def check_supported(body: SamplingFields) -> None:
    names = body.unsupported_fields()
    if names:
        raise APIError(
            400,
            f"{names[0]} is not supported by this server",
            param=names[0],
            code="unsupported_parameter",
        )


def stop_strings(stop: str | list[str] | None, limits: ServerLimits) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > limits.max_stop:
        raise APIError(
            400,
            f"at most {limits.max_stop} stop strings (max_stop, lmprog serve --max-stop), "
            f"got {len(stops)}",
            param="stop",
        )
    if any(not s for s in stops):
        raise APIError(400, "stop strings must not be empty", param="stop")
    longest = max((len(s) for s in stops), default=0)
    if longest > limits.max_stop_chars:
        raise APIError(
            400,
            f"a stop string of {longest} characters is over this server's limit of "
            f"{limits.max_stop_chars} (max_stop_chars, lmprog serve --max-stop-chars)",
            param="stop",
            code="stop_too_long",
        )
    return stops


def _param_of(message: str) -> str | None:
    """SamplingParams names the offending field first in its messages."""
    match = re.match(r"([a-z_]+)\b", message)
    return match.group(1) if match and match.group(1) in SAMPLING_FIELDS else None
