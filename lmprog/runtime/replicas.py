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

Load is each replica's outstanding requests (submitted, not yet ended).

Faults. A replica whose engine thread ended (an engine bug it could not recover from, its
shutdown, or a rank of its tensor-parallel group dying or hanging: the engine fails its
pending requests with a ParallelError and closes that group, killing its workers) is marked
dead in the router, which never routes to it again. A request that fails on a replica with a
BackendError (that death, or a model step that failed: the engine resets and serves on)
before its caller saw any output (no streamed piece; a non-streamed request until its result)
is submitted again to another replica, each replica at most once, and a constrained one with
a fresh copy of its guide; one that had streamed output fails with the error, which says so.
A replica whose engine makes no step for `hang_timeout_s` while it has requests is hung: it
is suspended (out of rotation, its router tree kept), its requests without output move to
other replicas and are aborted there, those with output fail with a BackendError naming the
hang; it is put back in rotation once it steps again (or has nothing left). Requests the
caller aborts, and every request once the group shuts down, are never retried. With no
replica left to take a request, submit raises BackendError.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from lmprog.core.errors import BackendError

from .engine_io import _DONE, _ERROR, _PIECE, RequestHandle
from .router import Decision, Router, RouterConfig

log = logging.getLogger(__name__)

GPU_MEMORY_FRACTION = 0.85  # launch_engine's default share of free GPU memory for KV
HANG_TIMEOUT_S = 120.0  # no engine step for this long with requests in it: the replica hung

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
    stats(), flush_cache(), check_integrity(), shutdown(), alive). Requests whose engine
    handle is a RequestHandle get the retries and moves of the module docstring (the caller
    holds a RequestHandle of the group's); other handles are returned as they are.
    hang_timeout_s: seconds without an engine step, with requests in it, after which a
    replica counts as hung (None: never)."""

    def __init__(
        self,
        replicas: Sequence[Any],
        config: RouterConfig | None = None,
        devices: Sequence[str] | None = None,
        hang_timeout_s: float | None = HANG_TIMEOUT_S,
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
        self._lock = threading.RLock()
        self._closed = False
        self._rids = itertools.count()
        self._inflight: list[set[_Routed]] = [set() for _ in self.replicas]
        self._inflight_lock = threading.Lock()  # taken last, never held while taking another
        self.retries = 0  # requests submitted again after a replica failed them
        self.hangs = 0  # times a replica was found hung
        self.hang_timeout_s = hang_timeout_s
        self._watch_stop = threading.Event()
        if hang_timeout_s is not None:
            if not hang_timeout_s > 0:
                raise ValueError(f"hang_timeout_s must be > 0 or None, got {hang_timeout_s!r}")
            threading.Thread(target=self._watch, name="lmprog-dp-watchdog", daemon=True).start()

    # ---- requests --------------------------------------------------------------------------
    def submit(self, request: Any, stream: bool = True) -> Any:
        """Route `request` (an EngineRequest) and submit it to that replica's engine. A
        prefill-only request without prompt logprobs (what cache_prefix sends) pins its
        prefix to the replica. Raises what the engine's submit raises (ContextLengthError:
        nothing was queued), or BackendError once every replica is dead or shut down."""
        routed = _Routed(self, request, stream)
        handle = self._place(routed, request)
        if not isinstance(handle, RequestHandle):  # a test's fake engine
            return handle
        return routed.outer

    def _place(self, routed: _Routed, request: Any) -> Any:
        """Route and submit `request` for `routed` to a replica it has not failed on; the
        engine's handle (its events forwarded to routed.outer when it is a RequestHandle)."""
        pin = request.params.max_tokens == 0 and request.prompt_logprob_start is None
        with self._lock:
            while True:
                if self._closed:
                    raise BackendError("the runtime engine is shut down; create a new Runtime")
                decision = self._route(request.prompt_ids, routed.failed)
                engine = self.replicas[decision.replica]
                try:
                    handle = engine.submit(request, stream=routed.stream)
                except BackendError:  # its thread ended between the check and the submit
                    self._mark_dead(decision.replica)
                    continue
                self.router.record(decision, request.prompt_ids, pin=pin)
                self._pending[decision.replica].append(handle)
                if isinstance(handle, RequestHandle):
                    with self._inflight_lock:
                        self._inflight[decision.replica].add(routed)
                    routed.attach(decision.replica, engine, handle)
                return handle

    def _retry(self, routed: _Routed, replica: int, error: BaseException) -> bool:
        """`routed` failed on `replica` with `error` before any output: submit it to another
        replica (True), or False when none is left (its caller gets `error`)."""
        routed.failed.add(replica)
        self._done(routed, replica)
        request = routed.request
        if routed.guide is not None:
            request = dataclasses.replace(request, guide=routed.guide.copy())
        try:
            self._place(routed, request)
        except Exception:  # noqa: BLE001 - nowhere left: the first error is the answer
            return False
        with self._lock:
            self.retries += 1
        log.warning(
            "data-parallel replica %d failed a request before its first output (%s); "
            "submitted again to replica %d",
            replica,
            error,
            routed.replica,
        )
        return True

    def _done(self, routed: _Routed, replica: int) -> None:
        with self._inflight_lock:
            self._inflight[replica].discard(routed)

    # ---- hangs -----------------------------------------------------------------------------
    def _watch(self) -> None:
        """Every replica's engine steps while it has requests; one that does not for
        hang_timeout_s is suspended, and put back once it steps again (module docstring)."""
        assert self.hang_timeout_s is not None
        period = min(1.0, self.hang_timeout_s / 4)
        last = [(-1, time.monotonic()) for _ in self.replicas]
        while not self._watch_stop.wait(period):
            for i, engine in enumerate(self.replicas):
                if not self.router.alive[i]:
                    continue
                try:
                    steps = int(engine.stats().get("steps", 0))
                except Exception:  # noqa: BLE001 - a snapshot that cannot be read: no news
                    continue
                with self._lock:
                    busy = bool(self.loads()[i])
                now = time.monotonic()
                if steps != last[i][0] or not busy:
                    last[i] = (steps, now)
                    if self.router.suspended[i]:
                        self.router.suspend(i, False)
                        log.warning("data-parallel replica %d steps again: back in rotation", i)
                elif not self.router.suspended[i] and now - last[i][1] > self.hang_timeout_s:
                    self._hung(i, now - last[i][1])

    def _hung(self, replica: int, idle_s: float) -> None:
        self.router.suspend(replica)
        with self._inflight_lock:
            self.hangs += 1
            moving = list(self._inflight[replica])
        log.warning(
            "data-parallel replica %d made no step for %.0f s with %d requests in it: out of "
            "rotation until it steps again; its requests without output move elsewhere",
            replica,
            idle_s,
            len(moving),
        )
        error = BackendError(
            f"data-parallel replica {replica} hung (no engine step for {idle_s:.0f} s) after "
            "this request had output; not retried"
        )
        for routed in moving:
            routed.move_off(replica, error)

    def _route(self, tokens: Sequence[int], exclude: Sequence[int] = ()) -> Decision:
        for i, engine in enumerate(self.replicas):
            if self.router.alive[i]:
                if not engine.alive:
                    self._mark_dead(i)
                    continue
                errors = self._internal_errors(i)
                if errors != self._resets[i]:  # the engine reset: its prefix cache is empty
                    self._resets[i] = errors
                    self.router.forget(i)
        return self.router.choose(tokens, self.loads(), exclude)

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
        out["dp_retries"], out["dp_hangs"] = self.retries, self.hangs
        out["replicas"] = [
            {
                **s,
                "alive": ok,
                "suspended": r["suspended"],
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
        self._watch_stop.set()
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


class _Routed:
    """One request through the group: the caller's handle (`outer`), where the request runs
    now, and whether its caller has seen output. The engine handle of each attempt forwards
    its events here (its queue is replaced by a _Forward); events of an attempt the request
    has left are dropped."""

    def __init__(self, group: ReplicaGroup, request: Any, stream: bool) -> None:
        self.group = group
        self.request = request
        self.stream = stream
        self.guide = request.guide.copy() if request.guide is not None else None
        self.outer = RequestHandle(("dp", next(group._rids)), self._abort, stream)
        self.failed: set[int] = set()
        self.replica = -1
        self.engine: Any = None
        self.inner: RequestHandle | None = None
        self.produced = False  # a piece reached the caller
        self.finished = False
        self.aborted = False
        self.lock = threading.Lock()

    def attach(self, replica: int, engine: Any, inner: RequestHandle) -> None:
        """The request now runs as `inner` on `replica`: take over its events (those put
        before the switch first, in order)."""
        retry = None
        with self.lock:
            self.replica, self.engine, self.inner = replica, engine, inner
            old = inner._events
            inner._events = _Forward(self, inner)  # type: ignore[assignment]
            while retry is None:
                try:
                    event = old.get_nowait()
                except queue.Empty:
                    break
                retry = self._take(inner, event)
            aborted = self.aborted
        if aborted:  # the caller aborted while the request was moving
            engine.abort(inner.rid)
        self._retry(retry)

    def deliver(self, inner: RequestHandle, event: tuple[int, Any]) -> None:
        with self.lock:
            retry = self._take(inner, event)
        self._retry(retry)

    def _retry(self, retry: tuple[int, BaseException] | None) -> None:
        if retry is not None:
            replica, error = retry
            if not self.group._retry(self, replica, error):
                with self.lock:
                    self._finish()
                    self.outer.put_error(error)

    def _take(self, inner: RequestHandle, event: tuple[int, Any]) -> tuple[int, Any] | None:
        """Handle one event of `inner` (lock held); (replica, error) when it is to be retried."""
        if inner is not self.inner or self.finished:
            return None  # an attempt the request left
        kind, value = event
        if kind == _PIECE:
            self.produced = True
            self.outer._events.put(event)
        elif kind == _DONE:
            self._finish()
            self.outer.put_result(value)
        elif kind == _ERROR:
            if self._retryable(value):
                self.inner = None  # until attached elsewhere: its later events are dropped
                return self.replica, value
            self._finish()
            self.outer.put_error(value)
        return None

    def _retryable(self, error: BaseException) -> bool:
        return (
            isinstance(error, BackendError)
            and not isinstance(error, ValueError)
            and not self.produced
            and not self.aborted
            and not self.group._closed
        )

    def _finish(self) -> None:
        self.finished = True
        if self.inner is not None:
            self.outer.first_token_at = self.inner.first_token_at
        self.group._done(self, self.replica)

    def move_off(self, replica: int, error: BaseException) -> None:
        """Its replica hung: run it elsewhere if its caller saw nothing, else fail it."""
        with self.lock:
            if self.finished or self.replica != replica or self.inner is None:
                return
            inner, engine = self.inner, self.engine
            self.inner = None  # the hung attempt's events, if any come, are dropped
            produced = self.produced or self.aborted
        engine.abort(inner.rid)  # frees it there once the engine runs again
        if produced or not self.group._retry(self, replica, error):
            with self.lock:
                if not self.finished:
                    self._finish()
                    self.outer.put_error(error)

    def _abort(self, _rid: Any) -> None:
        with self.lock:
            self.aborted = True
            inner, engine = self.inner, self.engine
        if inner is not None and engine is not None:
            engine.abort(inner.rid)


class _Forward:
    """Stands in for an engine handle's event queue: every event goes to its _Routed."""

    def __init__(self, routed: _Routed, inner: RequestHandle) -> None:
        self.routed, self.inner = routed, inner

    def put(self, event: tuple[int, Any]) -> None:
        self.routed.deliver(self.inner, event)
