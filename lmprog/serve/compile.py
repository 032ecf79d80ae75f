"""Compiling a request's constraint (regex, JSON schema, tools) off the event loop, within
the `constraint_timeout_s` limit, and only while its client is there.

A schema or regex can take long to compile (a token index over the whole vocabulary), so
`compiled` runs the work on a small pool of its own threads: the event loop keeps serving,
generation keeps its threads, and a request that waits longer than the limit gets a 400
`constraint_timeout` naming it. A compile that has not started when its request is answered
(timed out, or the client left) never starts; one already running cannot be interrupted in
Python and is abandoned: it ends on its own, its result cached for the next request that
asks for the same constraint. The pool is small, so abandoned compiles cannot take more
than its threads.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request

from .context import ServeContext
from .errors import APIError, ClientGone

T = TypeVar("T")
POLL_S = 0.25  # how often a waiting compile checks that its client is still there

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def compile_pool() -> ThreadPoolExecutor:
    """The threads constraints compile on (one per core, at least 2), shared by servers."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max(2, os.cpu_count() or 1), thread_name_prefix="lmprog-compile"
            )
        return _pool


async def compiled(
    ctx: ServeContext, request: Request, param: str, fn: Callable[..., T], *args: Any
) -> T:
    """fn(*args) on the compile pool; 400 `constraint_timeout` (blaming `param`) after
    `ctx.limits.constraint_timeout_s`, ClientGone if the client disconnects first."""
    loop = asyncio.get_running_loop()
    future = asyncio.wrap_future(compile_pool().submit(fn, *args), loop=loop)
    limit = ctx.limits.constraint_timeout_s
    deadline = loop.time() + limit
    try:
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise APIError(
                    400,
                    f"compiling the {param} took longer than this server's limit of {limit:g} s "
                    "(constraint_timeout_s, lmprog serve --constraint-timeout): simplify it "
                    "(fewer nested or repeated parts, smaller bounds)",
                    param=param,
                    code="constraint_timeout",
                )
            done, _ = await asyncio.wait({future}, timeout=min(POLL_S, remaining))
            if done:
                return future.result()
            if await request.is_disconnected():
                raise ClientGone
    finally:
        if not future.done():
            future.cancel()  # not started: never starts; running: abandoned


def build_index(ctx: ServeContext, constraint: Any) -> None:
    """Build (or find cached) the token index of `constraint` for the backend's tokenizer,
    so the generation that follows finds it ready. A backend without a Hugging Face
    tokenizer of its own (an endpoint, a test double) builds none."""
    if constraint is None:
        return
    from lmprog.fsm.index import TokenIndex
    from lmprog.fsm.vocab import TokenVocab

    try:
        tokenizer = ctx.backend.tokenizer
        TokenVocab.from_tokenizer(tokenizer)
    except Exception:  # noqa: BLE001 - no tokenizer an index can be built for
        return
    TokenIndex.get(constraint, tokenizer)  # a ConstraintError is the client's 400
