"""ReplicaGroup: data parallelism in one process, several engines behind one `submit`.

    group = launch_replicas(2, net, build=..., launch=...)   # lp.Runtime(dp_size=2) does this
    handle = group.submit(EngineRequest(ids, params))        # routed by lmprog.runtime.router
    group.stats(); group.flush_cache(); group.shutdown()

Each replica is a whole engine (its own thread, KV pool, prefix cache and scheduler). Where
replicas share a device they share one model: the weights are read-only during a forward
pass (every per-step tensor lives in the runner, the KV pool or the batch), so on a CPU, or
one GPU, `dp_size` replicas cost one set of weights and `dp_size` KV pools. With several
GPUs, replica i runs on cuda:(i mod count) with its own copy of the weights.

With tensor parallelism (`tp_size > 1`) each replica is a tensor-parallel group of its own
(lmprog.runtime.parallel.start.start_groups): its engine thread here is the group's rank 0,
its other ranks are worker processes, replica i's ranks on cuda:(i * tp_size + r) (or all on
the CPU); each replica holds its own shards.

On a CPU the replicas' engine threads share the cores (torch's intra-op threads are
process-wide): data parallelism there buys separate caches and batches, not more compute.

Load is each replica's outstanding requests (submitted, not yet ended). Faults: a replica
whose engine thread ended (an engine bug it could not recover from, its shutdown, or a rank
of its tensor-parallel group dying or hanging: the engine fails its pending requests with a
ParallelError and closes that group, killing its workers) fails its own pending requests
with BackendError (the engine does that); the group then marks it dead in the router, which
stops routing to it, and the others serve on. With every replica dead, submit raises
BackendError.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from lmprog.core.errors import BackendError

from .router import Decision, Router, RouterConfig

log = logging.getLogger(__name__)

GPU_MEMORY_FRACTION = 0.85  # launch_engine's default share of free GPU memory for KV

# engine stats summed over the replicas: counters over all, gauges over the living ones
_COUNTERS = (
    "prompt_tokens",
    "cached_tokens",
    "num_retractions",
    "steps",
    "prefill_tokens",
    "decode_tokens",
    "generated_tokens",
    "jump_forward_tokens",
    "kv_evicted_tokens",
    "overlapped_steps",
    "internal_errors",
    "busy_seconds",
    "spec_draft_tokens",
    "spec_verified_tokens",
    "spec_accepted_tokens",
    "spec_verify_steps",
    "spec_guide_cuts",
    "spec_jump_verifies",
)
_GAUGES = (
    "num_running",
    "num_waiting",
    "kv_capacity",
    "kv_used",
    "kv_evictable",
    "gen_tokens_per_s",
    "recent_gen_tokens_per_s",
)


def check_dp_size(dp_size: Any) -> int:
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        raise ValueError(f"dp_size must be an int >= 1, got {dp_size!r}")
    return dp_size


class ReplicaGroup:
    """Engines behind one front door. Thread-safe; the surface lp.Runtime uses of an Engine
    (submit, stats, flush_cache, check_integrity, shutdown, alive), each replica reachable
    as `replicas[i]`.

    replicas: Engine-like objects (submit(request, stream) -> handle with `finished_at`,
    stats(), flush_cache(), check_integrity(), shutdown(), alive)."""

    def __init__(
        self,
        replicas: Sequence[Any],
        config: RouterConfig | None = None,
        devices: Sequence[str] | None = None,
    ) -> None:
        if not replicas:
            raise ValueError("a replica group needs at least one engine")
        self.replicas = list(replicas)
        self.devices = list(devices) if devices is not None else [None] * len(self.replicas)
        sizes = [int(e.stats().get("kv_capacity") or 0) or None for e in self.replicas]
        self.router = Router(
            len(self.replicas),
            config,
            [s if s is not None else 1 << 20 for s in sizes],
        )
        self._pending: list[list[Any]] = [[] for _ in self.replicas]
        self._resets = [self._internal_errors(i) for i in range(len(self.replicas))]
        self._lock = threading.Lock()
        self._closed = False

    # ---- requests --------------------------------------------------------------------------
    def submit(self, request: Any, stream: bool = True) -> Any:
        """Route `request` (an EngineRequest) and submit it to that replica's engine. A
        prefill-only request without prompt logprobs (what cache_prefix sends) pins its
        prefix to the replica. Raises what the engine's submit raises (ContextLengthError:
        nothing was queued), or BackendError once every replica is dead or shut down."""
        pin = request.params.max_tokens == 0 and request.prompt_logprob_start is None
        with self._lock:
            while True:
                if self._closed:
                    raise BackendError("the runtime engine is shut down; create a new Runtime")
                decision = self._route(request.prompt_ids)
                engine = self.replicas[decision.replica]
                try:
                    handle = engine.submit(request, stream=stream)
                except BackendError:  # its thread ended between the check and the submit
                    self._mark_dead(decision.replica)
                    continue
                self.router.record(decision, request.prompt_ids, pin=pin)
                self._pending[decision.replica].append(handle)
                return handle

    def _route(self, tokens: Sequence[int]) -> Decision:
        for i, engine in enumerate(self.replicas):
            if self.router.alive[i]:
                if not engine.alive:
                    self._mark_dead(i)
                    continue
                errors = self._internal_errors(i)
                if errors != self._resets[i]:  # the engine reset: its prefix cache is empty
                    self._resets[i] = errors
                    self.router.forget(i)
        return self.router.choose(tokens, self.loads())

    def loads(self) -> list[int]:
        """Outstanding requests per replica (dropping the ended ones from the count)."""
        for i, pending in enumerate(self._pending):
            self._pending[i] = [h for h in pending if h.finished_at is None]
        return [len(p) for p in self._pending]

    def _mark_dead(self, replica: int) -> None:
        if self.router.alive[replica]:
            log.warning(
                "data-parallel replica %d (of %d) stopped; its pending requests failed and "
                "no request is routed to it any more",
                replica,
                len(self.replicas),
            )
            self.router.mark_dead(replica)
        self._pending[replica] = []

    def _internal_errors(self, replica: int) -> int:
        return int(self.replicas[replica].stats().get("internal_errors", 0))

    # ---- the engine surface ----------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """True while some replica serves."""
        return not self._closed and bool(self._living())

    def _living(self) -> list[tuple[int, Any]]:
        return [(i, e) for i, e in enumerate(self.replicas) if self.router.alive[i] and e.alive]

    def flush_cache(self) -> bool:
        """Empty every living replica's prefix cache; False if one had requests running
        (the others are flushed all the same)."""
        done = True
        for i, engine in self._living():
            if engine.flush_cache():
                self.router.forget(i)
            else:
                done = False
        return done

    def check_integrity(self) -> None:
        for _, engine in self._living():
            engine.check_integrity()

    def set_speculation(self, enabled: bool) -> None:
        for _, engine in self._living():
            engine.set_speculation(enabled)

    def set_overlap(self, enabled: bool) -> None:
        for _, engine in self._living():
            engine.set_overlap(enabled)

    def stats(self) -> dict[str, Any]:
        """The replicas' engine stats summed (rates too: the replicas run side by side;
        gauges over the living replicas), the ratios recomputed, settings and anything else
        from the first replica; plus dp_size, replicas_alive and `replicas`: per replica its
        own stats with alive, device, load, tree_tokens (the router's view) and routed
        (requests by reason)."""
        with self._lock:
            loads = self.loads()
        per = [e.stats() for e in self.replicas]
        routing = self.router.stats()
        alive = [self.router.alive[i] and e.alive for i, e in enumerate(self.replicas)]
        out = dict(per[0])  # settings (radix_cache, eviction, speculative, ...) from the first
        for key in _COUNTERS + _GAUGES:
            if key in out:
                live = key in _GAUGES
                out[key] = sum(s.get(key, 0) for s, ok in zip(per, alive) if ok or not live)
        finished: dict[str, int] = {}
        for s in per:
            for reason, n in s.get("requests_finished", {}).items():
                finished[reason] = finished.get(reason, 0) + n
        out["requests_finished"] = finished
        prompt, capacity = out.get("prompt_tokens", 0), out.get("kv_capacity", 0)
        out["cache_hit_rate"] = out.get("cached_tokens", 0) / prompt if prompt else 0.0
        out["kv_usage"] = out.get("kv_used", 0) / capacity if capacity else 0.0
        if "spec_verified_tokens" in out:
            verified, steps = out["spec_verified_tokens"], out["spec_verify_steps"]
            accepted = out["spec_accepted_tokens"]
            out["spec_acceptance_rate"] = accepted / verified if verified else 0.0
            out["spec_tokens_per_verify"] = (accepted + steps) / steps if steps else 0.0
        out["uptime_seconds"] = max(s.get("uptime_seconds", 0.0) for s in per)
        out["dp_size"] = len(self.replicas)
        out["replicas_alive"] = sum(alive)
        out["replicas"] = [
            {
                **s,
                "alive": ok,
                "device": dev,
                "load": load,
                "tree_tokens": r["tree_tokens"],
                "routed": r["routed"],
            }
            for s, ok, dev, load, r in zip(per, alive, self.devices, loads, routing)
        ]
        return out

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Stop every replica; unfinished requests fail with BackendError. Idempotent."""
        self._closed = True
        for engine in self.replicas:
            engine.shutdown(timeout)

    def __repr__(self) -> str:
        alive = len(self._living())
        return f"ReplicaGroup({len(self.replicas)} replicas, {alive} alive)"


def replica_devices(dp_size: int, device: str, first: str, cuda_count: int) -> list[str]:
    """Each replica's device: a named device ("cpu", "cuda:N") or the device the first
    model landed on holds them all, except that "auto"/"cuda" on a CUDA host with several
    GPUs puts replica i on cuda:(i mod cuda_count)."""
    spread = device in ("auto", "cuda") and first.startswith("cuda") and cuda_count > 1
    if spread:
        return [f"cuda:{i % cuda_count}" for i in range(dp_size)]
    return [first] * dp_size


def launch_replicas(
    dp_size: int,
    net: Any,
    *,
    device: str,
    build: Callable[..., Any],
    launch: Callable[..., Any],
    config: RouterConfig | None = None,
    groups: Sequence[Any] = (),
) -> ReplicaGroup:
    """dp_size engines: `net` (already built, on its device) serves the replicas on that
    device, build(device) makes the model of each other device once; launch(model,
    gpu_memory_fraction) starts one engine. Replicas sharing a GPU split its free memory
    evenly for their KV pools. If one fails to start, the ones started are shut down.
    groups: one tensor-parallel group per replica (start_groups): `net` is the first
    group's shard, build(device, tp=group) builds each other's, launch(model, tp=group)
    starts its engine, which owns the group from then on."""
    if groups:
        return _launch_groups(net, groups, device, build, launch, config)
    import torch

    first = _device_name(net)
    count = torch.cuda.device_count() if first.startswith("cuda") else 0
    devices = replica_devices(dp_size, device, first, count)
    models = {first: net}
    engines: list[Any] = []
    try:
        for i, dev in enumerate(devices):
            sharing, before = devices.count(dev), devices[:i].count(dev)
            with on_device(dev):
                if dev not in models:
                    models[dev] = build(dev)
                fraction = memory_fraction(before, sharing)
                engines.append(launch(models[dev], gpu_memory_fraction=fraction))
            log.info("data-parallel replica %d of %d on %s", i, dp_size, dev)
    except BaseException:
        for engine in engines:
            engine.shutdown()
        raise
    return ReplicaGroup(engines, config, devices)


def _launch_groups(
    net: Any,
    groups: Sequence[Any],
    device: str,
    build: Callable[..., Any],
    launch: Callable[..., Any],
    config: RouterConfig | None,
) -> ReplicaGroup:
    engines: list[Any] = []
    try:
        for i, tp in enumerate(groups):
            with on_device(tp.device):
                engines.append(launch(net if i == 0 else build(device, tp=tp), tp=tp))
            names = ", ".join(str(d) for d in tp.devices)
            log.info(
                "data-parallel replica %d of %d: tensor-parallel ranks on %s", i, len(groups), names
            )
    except BaseException:
        for engine in engines:
            engine.shutdown()
        for tp in groups:  # the groups no engine owns yet (closing is idempotent)
            tp.close()
        raise
    return ReplicaGroup(engines, config, [",".join(map(str, tp.devices)) for tp in groups])


def on_device(device: Any) -> contextlib.AbstractContextManager:
    """A GPU made this thread's current device while a replica is built and started there
    (graph capture and Triton launches use the current device, not the tensors')."""
    import torch

    device = torch.device(device)
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def memory_fraction(before: int, sharing: int, total: float = GPU_MEMORY_FRACTION) -> float:
    """The share of the free GPU memory replica number `before` (0-based) of the `sharing`
    on one GPU takes for its KV pool, so that each ends up with total / sharing of what
    was free before the first: total / (sharing - total * before)."""
    return total / (sharing - total * before)


def _device_name(net: Any) -> str:
    dev = next(net.parameters()).device
    if dev.type == "cuda":
        return f"cuda:{dev.index if dev.index is not None else 0}"
    return str(dev)
