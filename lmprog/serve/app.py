"""The FastAPI application: routes, the gate (API key, body limit, metrics), error handlers.

    app = build_app(backend, model_name="smollm2", api_key=None, limits=ServerLimits())

Handlers parse bodies themselves and never block the event loop: generation, tokenization and
constraint compilation run on the context's worker threads. Design: docs/design/server.md.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from lmprog.core.errors import LoraError
from lmprog.core.protocol import Backend
from lmprog.core.reasoning import ReasoningFormat, reasoning_format

from . import tokens
from .access import Gate
from .anthropic.messages import count_tokens, create_message
from .context import ServeContext
from .errors import APIError, anthropic_error, install_handlers
from .jsonbody import parse_body
from .limits import ServerLimits
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import ServerMetrics
from .openai.chat_completions import create_chat_completion
from .openai.completions import create_completion
from .openai.responses import ResponseStore, create_response
from .schemas.chat import ChatCompletionRequest
from .schemas.completions import CompletionRequest, Strict
from .schemas.messages import CountTokensRequest, MessagesRequest
from .schemas.responses import ResponsesRequest
from .sglang import load_report, native


def build_app(
    backend: Backend,
    *,
    model_name: str,
    api_key: str | None = None,
    limits: ServerLimits | None = None,
    reasoning: ReasoningFormat | None | str = "auto",
) -> FastAPI:
    """The app serving `backend` under `model_name`. The caller owns the backend; the app's
    worker threads stop with `app.state.ctx.executor.shutdown()` (Server.stop does it).
    `reasoning`: the model's reasoning format, or a parser name ("auto": the template's)."""
    limits = limits or ServerLimits()
    if isinstance(reasoning, str):
        reasoning = reasoning_format(backend.chat_template.source, reasoning)
    ctx = ServeContext(
        backend=backend,
        model_name=model_name,
        limits=limits,
        executor=ThreadPoolExecutor(limits.max_concurrency, thread_name_prefix="lmprog-serve"),
        metrics=ServerMetrics(stats=backend.stats),
        template=backend.chat_template,
        created=int(time.time()),
        reasoning=reasoning,
    )
    app = FastAPI(title="lmprog", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx = ctx
    install_handlers(app)
    _routes(app, ctx)
    native.install(app, ctx)  # SGLang's native protocol: /generate, /get_model_info, ...
    tokens.install(app, ctx)  # /tokenize, /detokenize, /version
    load_report.install(app, ctx)  # what routers in front call: /get_load
    app.add_middleware(
        Gate, api_key=api_key, max_body_bytes=limits.max_body_bytes, metrics=ctx.metrics
    )
    return app


def _routes(app: FastAPI, ctx: ServeContext) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await parse_body(request, CompletionRequest, ctx)
        return await create_completion(ctx, body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest, ctx)
        return await create_chat_completion(ctx, body, request)

    store = ResponseStore()  # previous_response_id: the server's stored responses

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        body = await parse_body(request, ResponsesRequest, ctx)
        return await create_response(ctx, store, body, request)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str) -> JSONResponse:
        return JSONResponse(store.get(response_id)[0])

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> JSONResponse:
        store.delete(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        try:
            body = await parse_body(request, MessagesRequest, ctx)
            return await create_message(ctx, body, request)
        except APIError as exc:
            return anthropic_error(exc)

    @app.post("/v1/messages/count_tokens")
    async def messages_count_tokens(request: Request) -> Response:
        try:
            body = await parse_body(request, CountTokensRequest, ctx)
            return await count_tokens(ctx, body, request)
        except APIError as exc:
            return anthropic_error(exc)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        cards = [_model_card(ctx)] + [_adapter_card(ctx, a) for a in ctx.adapters()]
        return JSONResponse({"object": "list", "data": cards})

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> JSONResponse:
        if ctx.check_model(name) is None:
            return JSONResponse(_model_card(ctx))
        adapter = next(a for a in ctx.adapters() if a["name"] == name)
        return JSONResponse(_adapter_card(ctx, adapter))

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> JSONResponse:
        body = await parse_body(request, LoadLoraBody, ctx, strict=True)
        loader = _lora_call(ctx, "load_lora_adapter")
        await ctx.blocking(_lora_errors, loader, body.lora_name, body.lora_path)
        return JSONResponse(
            {"success": True, "message": f"LoRA adapter {body.lora_name!r} loaded",
             "loaded_adapters": {a["name"]: a["path"] for a in ctx.adapters()}}
        )  # fmt: skip

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> JSONResponse:
        body = await parse_body(request, UnloadLoraBody, ctx, strict=True)
        unloader = _lora_call(ctx, "unload_lora_adapter")
        await ctx.blocking(_lora_errors, unloader, body.lora_name)
        return JSONResponse(
            {"success": True, "message": f"LoRA adapter {body.lora_name!r} unloaded",
             "loaded_adapters": {a["name"]: a["path"] for a in ctx.adapters()}}
        )  # fmt: skip

    @app.get("/health")
    async def health() -> JSONResponse:
        engine = getattr(ctx.backend, "engine", None)
        if engine is not None and not engine.alive:
            raise APIError(503, "the engine has stopped", code="engine_down")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=METRICS_CONTENT_TYPE)


def _model_card(ctx: ServeContext) -> dict[str, Any]:
    return {"id": ctx.model_name, "object": "model", "created": ctx.created, "owned_by": "lmprog"}


def _adapter_card(ctx: ServeContext, adapter: dict[str, Any]) -> dict[str, Any]:
    """A LoRA adapter as vLLM lists one: its name, its folder as `root`, the base as parent."""
    return {
        "id": adapter["name"],
        "object": "model",
        "created": ctx.created,
        "owned_by": "lmprog",
        "root": adapter["path"],
        "parent": ctx.model_name,
    }


class LoadLoraBody(Strict):
    """vLLM's and SGLang's load_lora_adapter body."""

    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)
    pinned: bool | None = None  # SGLang's: accepted, every adapter is paged LRU alike


class UnloadLoraBody(Strict):
    lora_name: str = Field(min_length=1, max_length=256)


def _lora_call(ctx: ServeContext, name: str) -> Any:
    method = getattr(ctx.backend, name, None)
    if method is None:
        raise APIError(
            400,
            f"the {type(ctx.backend).__name__} backend serves no LoRA adapters (start lmprog "
            "serve on the runtime or llama.cpp backend, with --enable-lora or --lora-paths)",
            code="lora_not_supported",
        )
    return method


def _lora_errors(fn: Any, *args: Any) -> Any:
    """fn(*args) with a LoraError as the API error it is: 404 for an unknown adapter, else
    400 (a malformed or mismatched folder, an adapter past the limits)."""
    try:
        return fn(*args)
    except LoraError as exc:
        status = 404 if exc.unknown else 400
        raise APIError(
            status,
            str(exc),
            param="lora_name" if exc.unknown else "lora_path",
            code="lora_not_found" if exc.unknown else "invalid_lora",
        ) from None
