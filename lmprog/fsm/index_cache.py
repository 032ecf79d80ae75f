"""Where compiled token indexes live: a memory LRU and the builds in flight.

    IndexCache().lookup(key, build, inline) -> Future[index]   (build() -> (index, nbytes))

Bounded by entries (`MEMORY_CACHE_SIZE`) and bytes (`LMPROG_FSM_MEMORY_MB`, default 2048); a
second request for a key being built waits on the same Future; there is no disk cache.
Design: docs/design/constraints.md.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

MEMORY_CACHE_SIZE = 128  # (a constraint takes two: its byte-vocabulary check and its model)
BUILD_THREADS = 2
_MB = 1 << 20

Built = tuple[Any, int]  # (the cached object, its size in bytes)


class IndexCache:
    """Thread-safe; every method may be called from any thread."""

    def __init__(self) -> None:
        self._lru: OrderedDict[str, Built] = OrderedDict()
        self._bytes = 0
        self._inflight: dict[str, Future[Any]] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def peek(self, key: str) -> Any | None:
        with self._lock:
            entry = self._lru.get(key)
            return None if entry is None else entry[0]

    def lookup(self, key: str, build: Callable[[], Built], inline: bool) -> Future[Any]:
        """The cached object for `key`, else the Future of a build (shared by all callers)."""
        with self._lock:
            if key in self._lru:
                self._lru.move_to_end(key)
                return _done(self._lru[key][0])
            if key in self._inflight:
                return self._inflight[key]
            future: Future[Any] = Future()
            self._inflight[key] = future
            if not inline:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(BUILD_THREADS, thread_name_prefix="lmprog-fsm")
                self._pool.submit(self._run, key, build, future)
        if inline:
            self._run(key, build, future)
        return future

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._lru.clear()
            self._bytes = 0

    def _run(self, key: str, build: Callable[[], Built], future: Future[Any]) -> None:
        try:
            value, nbytes = build()
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter through the future
            with self._lock:
                del self._inflight[key]
            future.set_exception(exc)
            return
        with self._lock:
            self._lru[key] = (value, nbytes)
            self._bytes += nbytes
            limit = _env_mb("LMPROG_FSM_MEMORY_MB", 2048)
            while len(self._lru) > 1 and (
                len(self._lru) > MEMORY_CACHE_SIZE or self._bytes > limit
            ):
                _, (_, dropped) = self._lru.popitem(last=False)
                self._bytes -= dropped
            del self._inflight[key]
        future.set_result(value)


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


def _env_mb(name: str, default: int) -> int:
    try:
        return int(float(os.environ.get(name, default)) * _MB)
    except ValueError:
        return default * _MB
