"""Generations: a request's choices run as `backend.generate` calls on worker threads, their
pieces sent back to the event loop.

    group = Generations(backend, requests, executor, stream=True)   # submits every choice
    await group.wait_started()          # first piece or outcome of each choice; early errors raise
    async for index, piece in group.pieces(): ...                   # streaming
    results = await group.results()     # one GenerateResult per choice, in order
    group.cancel()                      # client gone: each choice aborts at its next token

Design: docs/design/server.md#generations-from-the-event-loop-to-the-backend-and-back.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Executor
from typing import Any

from lmprog.core.protocol import Backend, GenerateRequest, GenerateResult

_PIECE, _DONE, _ERROR = range(3)


class Cancelled(Exception):
    """Raised in a worker's stream callback once the request was cancelled."""


class Generations:
    """The running choices of one API request. Event-loop side only, except `cancel`."""

    def __init__(
        self,
        backend: Backend,
        requests: Sequence[GenerateRequest],
        executor: Executor,
        *,
        stream: bool,
        metrics: Any = None,
        arrival: float | None = None,
    ) -> None:
        """`metrics`: a ServerMetrics timing each finished choice (`on_generation`) from
        `arrival` (the request's time.perf_counter(); default: now)."""
        assert requests, "a request has at least one choice"
        self._loop = asyncio.get_running_loop()
        self._metrics = metrics
        self._submitted = time.perf_counter()
        self._arrival = self._submitted if arrival is None else arrival
        self._stream = stream
        self._cancelled = threading.Event()
        self._events: deque[tuple[int, int, Any]] = deque()
        self._changed = asyncio.Event()
        self._started: set[int] = set()
        self._outcomes: dict[int, tuple[int, Any]] = {}
        self.size = len(requests)
        self.prompt = requests[0].prompt  # every choice's
        for i, request in enumerate(requests):
            executor.submit(self._work, backend, i, request)

    # ---- worker threads --------------------------------------------------------------------
    def _work(self, backend: Backend, index: int, request: GenerateRequest) -> None:
        started, first = time.perf_counter(), []

        def on_piece(text: str) -> None:
            if self._cancelled.is_set():
                raise Cancelled
            if not first:
                first.append(time.perf_counter())
            if self._stream:
                self._post(index, _PIECE, text)

        try:
            if self._cancelled.is_set():
                raise Cancelled
            result = backend.generate(request, stream=on_piece)
        except BaseException as exc:  # noqa: BLE001 - handed to the event loop
            self._post(index, _ERROR, exc)
            return
        if self._metrics is not None:  # before the result: a scrape after the response sees it
            self._metrics.on_generation(
                arrival=self._arrival,
                submitted=self._submitted,
                started=started,
                first_piece=first[0] if first else None,
                finished=time.perf_counter(),
                completion_tokens=result.completion_tokens,
            )
        self._post(index, _DONE, result)

    def _post(self, index: int, kind: int, value: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._push, index, kind, value)
        except RuntimeError:  # the loop is closed: the server stopped, nobody is waiting
            pass

    # ---- event loop ------------------------------------------------------------------------
    def _push(self, index: int, kind: int, value: Any) -> None:
        self._events.append((index, kind, value))
        self._started.add(index)
        if kind != _PIECE:
            self._outcomes[index] = (kind, value)
        self._changed.set()

    async def _wait(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    async def wait_started(self) -> None:
        """Wait until every choice has its first piece or its outcome; raise the first error
        of a choice that failed before producing text (e.g. its prompt does not fit)."""
        while len(self._started) < self.size:
            await self._wait()
        for index in range(self.size):
            kind, value = self._outcomes.get(index, (_PIECE, None))
            if kind == _ERROR:
                raise value

    async def events(self) -> AsyncIterator[tuple[int, str | GenerateResult]]:
        """(choice, text piece) as pieces arrive and (choice, GenerateResult) as each ends;
        a choice's error is raised when its turn comes."""
        done = 0
        while done < self.size:
            while not self._events:
                await self._wait()
            index, kind, value = self._events.popleft()
            if kind == _ERROR:
                raise value
            done += kind == _DONE
            yield index, value

    async def results(self) -> list[GenerateResult]:
        """Every choice's result, in order; raises the first error."""
        while len(self._outcomes) < self.size:
            await self._wait()
        self._events.clear()
        out = []
        for index in range(self.size):
            kind, value = self._outcomes[index]
            if kind == _ERROR:
                raise value
            out.append(value)
        return out

    def result(self, index: int) -> GenerateResult | None:
        """Choice `index`'s result once it finished without an error, else None."""
        kind, value = self._outcomes.get(index, (_ERROR, None))
        return value if kind == _DONE else None

    @property
    def finished(self) -> bool:
        return len(self._outcomes) == self.size

    def cancel(self) -> None:
        """Abort every unfinished choice (at its next token). Safe from any thread, twice."""
        self._cancelled.set()
