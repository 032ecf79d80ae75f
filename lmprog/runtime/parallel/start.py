"""Starting a tensor-parallel group: rank 0 is the calling process; ranks 1.. are spawned here
(`python -m lmprog.runtime.parallel.worker`) or are the other processes of a torchrun launch.

    group = start_tensor_parallel(2, {"model": "smollm2-135m", "dtype": "auto", ...})
    net = assemble_model(**build, tp=group)             # rank 0's shard
    engine = launch_engine(net, tokenizer, ..., tp=group)

`start_groups(dp_size, tp_size, ...)` starts one group per replica. Design:
docs/design/tensor-parallel.md.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..models import load_config
from .group import TPGroup
from .sharding import check_shardable
from .worker import WorkerSpec, serve_rank

log = logging.getLogger(__name__)

TIMEOUT_S = 300.0  # a collective waiting longer than this means a rank hung
START_TIMEOUT_S = 600.0  # workers start and load their shards within this
_TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    return all(name in os.environ for name in _TORCHRUN)


def start_tensor_parallel(
    tp_size: int,
    build: dict[str, Any],
    *,
    device: str = "auto",
    timeout_s: float | None = None,
    num_threads: int | None = None,
    first_device: int = 0,
    replica: int | None = None,
) -> TPGroup:
    """The group of rank 0 (this process), its workers running and connected.

    build: assemble_model's keyword arguments, `model` included (picklable). timeout_s: the
    collective timeout (default $LMPROG_TP_TIMEOUT_S or 300). The tp_size is checked
    against the model's head counts before any process starts. first_device: rank r runs
    on cuda:(first_device + r) (on a GPU); replica: the data-parallel replica this group
    serves (named in its errors)."""
    timeout_s = _checked(tp_size, build, timeout_s)
    if under_torchrun():
        return _join_torchrun(tp_size, build, device, timeout_s)
    return _connect(_spawn(tp_size, build, device, timeout_s, num_threads, first_device, replica))


def start_groups(
    dp_size: int, tp_size: int, build: dict[str, Any], *, device: str = "auto"
) -> list[TPGroup]:
    """A tensor-parallel group per data-parallel replica (one group when dp_size is 1),
    started together: replica i's ranks on cuda:(i * tp_size + r) on a GPU host, else all on
    the CPU; this process is rank 0 of each. If one fails to start, the others are closed."""
    if dp_size == 1:
        return [start_tensor_parallel(tp_size, build, device=device)]
    timeout_s = _checked(tp_size, build, None)
    if rank_device(device, 0).type == "cuda" and torch.cuda.device_count() < dp_size * tp_size:
        raise ValueError(
            f"dp_size={dp_size} x tp_size={tp_size} needs {dp_size * tp_size} CUDA devices "
            f"(replica i on cuda:i*{tp_size}..), but this host has {torch.cuda.device_count()}"
        )
    threads = max(1, torch.get_num_threads() // (dp_size * tp_size))
    # Every replica's workers start at once, then each group connects.
    spawned: list[_Spawned] = []
    groups: list[TPGroup] = []
    try:
        for i in range(dp_size):
            spawned.append(_spawn(tp_size, build, device, timeout_s, threads, i * tp_size, i))
        for started in spawned:
            groups.append(_connect(started))
    except BaseException:
        for group in groups:
            group.close()
        for started in spawned[len(groups) :]:
            _kill(started.workers)
        raise
    log.info("data parallelism: %d replicas, each a tensor-parallel group", dp_size)
    return groups


def _checked(tp_size: int, build: dict[str, Any], timeout_s: float | None) -> float:
    """The collective timeout, once tp_size is known to split the model's heads."""

    check_shardable(load_config(build["model"]), tp_size)
    if tp_size < 2:
        raise ValueError(f"start_tensor_parallel needs tp_size >= 2, got {tp_size}")
    timeout_s = float(timeout_s if timeout_s else os.environ.get("LMPROG_TP_TIMEOUT_S", TIMEOUT_S))
    if timeout_s <= 0:
        raise ValueError(f"the tensor-parallel timeout must be positive, got {timeout_s}")
    return timeout_s


def rank_device(device: str, local_rank: int) -> torch.device:
    """Rank r's device: cuda:local_rank for "cuda" (or "auto" with CUDA), else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown device {device!r}; use 'auto', 'cpu' or 'cuda'") from exc
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda" or dev.index is not None:
        raise ValueError(
            f"with tp_size > 1 give device 'auto', 'cuda' or 'cpu' (rank r runs on cuda:r), "
            f"not {device!r}"
        )
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ValueError(
            f"tensor-parallel rank {local_rank} needs cuda:{local_rank}, but this host has "
            f"{count} CUDA device(s)"
        )
    return torch.device("cuda", local_rank)


@dataclass
class _Spawned:
    """A group's workers started, not yet connected."""

    store: dist.TCPStore
    workers: list[subprocess.Popen[bytes]]
    devices: list[torch.device]
    host: str
    timeout_s: float
    replica: int | None


def _spawn(
    tp_size: int,
    build: dict[str, Any],
    device: str,
    timeout_s: float,
    num_threads: int | None,
    first_device: int = 0,
    replica: int | None = None,
) -> _Spawned:
    devices = [rank_device(device, first_device + r) for r in range(tp_size)]
    host = "127.0.0.1"
    store = dist.TCPStore(
        host,
        0,
        tp_size,
        True,
        timeout=timedelta(seconds=START_TIMEOUT_S),
        wait_for_workers=False,
    )
    threads = num_threads or max(1, torch.get_num_threads() // tp_size)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])  # the folder holding the lmprog package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(1, tp_size):
            spec = WorkerSpec(
                rank,
                tp_size,
                host,
                store.port,
                str(devices[rank]),
                timeout_s,
                START_TIMEOUT_S,
                build,
                threads,
                os.getpid(),
            )
            proc = subprocess.Popen(
                [sys.executable, "-m", "lmprog.runtime.parallel.worker"],
                stdin=subprocess.PIPE,
                env=env,
            )
            workers.append(proc)
            assert proc.stdin is not None  # stdin=PIPE
            proc.stdin.write(pickle.dumps(spec))
            proc.stdin.close()
    except BaseException:
        _kill(workers)
        raise
    return _Spawned(store, workers, devices, host, timeout_s, replica)


def _connect(started: _Spawned) -> TPGroup:
    """Rank 0's group once its workers have reached the store."""
    workers, devices = started.workers, started.devices
    try:
        _wait_ready(started.store, workers)
        group = TPGroup(
            started.store,
            0,
            len(devices),
            devices[0],
            timeout_s=started.timeout_s,
            hostname=started.host,
        )
    except BaseException:
        _kill(workers)
        raise
    group.workers, group.devices, group.replica = workers, devices, started.replica
    weakref.finalize(group, _kill, workers)  # a group dropped unclosed leaves nothing running
    group.watch()
    log.info("tensor parallelism: %d ranks on %s", len(devices), ", ".join(map(str, devices)))
    return group


def _kill(workers: list[subprocess.Popen[bytes]]) -> None:
    for proc in workers:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _wait_ready(store: dist.Store, workers: list[subprocess.Popen[bytes]]) -> None:
    """Until every worker has reached the store; a worker that exits first is an error."""
    deadline = time.monotonic() + START_TIMEOUT_S
    keys = [f"ready/{rank}" for rank in range(1, len(workers) + 1)]
    while not store.check(keys):
        for rank, proc in enumerate(workers, start=1):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"tensor-parallel worker rank {rank} exited (code {proc.returncode}) "
                    "before joining the group; its error is above"
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"tensor-parallel workers did not start in {START_TIMEOUT_S} s")
        time.sleep(0.05)


def _join_torchrun(tp_size: int, build: dict[str, Any], device: str, timeout_s: float) -> TPGroup:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != tp_size:
        raise ValueError(
            f"torchrun started {world} processes but tp_size is {tp_size}; launch "
            f"torchrun with --nproc-per-node x --nnodes = {tp_size}"
        )
    dev = rank_device(device, int(os.environ["LOCAL_RANK"]))
    store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=START_TIMEOUT_S)))
    group = TPGroup(dist.PrefixStore("lmprog-tp", store), rank, world, dev, timeout_s=timeout_s)
    if rank == 0:
        return group
    try:
        serve_rank(group, build)
    except BaseException:
        log.exception("tensor-parallel rank %d failed", rank)
        raise SystemExit(1) from None
    raise SystemExit(0)


def check_tp_size(tp_size: int, dp_size: int = 1) -> None:
    """ValueError unless tp_size is an int >= 1 this launch can combine with dp_size."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tp_size must be an int >= 1, got {tp_size!r}")
    if tp_size > 1 and dp_size != 1 and under_torchrun():
        raise ValueError(
            f"tp_size={tp_size} with dp_size={dp_size} under torchrun: a torchrun launch is "
            "one tensor-parallel group; start lmprog without torchrun (it spawns every "
            "replica's workers), or one torchrun launch per replica behind a load balancer"
        )
