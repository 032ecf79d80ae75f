"""`lmprog serve` workers and SGLang's router as child processes on one machine.

    with Fleet.start(["--num-threads", "1"], ["--num-threads", "2"]) as fleet:
        fleet.urls                                   # each worker's http://127.0.0.1:PORT
        with SGLangRouter.start(fleet.urls) as router:
            router.url                               # send any request here

What the tests and bench/bench_fleet.py start; the one-machine form of docs/serving.md's recipe.
Design: docs/design/server.md#behind-a-router-the-worker-role.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

START_TIMEOUT_S = 180.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on `host` a moment ago."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw.strip() else None


@dataclass
class Worker:
    """One `lmprog serve` child: its process, URL (no /v1) and output lines so far."""

    proc: subprocess.Popen
    url: str
    lines: list[str] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> Worker:
        """`PREFIX python -m lmprog.serve --backend llamacpp --port 0 ARGS` (prefix: e.g.
        `taskset -c 0`), once it listens (its stderr is read on by a thread, so the pipe
        never fills)."""
        cmd = [*prefix, sys.executable, "-m", "lmprog.serve", "--backend", "llamacpp"]
        cmd += ["--port", "0"]
        proc = subprocess.Popen(
            [*cmd, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "LMPROG_LOG_LEVEL": "info", **(env or {})},
        )
        lines: list[str] = []
        deadline = time.monotonic() + START_TIMEOUT_S
        assert proc.stderr is not None
        while True:
            line = proc.stderr.readline()
            if not line or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError("lmprog serve did not start:\n" + "".join(lines[-30:]))
            lines.append(line)
            if "listening on " in line:
                url = line.split("listening on ")[1].split()[0].rstrip(",")
                break
        worker = cls(proc, url.removesuffix("/v1"), lines)
        threading.Thread(target=worker._drain, daemon=True).start()
        return worker

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if len(self.lines) < 10_000:
                self.lines.append(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Fleet:
    """Several workers; a context manager that stops them all."""

    workers: list[Worker]

    @classmethod
    def start(
        cls, *arg_lists: Sequence[str], prefixes: Sequence[Sequence[str]] | None = None
    ) -> Fleet:
        """One worker per argument list, started one after the other (each after its
        command prefix, when given)."""
        workers: list[Worker] = []
        try:
            for i, args in enumerate(arg_lists):
                workers.append(Worker.start(args, prefix=prefixes[i] if prefixes else ()))
        except BaseException:
            for w in workers:
                w.stop()
            raise
        return cls(workers)

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def stop(self) -> None:
        for w in self.workers:
            w.stop()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def sglang_router_available(package: str = "sglang_router") -> bool:
    """Whether the router package (sglang_router, or vllm_router) is installed."""
    import importlib.util

    return importlib.util.find_spec(package) is not None


@dataclass
class SGLangRouter:
    """`python -m sglang_router.launch_router` in front of `worker_urls`, on loopback."""

    proc: subprocess.Popen
    url: str
    log_path: str

    @classmethod
    def start(
        cls,
        worker_urls: Sequence[str],
        policy: str = "cache_aware",
        extra: Sequence[str] = (),
        log_path: str | None = None,
        timeout: float = 60.0,
        module: str = "sglang_router.launch_router",
    ) -> SGLangRouter:
        """Started and waited for until it lists every worker as healthy. module: also
        "vllm_router.launch_router" (vLLM's router, PyPI vllm-router, a fork of SGLang's)."""
        port, metrics_port = free_port(), free_port()
        cmd = [
            sys.executable,
            "-m",
            module,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(metrics_port),
            "--policy",
            policy,
            "--log-level",
            "warn" if module.startswith("sglang") else "warning",
            "--worker-urls",
            *worker_urls,
            *extra,
        ]
        if log_path is None:
            log_path = os.path.join(
                os.environ.get("TMPDIR", "/tmp"), f"sglang-router-{os.getpid()}-{port}.log"
            )
        env = {
            **os.environ,
            "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}",
            "HF_HUB_OFFLINE": "1",
        }
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        router = cls(proc, f"http://127.0.0.1:{port}", log_path)
        try:
            router.wait_healthy(len(worker_urls), timeout)
        except BaseException:
            router.stop()
            raise
        return router

    def workers(self) -> list[dict[str, Any]]:
        """The router's GET /workers: each worker's url, is_healthy, load, ..."""
        return list(get_json(self.url + "/workers").get("workers", []))

    def wait_healthy(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sglang-router exited {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                healthy = [w for w in self.workers() if w.get("is_healthy")]
                if len(healthy) >= count:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"sglang-router: {count} workers not healthy:\n{self.log()}")
            time.sleep(0.2)

    def log(self, tail: int = 40) -> str:
        with contextlib.suppress(OSError), open(self.log_path) as f:
            return "".join(f.readlines()[-tail:])
        return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> SGLangRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def sglang_fleet(
    worker_args: Sequence[Sequence[str]], policy: str = "cache_aware"
) -> Iterator[tuple[Fleet, SGLangRouter]]:
    """Workers and a router in front of them; all stopped on exit."""
    with Fleet.start(*worker_args) as fleet, SGLangRouter.start(fleet.urls, policy) as router:
        yield fleet, router
