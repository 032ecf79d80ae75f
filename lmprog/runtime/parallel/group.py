"""TPGroup: this process's membership in a tensor-parallel group, over torch.distributed.

Two process groups on one TCPStore, neither torch's default: `plan` (gloo, each step's
inputs) and `device` (the model's collectives: NCCL on CUDA, gloo on the CPU; its timeout
detects a hung rank). Rank 0 also owns its spawned workers and a watchdog; `close()` tears
everything down. Design: docs/design/tensor-parallel.md.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from .errors import ParallelError

log = logging.getLogger(__name__)

_IDLE = timedelta(days=30)


class _Backend(Protocol):
    """A process group's backend (Gloo's, NCCL's) as this module calls it. torch has these
    methods on every backend at runtime, but its stubs declare them on ProcessGroup only."""

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = ..., /) -> Any: ...

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], /
    ) -> Any: ...

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, /) -> Any: ...

    def broadcast(self, tensors: list[torch.Tensor], opts: Any, /) -> Any: ...

    def abort(self) -> None: ...

    def shutdown(self) -> None: ...


class TPGroup:
    """rank/world of this process; `device` its model's device. Collectives are called by
    one thread at a time (the engine thread on rank 0, the serving loop on workers)."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world: int,
        device: torch.device,
        *,
        timeout_s: float,
        hostname: str | None = None,
    ) -> None:
        self.rank, self.world, self.device = rank, world, device
        self.timeout_s = timeout_s
        self.store = store
        self.workers: list[subprocess.Popen[bytes]] = []  # rank 0: the processes it started
        self.devices: list[torch.device] = [device]  # rank 0: every rank's, where it knows
        self.replica: int | None = None  # the data-parallel replica this group serves
        self.on_failure: Callable[[ParallelError], None] | None = None
        self._closing = threading.Event()
        self.broken = False  # a failure was seen: close() does not wait for the workers
        self._plan = _gloo(dist.PrefixStore("plan", store), rank, world, _IDLE, hostname)
        timeout = timedelta(seconds=timeout_s)
        dev_store = dist.PrefixStore("device", store)
        if device.type == "cuda":
            torch.cuda.set_device(device)
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            # torch's stubs omit the collectives of Backend (see _Backend)
            self._dev: _Backend = dist.ProcessGroupNCCL(dev_store, rank, world, opts)  # type: ignore[assignment]
        else:
            self._dev = _gloo(dev_store, rank, world, timeout, hostname)
        self._nccl = device.type == "cuda"

    # ---- collectives on the device group -----------------------------------------------------
    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum t over the ranks, in place; returns t."""
        self._dev.allreduce([t]).wait()
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """[world, *t.shape]: every rank's t, by rank."""
        out = torch.empty((self.world, *t.shape), dtype=t.dtype, device=t.device)
        if self._nccl:
            self._dev._allgather_base(out, t).wait()
        else:
            self._dev.allgather([list(out.unbind(0))], [t]).wait()
        return out

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's t into every rank's t (device group), in place."""
        self._dev.broadcast([t], _root()).wait()
        return t

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN  # type: ignore[assignment]  # a RedOpType, as torch's docs use it
        self._dev.allreduce([t], opts).wait()
        return int(t.item())

    # ---- the plan group (host) -------------------------------------------------------------
    def broadcast_host(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's CPU tensor t into every rank's t (plan group), in place; rank 0 waits
        at most `timeout_s` for the others, they wait for it as long as the engine idles."""
        timeout = timedelta(seconds=self.timeout_s) if self.rank == 0 else None
        self._plan.broadcast([t], _root(timeout)).wait()
        return t

    def send_object(self, obj: Any) -> None:
        """Rank 0: a picklable object to every worker (recv_object there)."""
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()
        self.broadcast_host(torch.tensor([data.size], dtype=torch.int64))
        self.broadcast_host(torch.from_numpy(data))

    def recv_object(self) -> Any:
        size = self.broadcast_host(torch.zeros(1, dtype=torch.int64))
        data = self.broadcast_host(torch.empty(int(size), dtype=torch.uint8))
        return pickle.loads(data.numpy().tobytes())

    # ---- faults ------------------------------------------------------------------------------
    def failure(self, exc: BaseException | None = None) -> ParallelError:
        """A ParallelError saying what broke: a worker's exit code or its reported error,
        else `exc` (a collective's own error, e.g. its timeout)."""
        reasons = []
        if exc is not None:  # a peer's death breaks its sockets before it can be reaped
            deadline = time.monotonic() + 1.0
            while all(p.poll() is None for p in self.workers) and time.monotonic() < deadline:
                time.sleep(0.01)
        for rank in range(1, self.world):
            reported = self._reported_error(rank)
            if reported:
                reasons.append(f"rank {rank} failed: {reported}")
        for rank, proc in enumerate(self.workers, start=1):
            code = proc.poll()
            if code is not None and not any(f"rank {rank} " in r for r in reasons):
                reasons.append(f"rank {rank} exited (exit code {code})")
        if not reasons:
            reasons.append(
                f"a collective failed ({exc!r}); a rank hung past the {self.timeout_s:g} s "
                "timeout or died"
                if exc is not None
                else "a rank stopped"
            )
        self.broken = True
        if self.replica is None:
            who, outcome = "the tensor-parallel group", "the runtime is shut down"
        else:
            who = f"data-parallel replica {self.replica}'s tensor-parallel group"
            outcome = "that replica is shut down, the others serve on"
        return ParallelError(f"{who} (tp_size={self.world}) broke: {'; '.join(reasons)}; {outcome}")

    def report_error(self, message: str) -> None:
        """Worker: leave `message` for rank 0 before exiting (best effort)."""
        try:
            self.store.set(f"error/{self.rank}", message)
        except Exception:  # noqa: BLE001 - rank 0 may already be gone
            pass

    def _reported_error(self, rank: int) -> str | None:
        try:
            if self.store.check([f"error/{rank}"]):
                return self.store.get(f"error/{rank}").decode(errors="replace")
        except Exception:  # noqa: BLE001 - the store's host may be gone
            return None
        return None

    def watch(self) -> None:
        """Rank 0: a thread that calls on_failure when a spawned worker dies unasked. It
        holds the group weakly (a group dropped unclosed is collected, its workers killed)."""
        if self.workers:
            args = (weakref.ref(self), self.workers, self._closing)
            threading.Thread(
                target=_watch, args=args, name="lmprog-tp-watchdog", daemon=True
            ).start()

    def _on_worker_death(self) -> None:
        error = self.failure()
        log.error("%s", error)
        if self._nccl:  # a collective waiting on the dead rank would wait for its timeout
            _quietly(self._dev.abort)
        if self.on_failure is not None:
            self.on_failure(error)

    def close(self, join_timeout: float = 10.0, farewell: Callable[[], None] | None = None) -> None:
        """Tear the group down: `farewell()` (rank 0's stop message) while every worker is
        alive and the group sound, then wait for the workers to exit (not once broken),
        then terminate, then kill them. Idempotent; never raises."""
        if self._closing.is_set():
            return
        self._closing.set()  # from here a worker exiting is expected (the watchdog stops)
        if farewell is not None and not self.broken:
            if all(p.poll() is None for p in self.workers):
                _quietly(farewell)
        deadline = time.monotonic() + (0.0 if self.broken else join_timeout)
        for proc in self.workers:
            _wait(proc, deadline - time.monotonic())
        for proc in self.workers:
            if proc.poll() is None:
                proc.terminate()
                _wait(proc, 2.0)
            if proc.poll() is None:
                proc.kill()
                _wait(proc, 2.0)
        for pg in (self._dev, self._plan):
            _quietly(pg.abort if self.broken else pg.shutdown)
        del self._dev, self._plan  # destroyed now, not in the interpreter's teardown


def _watch(
    group: weakref.ref[TPGroup], workers: list[subprocess.Popen[bytes]], closing: threading.Event
) -> None:
    while not closing.wait(0.2):
        if any(p.poll() is not None for p in workers):
            live = group()
            if live is not None and not closing.is_set():
                live._on_worker_death()
            return
        if group() is None:
            return


def _gloo(
    store: dist.Store, rank: int, world: int, timeout: timedelta, hostname: str | None
) -> _Backend:
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # not in torch's stubs
    opts._timeout = timeout
    gloo = dist.ProcessGroupGloo
    interface = os.environ.get("GLOO_SOCKET_IFNAME")  # as torch's own gloo groups read it
    if hostname:
        device = gloo.create_device(hostname=hostname)
    elif interface:
        device = gloo.create_device(interface=interface.split(",")[0])
    else:
        device = gloo.create_default_device()
    opts._devices = [device]
    return gloo(store, rank, world, opts)  # type: ignore[return-value]  # see _Backend


def _root(timeout: timedelta | None = None) -> dist.BroadcastOptions:
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    if timeout is not None:  # else the group's own
        opts.timeout = timeout
    return opts


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(max(timeout, 0.0))
    except subprocess.TimeoutExpired:
        pass


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - tearing down a group that may already be broken
        pass
