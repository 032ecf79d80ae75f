"""`lmprog serve` as a worker behind a router: what SGLang's router (`sglang-router`, the
SGLang Model Gateway) sends and calls, so that it fronts several lmprog servers unchanged
(docs/serving.md, "Several machines").

What the router does to a worker (sglang-router 0.3.2, read from its requests):

    registration   GET /health, GET /server_info (model_path, served_model_name, dp_size),
                   GET /model_info then GET /get_model_info; an HTTP/2 probe ("PRI *",
                   answered 404) to see whether the worker speaks gRPC
    health         GET /health every --health-check-interval-secs
    load           GET /get_load (its /get_loads and the load monitor): SGLang's shape, one
                   entry per data-parallel rank: [{"dp_rank", "num_reqs",
                   "num_waiting_reqs", "num_tokens"}]
    requests       POST /generate with extra fields (RouterFields), /v1/chat/completions and
                   /v1/completions with SGLang's extensions (OpenAIRouterFields)
    admin          POST /flush_cache (broadcast), GET /get_model_info, /v1/models

The fields the router adds: lmprog/serve/schemas/router.py.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from ..context import ServeContext


def load_report(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """SGLang's /get_load from the backend's stats: one entry (rank 0; --dp replicas summed),
    num_reqs running plus waiting, num_tokens the KV cache's used tokens; and lmprog's own
    capacity fields beside them (kv_capacity, gen_tokens_per_s, generated_tokens: progress a
    router can see without waiting for an answer, dp_size)."""
    running = int(stats.get("num_running", 0) or 0)
    waiting = int(stats.get("num_waiting", 0) or 0)
    return [
        {
            "dp_rank": 0,
            "num_reqs": running + waiting,
            "num_waiting_reqs": waiting,
            "num_tokens": int(stats.get("kv_used", 0) or 0),
            "num_pending_tokens": 0,
            "kv_capacity": int(stats.get("kv_capacity", 0) or 0),
            "gen_tokens_per_s": float(stats.get("gen_tokens_per_s", 0.0) or 0.0),
            "generated_tokens": int(stats.get("generated_tokens", 0) or 0),
            "dp_size": int(stats.get("dp_size", 1) or 1),
        }
    ]


def install(app: FastAPI, ctx: ServeContext) -> None:
    """Add the routes a router calls beside the native and OpenAI ones (build_app)."""

    @app.get("/get_load")
    async def get_load() -> JSONResponse:
        return JSONResponse(load_report(await ctx.blocking(ctx.backend.stats)))
