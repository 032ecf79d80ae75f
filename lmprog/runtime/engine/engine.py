"""Engine: the background loop that serves every request of a runtime (continuous batching).

    engine = launch_engine(net, tokenizer, eos_token_ids=(2,))    # lmprog.runtime
    handle = engine.submit(EngineRequest(prompt_ids, params))     # any thread
    result = handle.result()

One engine thread owns the scheduler, the model runner and the requests' DecodeStates; per
step it advances the step in flight, `inflight = _advance(inflight)`: choose drafts,
schedule, launch, settle the previous step once, record. Overlap scheduling, finish rules,
LoRA and fault isolation: docs/design/engine-step.md.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import torch

from lmprog.core.errors import BackendError, LoraError
from lmprog.decoding.batch_sampler import BatchSampler
from lmprog.decoding.decode_state import DecodeState

from ..config import EngineConfig
from ..executor.host_kv import HostKVMover
from ..executor.model_runner import ModelRunner
from ..parallel.errors import ParallelError
from ..request import Req, ReqOutputs, ReqStatus
from ..scheduler import ScheduledBatch, Scheduler
from ..speculative.speculator import Speculator
from .io import EngineRequest, RequestHandle
from .metrics import EngineMetrics
from .step_outputs import DeferredStep, StepOutputs

log = logging.getLogger(__name__)

_SUBMIT, _ABORT, _CALL, _STOP = range(4)


class Engine:
    """Owns the engine thread. Thread-safe: submit/abort/call/stats/shutdown from anywhere."""

    def __init__(
        self,
        runner: ModelRunner,
        scheduler: Scheduler,
        tokenizer: Any,
        *,
        eos_token_ids: Sequence[int],
        config: EngineConfig | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        """speculator: verify draft tokens in the batch (None: no speculative decoding)."""
        self.runner = runner
        self.scheduler = scheduler
        if scheduler.cache_config.host_kv_cache_bytes:  # the host tier copies the pool's KV
            if getattr(runner, "channel", None) is not None:
                raise ValueError("host_kv_cache_bytes does not work with tensor parallelism yet")
            tiers = scheduler.cache_config
            disk = tiers.disk_kv_cache_dir if tiers.disk_kv_cache_bytes else None
            if tiers.disk_kv_cache_bytes and disk is None:
                disk = ""  # the system's temporary folder
            mover = HostKVMover(runner.kv, disk_dir=disk, host_bytes=tiers.host_kv_cache_bytes)
            scheduler.cache.attach_host_tier(mover)
        self.speculator = speculator
        self.config = config or EngineConfig()
        self.eos_token_ids = tuple(eos_token_ids)
        self._tokenizer = tokenizer
        self._outputs = StepOutputs(BatchSampler(self.eos_token_ids))
        overlap = self.config.overlap
        self._overlap = runner.device.type == "cuda" if overlap is None else overlap
        self._inflight: DeferredStep | None = None  # launched, its tokens not read yet
        self._token_texts: dict[int, str] = {}
        self._handles: dict[Hashable, RequestHandle] = {}
        # Outcomes are handed over after the step's stats are published, so a caller that
        # sees its result also sees it counted in stats().
        self._outbox: list[tuple[RequestHandle, Any]] = []
        self._commands: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._rids = itertools.count()
        self._closed = False
        self._stop_error: BaseException | None = None  # what shutdown(error=) fails them with
        self._close_lock = threading.Lock()
        self.metrics = EngineMetrics()
        self._snapshot: dict[str, Any] = {}
        self._publish()
        self._thread = threading.Thread(target=self._run, name="lmprog-engine", daemon=True)
        self._thread.start()

    # ---- any thread ------------------------------------------------------------------------
    def submit(self, request: EngineRequest, stream: bool = True) -> RequestHandle:
        """Queue a request. Raises ContextLengthError if its prompt cannot fit, BackendError
        once shut down; nothing is queued then. With stream=False the handle gets no text
        pieces, only the result (the caller's thread is not woken per token)."""
        if not isinstance(request, EngineRequest):
            raise TypeError(f"submit takes an EngineRequest, got {type(request).__name__}")
        self.scheduler.check_fits(len(request.prompt_ids))  # raise in the caller's thread
        handle = RequestHandle(next(self._rids), self.abort, stream)
        with self._close_lock:
            self._check_open()
            self._commands.put((_SUBMIT, (handle, request)))
        return handle

    def abort(self, rid: Hashable) -> None:
        """Finish request rid with "abort" (its result keeps the text so far). Safe anytime."""
        if not self._closed:
            self._commands.put((_ABORT, rid))

    def call(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run fn() on the engine thread between steps; return its result or raise its error."""
        future: Future[Any] = Future()
        with self._close_lock:
            self._check_open()
            self._commands.put((_CALL, (fn, future)))
        return future.result(timeout)

    def check_integrity(self) -> None:
        """Raise IntegrityError unless the scheduler's bookkeeping is consistent."""
        self.call(self.scheduler.check_integrity)

    def flush_cache(self) -> bool:
        """Empty the prefix cache; False (nothing done) while requests run."""
        return self.call(self.scheduler.flush_cache)

    def set_speculation(self, enabled: bool) -> None:
        """Switch speculative decoding on or off from the next step (e.g. to compare both
        in one run). ValueError when the engine was built without a speculator."""
        spec = self.speculator
        if spec is None:
            raise ValueError(
                "this engine was built without speculative decoding; pass "
                "speculative=... when creating it"
            )
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {enabled!r}")

        def switch() -> None:
            spec.enabled = enabled

        self.call(switch)

    # ---- LoRA adapters ---------------------------------------------------------------------
    @property
    def lora(self) -> Any:
        """The LoraManager (None: this engine serves no adapters)."""
        return self.runner.lora

    def load_lora_adapter(self, name: str, path: str, *, adapter: Any = None) -> dict[str, Any]:
        """Load the PEFT adapter folder `path` under `name` (read and checked here, then
        registered between steps); its description. LoraError when it cannot be served
        (the adapters already loaded are untouched). adapter: the folder read already
        (a LoraAdapter named `name`; data parallelism reads it once for every replica)."""
        manager = self._need_lora()
        if adapter is None:
            adapter = manager.read(name, path)
        else:
            if adapter.name != name:
                raise ValueError(f"the adapter given is {adapter.name!r}, not {name!r}")
            manager.check(adapter)
        self.call(lambda: manager.register(adapter))
        return next(a for a in self.lora_adapters() if a["name"] == name)

    def unload_lora_adapter(self, name: str) -> None:
        """Unload adapter `name`: new requests cannot name it; unfinished ones finish with
        it. LoraError (unknown) when no adapter has that name."""
        manager = self._need_lora()
        self.call(lambda: manager.unregister(name, self._lora_in_use()))

    def lora_adapters(self) -> list[dict[str, Any]]:
        """The loaded adapters (name, path, rank, target_modules, uid); [] without LoRA.
        Any thread, without waiting for the engine (a snapshot taken at each change)."""
        manager = self.runner.lora
        return [] if manager is None else [dict(a) for a in manager.snapshot]

    def _need_lora(self) -> Any:
        if self.runner.lora is None:
            raise LoraError(
                "this runtime serves no LoRA adapters; start it with lora_paths=... or "
                "enable_lora=True (lmprog serve --lora-paths / --enable-lora)"
            )
        return self.runner.lora

    def _lora_in_use(self) -> set[int]:
        return {r.lora_id for r in self.scheduler.requests.all() if r.lora_id}

    def set_overlap(self, enabled: bool) -> None:
        """Switch overlap scheduling on or off from the next step (EngineConfig.overlap), e.g.
        to compare both in one run."""
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {enabled!r}")

        def switch() -> None:
            self._overlap = enabled

        self.call(switch)

    def stats(self) -> dict[str, Any]:
        """The latest snapshot (updated after every step and command)."""
        return dict(self._snapshot)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self, timeout: float | None = 30.0, error: BaseException | None = None) -> None:
        """Stop the thread; unfinished requests fail with BackendError (or `error`, e.g. a
        broken tensor-parallel group's). Idempotent."""
        with self._close_lock:
            if not self._closed:
                self._closed = True
                self._commands.put((_STOP, error))
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _check_open(self) -> None:
        if self._closed or not self._thread.is_alive():
            raise BackendError("the runtime engine is shut down; create a new Runtime")

    # ---- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        error: BaseException = BackendError("the runtime was shut down before the request finished")
        try:
            if self.runner.device.type == "cuda":  # Triton launches on the current device
                torch.cuda.set_device(self.runner.device)  # (replicas run on several GPUs)
            with torch.inference_mode():  # logits, masks, penalty counts: all engine-local
                self._loop()
        except ParallelError as exc:  # a rank died or hung: the group cannot go on
            log.error("%s", exc)
            error = exc
        except BaseException as exc:  # an engine bug: fail everyone, loudly
            log.exception("the lmprog engine thread failed")
            error = BackendError(f"the runtime engine failed: {exc!r}")
            error.__cause__ = exc
        finally:
            with self._close_lock:  # no submit can slip in after the drain below
                self._closed = True
            error = self._stop_error or error
            self._fail_everything(error)
            self.runner.close()

    def _loop(self) -> None:
        while True:
            try:
                if not self._apply_commands(block=not self._busy):
                    return
                if self._busy:
                    self._step()
                    if self.config.check_integrity:
                        self.scheduler.check_integrity()
            except ParallelError:  # fatal: the ranks are out of step
                raise
            except Exception as exc:  # noqa: BLE001 - an internal error: reset, serve on
                self._recover(exc)
            self._publish()
            self._deliver()

    def _recover(self, exc: Exception) -> None:
        """After an internal error (an engine or scheduler bug, a broken invariant): fail
        the running requests (and a retracted one whose token the lost step held) with a
        BackendError naming it, free all KV and empty the prefix cache (the bookkeeping
        cannot be trusted), rebuild the sampler's cached tensors, and go on serving;
        requests that never started or were retracted keep their place (Scheduler.reset)."""
        log.exception(
            "internal error in the engine loop: failing the requests in flight, "
            "resetting the scheduler and the KV cache"
        )
        self.metrics.internal_errors += 1
        error = BackendError(
            f"the runtime engine hit an internal error ({exc!r}); the "
            "requests in flight failed and the engine was reset"
        )
        error.__cause__ = exc
        self._inflight = None
        self._outputs = StepOutputs(BatchSampler(self.eos_token_ids))
        for req in self.scheduler.reset():
            req.engine_data.fail(error)
            if req.rid in self._handles:
                self._complete(req)

    @property
    def _busy(self) -> bool:
        return self.scheduler.has_work or self._inflight is not None

    def _apply_commands(self, block: bool) -> bool:
        """Apply queued commands (waiting for one if `block`); False on STOP."""
        try:
            kind, arg = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if kind == _STOP:
                self._stop_error = arg
                return False
            if kind == _SUBMIT:
                self._admit(*arg)
            elif kind == _ABORT:
                self._abort(arg)
            else:
                self._run_call(*arg)
            try:
                kind, arg = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _admit(self, handle: RequestHandle, request: EngineRequest) -> None:
        try:
            lora_id = 0
            if request.lora is not None:
                lora_id = self._need_lora().resolve(request.lora)
            if request.images:
                self._check_images()
            ids = request.cache_ids
            req = Req(
                handle.rid,
                ids,
                request.params,
                prompt_logprob_start=request.prompt_logprob_start,
                lora_id=lora_id,
                images=request.images,
            )
            req.engine_data = DecodeState(
                request.params,
                tokenizer=self._tokenizer,
                prompt_ids=request.prompt_ids,
                eos_token_ids=self.eos_token_ids,
                vocab_size=self.runner.vocab_size,
                emit=handle.put_piece,
                token_text=self._token_text,
                guide=request.guide,
                jump_forward=self.config.jump_forward,
                prompt_logprob_start=request.prompt_logprob_start,
                device=self.runner.device,
                outputs=ReqOutputs(req),  # the request's tokens have one owner: req
            )
            self.scheduler.submit(req)
        except Exception as exc:  # noqa: BLE001 - bad request: its caller gets the error
            handle.put_error(exc)
            return
        self._handles[req.rid] = handle

    def _check_images(self) -> None:
        """ValueError unless this engine can run a request with images."""
        if getattr(self.runner.config, "vision", None) is None:
            raise ValueError(
                f"this runtime's model ({self.runner.config.architecture}) takes no images"
            )
        if self.speculator is not None:
            raise ValueError("speculative decoding does not take requests with images yet")
        if self.scheduler.sinks is not None:
            raise ValueError("attention sinks do not take requests with images yet")

    def _abort(self, rid: Hashable) -> None:
        req = self.scheduler.abort(rid)
        if req is not None:
            self._complete(req)

    def _run_call(self, fn: Callable[[], Any], future: Future[Any]) -> None:
        try:
            step, self._inflight = self._inflight, None
            if step is not None:  # fn sees every launched step's outcome
                self._settle(step)
            future.set_result(fn())
        except Exception as exc:  # noqa: BLE001 - raised in the caller's thread
            future.set_exception(exc)

    def _step(self) -> None:
        self._inflight = self._advance(self._inflight)

    def _advance(self, inflight: DeferredStep | None) -> DeferredStep | None:
        """One step as a pipeline: choose drafts, schedule, launch, settle the step in
        flight, record. Returns the step now in flight (overlap), else None."""
        start = time.perf_counter()
        spec = self.speculator
        chosen = spec.choose(self.scheduler.decoding()) if spec is not None else []
        if chosen and inflight is not None:  # drafts continue the real tokens
            start += self._settle(inflight)  # (that step's host time, not this one's)
            inflight = None
        if spec is not None:
            spec.propose(chosen)
        batch = self.scheduler.schedule()
        if spec is not None:
            for req in batch.retracted:
                spec.release(req.rid, finished=False)
        if batch.kv_shift is not None:  # attention sinks evicted tokens: before any forward
            self.runner.move_kv(batch.kv_shift)
        logits = self._launch(batch, inflight)  # None: nothing ran
        deferred = None  # this step's draws queued on the device, read a step later
        if logits is not None and self._overlap:
            deferred = self._outputs.defer(batch, logits)
        launched = time.perf_counter()
        # the step in flight's tokens, read while the device runs this one
        settled = self._settle(inflight) if inflight is not None else 0.0
        if deferred is None and logits is not None and self._overlap:
            # constraints (and penalties) sample from the settled tokens: their masks are
            # computed now, while the device still runs this step's forward pass
            deferred = self._outputs.defer_settled(batch, logits)
        if deferred is not None:
            capped = self.scheduler.process_launched(batch, deferred.placeholders())
            return replace(deferred, capped=tuple(capped), seconds=launched - start)
        if logits is not None:
            self._record(batch, logits, time.perf_counter() - start - settled)
        return None

    def _launch(self, batch: ScheduledBatch, inflight: DeferredStep | None) -> Any:
        """The batch's forward pass (fed the tokens of the step in flight on the device);
        None when there was nothing to run, or it failed (its requests failed with it)."""
        if batch.is_empty:  # nothing runnable now: the step in flight ends requests, or
            self.runner.end_step()  # memory frees up (a lone request always fits)
            if inflight is None:
                time.sleep(0.001)
            return None
        future = None if inflight is None else inflight.token_ids
        spec = self.speculator
        capture = spec.capture if spec is not None else None
        try:
            if capture is None:
                return self.runner.forward(batch, future)
            logits, hidden = self.runner.forward_capture(batch, capture, future)
            assert spec is not None
            spec.observe(batch, hidden)  # a draft head's inputs, keyed by token index
            return logits
        except ParallelError:
            raise
        except Exception as exc:  # fail this batch's requests, keep serving
            log.exception("a forward pass failed")
            self._fail_batch(batch, exc)
            return None

    def _record(self, batch: ScheduledBatch, logits: torch.Tensor, seconds: float) -> None:
        """Process a step at once: sample, verify, hand tokens to the requests, record."""
        spec = self.speculator
        out = self._outputs.process(batch, logits, spec.draft_probs if spec is not None else None)
        if spec is not None:
            spec.on_step(batch, out)
        self.metrics.jump_forward_tokens += sum(out.jumped)
        for req in self.scheduler.process_results(batch, out.reasons):
            self._complete(req)
        moves = self.scheduler.take_kv_moves()
        if moves is not None:  # token trees' accepted paths, moved before anything else
            self.runner.copy_kv(moves)
        self.metrics.on_step(seconds, batch.num_tokens, batch.num_decodes, out.num_sampled)

    def _settle(self, step: DeferredStep) -> float:
        """Finish a step launched earlier: its tokens to the requests (docs/design/engine-step.md).
        Returns the seconds it took (counted as that step's)."""
        start = time.perf_counter()
        out = self._outputs.settle(step)
        self.metrics.jump_forward_tokens += sum(out.jumped)
        for req in self.scheduler.resolve_tokens(step.batch, out.reasons):
            self._complete(req)
        for req in step.capped:
            self._complete(req)
        batch = step.batch
        took = time.perf_counter() - start
        self.metrics.overlapped_steps += 1
        self.metrics.on_step(
            step.seconds + took, batch.num_tokens, batch.num_decodes, out.num_sampled
        )
        return took

    def _complete(self, req: Req) -> None:
        """Hand a finished request's outcome to its handle (delivered after the step)."""
        handle = self._handles.pop(req.rid)
        state: DecodeState = req.engine_data
        if self.speculator is not None:
            self.speculator.release(req.rid)
        lora = self.runner.lora
        if lora is not None and req.lora_id in lora.retired:  # an unloaded adapter's last
            lora.collect(self._lora_in_use())
        handle.first_token_at = state.first_token_at
        try:
            if not state.done:
                state.finish(req.finish_reason or "abort")
            outcome: Any = state.error or state.engine_result(
                prompt_tokens=req.prompt_len, cached_tokens=req.cached_tokens
            )
        except Exception as exc:  # noqa: BLE001 - this request's fault, not the engine's
            outcome = exc
        self.metrics.on_finish(state.finish_reason if state.error is None else "error")
        self._outbox.append((handle, outcome))

    def _deliver(self) -> None:
        outbox, self._outbox = self._outbox, []
        for handle, outcome in outbox:
            if isinstance(outcome, BaseException):
                handle.put_error(outcome)
            else:
                handle.put_result(outcome)

    def _fail_batch(self, batch: ScheduledBatch, exc: Exception) -> None:
        error = BackendError(f"the model step failed: {exc!r}")
        error.__cause__ = exc
        for e in batch.entries:
            if e.req.status is not ReqStatus.FINISHED:
                e.req.engine_data.fail(error)
                self.scheduler.finish(e.req, "error", cache=False)
                self._complete(e.req)

    def _fail_everything(self, error: BaseException) -> None:
        """At shutdown (or after an engine bug): every pending request raises `error`."""
        self._inflight = None
        self._deliver()
        for rid, handle in list(self._handles.items()):
            req = self.scheduler.get(rid)
            try:
                if req is not None:
                    self.scheduler.finish(req, "abort")
            except Exception:  # noqa: BLE001 - bookkeeping may be what broke
                pass
            handle.put_error(error)
        self._handles.clear()
        while True:
            try:
                kind, arg = self._commands.get_nowait()
            except queue.Empty:
                break
            if kind == _SUBMIT:
                arg[0].put_error(error)
            elif kind == _CALL:
                arg[1].set_exception(error)
        self._publish()

    def _publish(self) -> None:
        self._snapshot = self.metrics.snapshot(
            self.scheduler.stats(),
            {
                "radix_cache": self.scheduler.cache_config.radix_cache,
                "eviction": self.scheduler.cache_config.eviction,
                "jump_forward": self.config.jump_forward,
                **(
                    self.speculator.stats()
                    if self.speculator is not None
                    else {"speculative": None}
                ),
                **(self.runner.lora.stats() if self.runner.lora is not None else {}),
            },
        )

    def _token_text(self, token_id: int) -> str:
        text = self._token_texts.get(token_id)
        if text is None and self._tokenizer is None:
            return ""
        if text is None:
            text = self._token_texts[token_id] = self._tokenizer.decode([token_id])
        return text
