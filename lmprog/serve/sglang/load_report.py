"""/get_load and what SGLang's router needs of `lmprog serve` as one of its workers.

What the router sends and calls (registration, health, load, requests, admin), so that it
fronts several lmprog servers unchanged: docs/design/server.md#behind-a-router-the-worker-role;
set-up: docs/serving.md, "Several machines".
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
