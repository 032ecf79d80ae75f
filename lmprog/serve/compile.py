"""Compiling a request's constraint (regex, JSON schema, tools) off the event loop, within its
`constraint_timeout_s`.

    constraint = await compiled(ctx, request, param, fn, *args)   # fn(*args) on the pool

Abandoned work stops (the client left, or the limit passed), and one client runs at most half
the pool's compiles at once. Design: docs/design/server.md#compiling-off-the-event-loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request

from lmprog.core.errors import ConstraintError
from lmprog.fsm.deadline import CompileAbandoned, CompileTimeout, compile_deadline

from .constraints import ERROR_CODES
from .context import ServeContext
from .errors import APIError, ClientGone

T = TypeVar("T")
POLL_S = 0.25  # how often a waiting compile checks that its client is still there

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_workers = max(2, os.cpu_count() or 1)
# per server's event loop, per client address: [its compiles running, the futures of its
# compiles waiting]; read and written on that loop only, gone with it
_shares: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compile_pool() -> ThreadPoolExecutor:
    """The threads constraints compile on (one per core, at least 2), shared by servers."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_workers, thread_name_prefix="lmprog-compile")
        return _pool


def per_client() -> int:
    """Compiles one client may run at once: half the pool, at least one."""
    return max(1, _workers // 2)


async def compiled(
    ctx: ServeContext, request: Request, param: str, fn: Callable[..., T], *args: Any
) -> T:
    """fn(*args) on the compile pool, once this client has a free share of it; 400
    `constraint_timeout` (blaming `param`) after `ctx.limits.constraint_timeout_s`, a 400
    naming `param` for a constraint refused as it compiles, ClientGone if the client
    disconnects first."""
    loop = asyncio.get_running_loop()
    limit = ctx.limits.constraint_timeout_s
    deadline = loop.time() + limit
    client = request.client.host if request.client is not None else ""
    cancelled = threading.Event()
    turn = _turn(client, loop)
    try:
        await _wait(turn, deadline, request, param, limit)
    except BaseException:
        if turn.done() and not turn.cancelled():
            _done(client)  # its turn came: give it back
        else:
            turn.cancel()  # passed over when one is given back
        raise

    def run() -> T:
        with compile_deadline(max(0.0, deadline - loop.time()), cancelled):
            return fn(*args)

    work = compile_pool().submit(run)
    # the client's turn ends when the work does (cancelled before it started, or stopped)
    work.add_done_callback(lambda _: _on_loop(loop, _done, client))
    future = asyncio.wrap_future(work, loop=loop)
    try:
        return await _wait(future, deadline, request, param, limit)
    except CompileTimeout:
        raise _timeout(param, limit) from None
    except CompileAbandoned:
        raise ClientGone from None
    except ConstraintError as exc:  # refused while its token index was built
        raise APIError(400, f"invalid {param}: {exc}", param=param, code=_code(param)) from None
    finally:
        if not work.done():
            work.cancel()  # not started: never starts
        cancelled.set()  # running: stops at its next check


async def _wait(future: Any, deadline: float, request: Request, param: str, limit: float) -> Any:
    loop = asyncio.get_running_loop()
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise _timeout(param, limit)
        done, _ = await asyncio.wait({future}, timeout=min(POLL_S, remaining))
        if done:
            return future.result()
        if await request.is_disconnected():
            raise ClientGone


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """fn(*args) on `loop`, from a compile thread; nothing once the server's loop closed (its
    shares went with it)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: the server stopped
        pass


def _turn(client: str, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
    """A future done once `client` may start a compile (at once while it runs fewer than
    `per_client()`); its place is taken then, and given back by `_done`."""
    entry = _shares.setdefault(loop, {}).setdefault(client, [0, []])
    turn = loop.create_future()
    if entry[0] < per_client():
        entry[0] += 1
        turn.set_result(None)
    else:
        entry[1].append(turn)
    return turn


def _done(client: str) -> None:
    """A compile of `client` ended, or its request stopped waiting: the next one waiting
    starts (a cancelled wait is passed over)."""
    running = _shares.get(asyncio.get_running_loop(), {})
    entry = running.get(client)
    if entry is None:
        return
    entry[0] -= 1
    while entry[1]:
        turn = entry[1].pop(0)
        if not turn.done():
            entry[0] += 1
            turn.set_result(None)
            break
    if entry[0] <= 0 and not entry[1]:
        del running[client]


def _timeout(param: str, limit: float) -> APIError:
    return APIError(
        400,
        f"compiling the {param} took longer than this server's limit of {limit:g} s "
        "(constraint_timeout_s, lmprog serve --constraint-timeout): simplify it "
        "(fewer nested or repeated parts, smaller bounds)",
        param=param,
        code="constraint_timeout",
    )


def _code(param: str) -> str:
    """The error code of a constraint field (constraints.py's codes; tools are schemas)."""
    return ERROR_CODES.get(param.split(".")[0], "invalid_schema")


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
