"""Small endpoints users reach for, in vLLM's shapes: POST /tokenize, POST /detokenize, GET
/version.

Bodies and replies: docs/design/server.md#small-endpoints.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from lmprog.core.prompt import encode_prompt

from .context import ServeContext
from .errors import APIError
from .jsonbody import parse_body
from .prompts import render_chat, template_kwargs
from .schemas.chat import ChatMessage
from .schemas.completions import Strict


class TokenizeBody(Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeBody(Strict):
    model: str | None = None
    tokens: list[int] = Field(max_length=1 << 20)


def install(app: FastAPI, ctx: ServeContext) -> None:
    """Add the routes to `app` (called by `build_app`)."""
    from lmprog import __version__

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        body = await parse_body(request, TokenizeBody, ctx)
        if body.model is not None:
            ctx.check_model(body.model)
        tokens = await ctx.blocking(_tokenize, ctx, body)
        return JSONResponse(
            {"count": len(tokens), "max_model_len": _context(ctx), "tokens": tokens}
        )

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        body = await parse_body(request, DetokenizeBody, ctx)
        if body.model is not None:
            ctx.check_model(body.model)
        return JSONResponse({"prompt": await ctx.blocking(_detokenize, ctx, body.tokens)})

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": __version__})


def _tokenize(ctx: ServeContext, body: TokenizeBody) -> list[int]:
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give one of prompt and messages", param="prompt")
    tokenizer = _tokenizer(ctx)
    if body.prompt is not None:
        return list(tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens))
    text = render_chat(
        ctx.template,
        body.messages or [],
        None,
        max_json_depth=ctx.limits.max_json_depth,
        tokenizer=None if ctx.limits.allow_special_tokens else tokenizer,
        variables=template_kwargs(body.chat_template_kwargs),
        add_generation_prompt=body.add_generation_prompt,
    )
    return list(encode_prompt(tokenizer, text))


def _detokenize(ctx: ServeContext, tokens: list[int]) -> str:
    tokenizer = _tokenizer(ctx)
    size = len(tokenizer)
    bad = next((i for i, t in enumerate(tokens) if not 0 <= t < size), None)
    if bad is not None:
        raise APIError(
            400,
            f"token id {tokens[bad]} at tokens[{bad}] is outside the vocabulary (0..{size - 1})",
            param=f"tokens[{bad}]",
        )
    return tokenizer.decode(tokens, skip_special_tokens=False)


def _tokenizer(ctx: ServeContext) -> Any:
    try:
        return ctx.backend.tokenizer
    except Exception as exc:  # noqa: BLE001 - a backend without a local tokenizer
        raise APIError(
            400, f"this server's backend has no tokenizer of its own: {exc}", code="unsupported"
        ) from None


def _context(ctx: ServeContext) -> int | None:
    """The most tokens one request can hold: llama.cpp's n_ctx, else the KV capacity the
    backend reports (None if it reports none)."""
    value = getattr(ctx.backend, "n_ctx", None)
    if isinstance(value, int):
        return value
    try:
        value = ctx.backend.stats().get("kv_capacity")
    except Exception:  # noqa: BLE001 - a backend without stats
        return None
    return value if isinstance(value, int) else None
