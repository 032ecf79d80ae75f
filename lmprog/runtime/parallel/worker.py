"""A tensor-parallel worker (rank >= 1): builds its shard, then runs every step rank 0
broadcasts until rank 0 says stop or goes away.

    python -m lmprog.runtime.parallel.worker      # spawned by rank 0; its WorkerSpec on stdin

Design: docs/design/tensor-parallel.md.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)

_PARENT_POLL_S = 0.25  # how soon a worker notices that rank 0's process is gone


@dataclass(frozen=True)
class WorkerSpec:
    """What a spawned worker needs: where the group meets and what to build."""

    rank: int
    world: int
    host: str
    port: int
    device: str  # this rank's device, resolved by rank 0
    timeout_s: float
    start_timeout_s: float
    build: dict[str, Any]  # assemble_model's arguments (model included)
    num_threads: int | None
    parent_pid: int


@dataclass(frozen=True)
class KVRequest:
    """Rank 0 -> workers: size your KV pool from these (then all agree on the minimum),
    after your LoRA adapter pool when `lora` (rank 0's LoraManager.pool_config()) is set.
    embedding: first send rank 0 your rows of the token embedding (gather_embedding: an
    EAGLE-3 head on rank 0 shares the target's whole table)."""

    max_total_tokens: int | None
    gpu_memory_fraction: float
    kv_cache_dtype: str = "auto"
    lora: Any = None  # a LoraConfig, its rank and target modules resolved
    embedding: bool = False


@dataclass(frozen=True)
class RunnerSpec:
    """Rank 0 -> workers: the model runner every rank builds alike."""

    num_slots: int
    table_shape: tuple[int, int]
    cuda_graphs: bool
    piecewise_tokens: int
    kv_cache_dtype: str = "auto"


def serve_rank(group: Any, build: dict[str, Any]) -> None:
    """Build this rank's shard and run steps until rank 0 stops; on any error, report it to
    rank 0 and re-raise. Closes the group either way."""
    try:
        from ..assemble import assemble_model

        net = assemble_model(**build, tp=group)
        _serve(net, group)
    except BaseException as exc:
        group.report_error(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        group.close()


def _serve(net: Any, group: Any) -> None:
    import numpy as np

    from ..executor.kv_pool import kv_slots
    from ..executor.model_runner import ModelRunner
    from ..lora import LoraManager
    from .channel import StepChannel
    from .sharding import ShardPlan, gather_embedding

    kv: KVRequest = group.recv_object()
    if kv.embedding:
        gather_embedding(net, group)
    lora = None
    if kv.lora is not None:  # the adapters come with the steps (StepChannel), sharded here
        shard = ShardPlan(net.config, group.rank, group.world)
        lora = LoraManager(net, kv.lora, shard=shard)
    group.min_int(kv_slots(net, kv.max_total_tokens, kv.gpu_memory_fraction, kv.kv_cache_dtype))
    spec: RunnerSpec = group.recv_object()
    table = np.zeros(spec.table_shape, dtype=np.int32)
    runner = ModelRunner(
        net,
        spec.num_slots,
        table,
        cuda_graphs=spec.cuda_graphs,
        piecewise_tokens=spec.piecewise_tokens,
        kv_cache_dtype=spec.kv_cache_dtype,
        lora=lora,
    )
    channel = StepChannel(group, lora, kv_moves=runner.copy_kv)
    while (step := channel.recv(table)) is not None:
        runner.run(*step)


def _follow_parent(parent_pid: int) -> None:
    """Die when the process that spawned us does, even by SIGKILL: a thread watching our
    parent pid (an orphan is re-parented). Not PR_SET_PDEATHSIG: the kernel sends that when
    the *thread* that spawned us exits, and rank 0 may start its group from a short-lived
    thread (lp.Runtime built on a server's start-up thread) and serve on for hours."""
    if os.getppid() != parent_pid:  # it died before we got here
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="lmprog-tp-parent", daemon=True).start()


def main() -> None:
    spec: WorkerSpec = pickle.load(sys.stdin.buffer)
    _follow_parent(spec.parent_pid)
    import torch
    import torch.distributed as dist

    from .group import TPGroup

    if spec.num_threads:
        torch.set_num_threads(spec.num_threads)
    store = dist.TCPStore(
        spec.host,
        spec.port,
        spec.world,
        False,
        timeout=timedelta(seconds=spec.start_timeout_s),
    )
    store.set(f"ready/{spec.rank}", "1")
    try:
        group = TPGroup(
            store,
            spec.rank,
            spec.world,
            torch.device(spec.device),
            timeout_s=spec.timeout_s,
            hostname=spec.host,
        )
    except BaseException:
        store.set(f"error/{spec.rank}", traceback.format_exc(limit=1).strip())
        raise
    try:
        serve_rank(group, spec.build)
    except BaseException:  # reported to rank 0 already; the traceback goes to stderr
        log.exception("tensor-parallel rank %d failed", spec.rank)
        os._exit(1)
    os._exit(0)  # skip interpreter teardown: nothing left to flush, threads may hang it


if __name__ == "__main__":
    main()
