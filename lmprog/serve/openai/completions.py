"""/v1/completions: text prompts (or token ids) continued, n choices each, optionally streamed.

`echo` returns the prompt too, with its token logprobs when `logprobs` is set (also with
max_tokens=0: the way an endpoint client scores `select` choices).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from lmprog.core.protocol import GenerateRequest, GenerateResult

from ..compile import build_index, compiled
from ..constraints import body_constraint, constraint_field
from ..context import ServeContext
from ..errors import APIError, from_exception
from ..generations import Generations
from ..logprobs import completion_logprobs, generated_logprobs, visible_logprobs
from ..prompt_echo import EchoedPrompt, echoed_prompt, encode_prompt
from ..respond import ReplyBase, arrival, finish_reason, respond, sse, usage
from ..sampling import choice_params, choices_of, sampling_params
from ..schemas.completions import CompletionRequest

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint


async def create_completion(
    ctx: ServeContext, body: CompletionRequest, request: Request
) -> Response:
    lora = ctx.check_model(body.model)
    prompts = _prompts(body.prompt)
    n = choices_of(body, ctx.limits)
    if body.best_of is not None and body.best_of != n:
        raise APIError(400, "best_of must equal n (choices are not ranked)", param="best_of")
    if len(prompts) * n > ctx.limits.max_choices:
        raise APIError(
            400,
            f"{len(prompts)} prompts x n={n} is more than the "
            f"{ctx.limits.max_choices} choices this server allows",
            param="n",
        )
    max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    params = sampling_params(body, ctx.limits, max_tokens=max_tokens, logprobs=body.logprobs)
    if lora is not None:  # `model` names a LoRA adapter
        params = dataclasses.replace(params, lora_path=lora)
    constraint = None
    param = constraint_field(body)
    if param is not None:  # off the event loop
        constraint = await compiled(ctx, request, param, _constraint, ctx, body)
    echoes = await ctx.blocking(_echo_all, ctx, prompts, body) if body.echo else None
    if echoes is not None:  # generate from the very ids that were echoed
        prompts = [e[0] for e in echoes]
    per_choice = choice_params(params, n)
    group = Generations(
        ctx.backend,
        [GenerateRequest(p, cp, constraint) for p in prompts for cp in per_choice],
        ctx.executor,
        stream=bool(body.stream),
        metrics=ctx.metrics,
        arrival=arrival(request),
    )
    reply = _Reply(ctx, body, n, [e[1] for e in echoes] if echoes else None)
    return await respond(request, group, reply, stream=bool(body.stream), param="prompt")


def _constraint(ctx: ServeContext, body: CompletionRequest) -> Any:
    """The request's constraint, its token index built (on a compile thread)."""
    constraint = body_constraint(body)
    build_index(ctx, constraint)
    return constraint


def _prompts(prompt: Any) -> list[str | tuple[int, ...]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt must not be an empty list", param="prompt")
    if isinstance(prompt[0], int):
        return [tuple(prompt)]
    if any(isinstance(p, list) and not p for p in prompt):
        raise APIError(400, "a token-id prompt must not be empty", param="prompt")
    return [p if isinstance(p, str) else tuple(p) for p in prompt]


def _echo_all(
    ctx: ServeContext, prompts: list[Any], body: CompletionRequest
) -> list[tuple[tuple[int, ...], EchoedPrompt]]:
    tokenizer = ctx.backend.tokenizer
    out = []
    for p in prompts:
        ids = encode_prompt(tokenizer, p) if isinstance(p, str) else p
        if not ids:
            raise APIError(400, "echo needs a non-empty prompt", param="prompt")
        size = len(tokenizer) if hasattr(tokenizer, "__len__") else None
        if size is not None and not all(0 <= t < size for t in ids):
            raise APIError(400, f"prompt token ids must be in [0, {size})", param="prompt")
        try:
            out.append((ids, echoed_prompt(ctx.backend, ids, body.logprobs)))
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to an HTTP error
            raise from_exception(exc, param="prompt") from None
    return out


class _Reply(ReplyBase):
    """Builds the response bodies of one request (choice index = prompt index * n + j)."""

    def __init__(
        self, ctx: ServeContext, body: CompletionRequest, n: int, echoes: list[EchoedPrompt] | None
    ) -> None:
        super().__init__(ctx, "cmpl")
        self.body, self.n, self.echoes = body, n, echoes

    def _echo(self, index: int) -> EchoedPrompt | None:
        return self.echoes[index // self.n] if self.echoes else None

    def _logprobs(self, index: int, result: GenerateResult | None) -> Any:
        """Logprobs of the echoed prompt (if any) and of `result`'s tokens (if given)."""
        top = self.body.logprobs
        if top is None:
            return None
        echo = self._echo(index)
        start = len(echo.text) if echo else 0
        generated = generated_logprobs(visible_logprobs(result) if result else (), start, top)
        if echo is None:
            return generated
        prompt = completion_logprobs(echo.tokens, echo.logprobs, echo.offsets, top)
        if result is None:
            return prompt
        return {
            key: (prompt[key] + generated[key]) if prompt[key] is not None else None
            for key in prompt
        }

    def _choice(self, index: int, result: GenerateResult) -> dict[str, Any]:
        echo = self._echo(index)
        prefix = echo.text if echo else ""
        return {
            "index": index,
            "text": prefix + result.text,
            "logprobs": self._logprobs(index, result),
            "finish_reason": finish_reason(result),
        }

    def _usage(self, results: list[GenerateResult]) -> dict[str, Any]:
        firsts = results[:: self.n]  # one choice per prompt
        u = usage(
            sum(r.prompt_tokens for r in firsts), results, sum(r.cached_tokens for r in firsts)
        )
        self.ctx.metrics.on_usage(
            u["prompt_tokens"], u["completion_tokens"], u["prompt_tokens_details"]["cached_tokens"]
        )
        return u

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.ctx.model_name,
            "choices": choices,
        }

    def response_body(self, results: list[GenerateResult]) -> dict[str, Any]:
        out = self._envelope([self._choice(i, r) for i, r in enumerate(results)])
        out["usage"] = self._usage(results)
        return out

    # -- the SSE stream (ReplyBase.stream) ---------------------------------------------------
    def _opening(self, size: int) -> list[bytes]:
        """The echoed prompts first (with their logprobs), when echo is on."""
        return [
            sse(
                self._envelope(
                    [
                        {
                            "index": i,
                            "text": self._echo(i).text,
                            "logprobs": self._logprobs(i, None),
                            "finish_reason": None,
                        }
                    ]
                )
            )
            for i in range(size if self.echoes else 0)
        ]

    def _piece(self, index: int, text: str) -> bytes:
        return sse(
            self._envelope(
                [{"index": index, "text": text, "logprobs": None, "finish_reason": None}]
            )
        )

    def _usage_chunk(self, u: dict[str, Any]) -> bytes:
        return sse({**self._envelope([]), "usage": u})

    def _closing(self, index: int, result: GenerateResult) -> bytes:
        """A streamed choice's end: its finish reason and the logprobs of its tokens."""
        lps = None
        if self.body.logprobs is not None:
            echo = self._echo(index)
            lps = generated_logprobs(
                visible_logprobs(result), len(echo.text) if echo else 0, self.body.logprobs
            )
        return sse(
            self._envelope(
                [
                    {
                        "index": index,
                        "text": "",
                        "logprobs": lps,
                        "finish_reason": finish_reason(result),
                    }
                ]
            )
        )
