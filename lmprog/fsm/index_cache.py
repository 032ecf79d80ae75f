"""Where compiled token indexes live: a memory LRU, disk files, and builds in flight.

    IndexCache().lookup(key, build, inline) -> Future[index]   (build() -> (index, nbytes))

- Memory: an LRU bounded by entries (`MEMORY_CACHE_SIZE`) and by bytes (`LMPROG_FSM_MEMORY_MB`,
  default 2048). An outlines-core index stores every (state, token) edge: a JSON object with a
  few bounded strings reaches tens of MB (docs/benchmarks.md), so counting entries alone is
  not a bound.
- Disk: `cache_dir()/fsm/<key>.idx`, outlines-core's own serialization, written atomically;
  loading is much faster than building (docs/benchmarks.md). Files are kept under
  `LMPROG_FSM_DISK_MB` (default 4096), least recently used deleted first.
  `LMPROG_FSM_DISK_CACHE=0` turns the disk cache off.
- In flight: a second request for a key being built waits on the same Future.
`prefetch` builds run on a small thread pool: outlines-core releases the GIL while it builds,
so the requesting thread (e.g. the runtime's scheduler) keeps running.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lmprog.core.models import cache_dir

MEMORY_CACHE_SIZE = 64
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
        """Forget the in-memory entries (the disk cache stays)."""
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


# ---- disk ------------------------------------------------------------------------------------


def disk_enabled(requested: bool) -> bool:
    return requested and os.environ.get("LMPROG_FSM_DISK_CACHE", "1") != "0"


def disk_path(key: str) -> Path:
    return cache_dir() / "fsm" / f"{key}.idx"


def read(key: str) -> bytes | None:
    """The stored bytes for `key`, or None; marks the file as recently used."""
    path = disk_path(key)
    try:
        data = path.read_bytes()
        os.utime(path)
        return data
    except OSError:
        return None


def write(key: str, data: bytes) -> None:
    """Atomic write (tmp + rename), then trim the folder; a failed write only costs a rebuild."""
    path = disk_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        _trim(path.parent, _env_mb("LMPROG_FSM_DISK_MB", 4096), keep=path)
    except OSError:
        pass


def _trim(folder: Path, limit: int, keep: Path) -> None:
    files = []
    for f in folder.glob("*.idx"):
        try:
            st = f.stat()
        except OSError:
            continue
        files.append((st.st_mtime, st.st_size, f))
    total = sum(size for _, size, _ in files)
    for _, size, f in sorted(files, key=lambda x: x[0]):
        if total <= limit:
            break
        if f != keep:
            f.unlink(missing_ok=True)
            total -= size
