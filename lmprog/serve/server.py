"""Server: the app on uvicorn in a background thread (tests, notebooks, benchmarks).

    with Server(lp.Runtime(), port=0).start() as srv:      # port 0: any free port
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")

The server binds 127.0.0.1 unless told otherwise. It does not own the backend: shut that
down yourself after `stop()`.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
from typing import Any

from lmprog.core.protocol import Backend
from lmprog.core.reasoning import reasoning_format

from .engine_log import EngineLog
from .limits import LIMIT_NAMES, ServerLimits


class Server:
    """An OpenAI-compatible HTTP server over one backend (any lmprog Backend; lp.Runtime for
    every feature): `host`, `port` (0: a free one), `api_key`, `model_name`, `stats_interval_s`
    (engine_log.py), `reasoning_parser` ("auto", "none" or a name of
    lmprog.core.reasoning.FORMATS) and **limits (ServerLimits fields).
    Every argument: docs/design/server.md#starting-a-server."""

    def __init__(
        self,
        backend: Backend,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        model_name: str | None = None,
        stats_interval_s: float | None = 10.0,
        reasoning_parser: str = "auto",
        **limits: Any,
    ) -> None:
        if not isinstance(backend, Backend):
            raise TypeError(f"backend must be an lmprog Backend, got {type(backend).__name__}")
        unknown = set(limits) - LIMIT_NAMES
        if unknown:
            raise TypeError(
                f"unknown server limit(s) {sorted(unknown)}; valid: {sorted(LIMIT_NAMES)}"
            )
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be in [0, 65536), got {port!r}")
        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise ValueError("api_key must be a non-empty string or None")
        if stats_interval_s is not None and not stats_interval_s > 0:
            raise ValueError(f"stats_interval_s must be > 0 or None, got {stats_interval_s!r}")
        self.backend = backend
        self.host, self.port = host, port
        self.api_key = api_key
        self.model_name = model_name or getattr(backend, "model_name", None) or "lmprog"
        self.limits = ServerLimits(**limits)
        self.stats_interval_s = stats_interval_s
        self.reasoning = reasoning_format(backend.chat_template.source, reasoning_parser)
        self._engine_log: EngineLog | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._app: Any = None

    def start(self, timeout: float = 30.0) -> Server:
        """Listen and serve on a background thread; returns once connections are accepted."""
        import uvicorn

        from .app import build_app

        if self._thread is not None:
            raise RuntimeError("the server is already started")
        self._app = build_app(
            self.backend,
            model_name=self.model_name,
            api_key=self.api_key,
            limits=self.limits,
            reasoning=self.reasoning,
        )
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._serve, args=(sock,), name="lmprog-server", daemon=True
        )
        self._thread.start()
        self._wait_started(timeout)
        if self.stats_interval_s is not None:
            self._engine_log = EngineLog(self.backend.stats, self.stats_interval_s).start()
        return self

    def _serve(self, sock: socket.socket) -> None:
        asyncio.run(self._server.serve(sockets=[sock]))

    def _wait_started(self, timeout: float) -> None:
        deadline = threading.Event()
        for _ in range(int(timeout / 0.01)):
            if self._server.started:
                return
            if not self._thread.is_alive():
                raise RuntimeError("the server failed to start (see the log above)")
            deadline.wait(0.01)
        raise TimeoutError(f"the server did not start within {timeout} s")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        """Stop serving (open streams are cancelled, their requests aborted). Idempotent."""
        if self._thread is None:
            return
        if self._engine_log is not None:
            self._engine_log.stop()
            self._engine_log = None
        self._server.should_exit = True
        self._thread.join(10)
        self._app.state.ctx.executor.shutdown(wait=False, cancel_futures=True)
        self._thread = None

    def __enter__(self) -> Server:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "serving" if self._thread is not None else "stopped"
        return f"Server({self.url!r}, model={self.model_name!r}, {state})"


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port); OSError naming the address when that fails (the port
    is in use, the host is not an address of this machine)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            why = "the port is in use (another server?): stop it or choose another port"
        else:
            why = f"{exc.strerror or exc} (is {host!r} an address of this machine?)"
        error = OSError(f"cannot listen on {host}:{port}: {why}")
        error.errno = exc.errno
        raise error from None
    return sock
