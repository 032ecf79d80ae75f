"""The llama.cpp backend's engine: one thread that runs every request in one batch per step.

    submit(Job) -> waiting -> admitted (a slot at its best prefix) -> running -> finished

Each step one llama_decode (a token per generation + prompt chunks), one BatchSampler call,
DecodeState.accept per request. Callers wait on their Job's events; out of KV cells the
newest request is retracted with its state saved. Design: docs/design/llamacpp-backend.md.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmprog.backends.context_pool import SequencePool
from lmprog.backends.llamacpp_native import KVFull, Row
from lmprog.backends.shared import Counters
from lmprog.backends.state_cache import common_prefix_len
from lmprog.core.errors import BackendError
from lmprog.core.sampling import SamplingParams
from lmprog.decoding.batch_sampler import BatchSampler

_log = logging.getLogger("lmprog.backends.llamacpp")

_PIECE, _DONE, _ERROR = 0, 1, 2


@dataclass(frozen=True)
class GenSpec:
    """What a generation samples with (its DecodeState is built from it by the backend)."""

    params: SamplingParams
    index: Any  # a future of the constraint's TokenIndex, or None
    stream: bool  # send text pieces to the caller
    jump_forward: bool


# new_state(gen, prompt_ids, guide, emit) -> DecodeState, from the backend
StateFactory = Callable[[GenSpec, Sequence[int], Any, Any], Any]


class Job:
    """One request. The engine thread owns every field but `aborted`; the caller reads
    `pieces()` and `outcome()` (one consumer thread) and may `abort` from any thread.

    logits_from: the first target position whose logits are wanted (None: none, a prefill).
    gen: what a generation samples with; None for a prefill or a scored span.
    save: save the slot's state in the StateCache once it holds the target (cache_prefix).
    media: the images of the target: {position of its first placeholder id: its ImageRun}
        (llamacpp_vision.py), each evaluated whole by the engine's `evaluate_media`.
    lora: the LoRA adapter it runs under (LlamaCppAdapters uid; 0: the base model).
    """

    def __init__(
        self,
        target: Sequence[int],
        logits_from: int | None,
        *,
        gen: GenSpec | None = None,
        save: bool = False,
        media: dict[int, Any] | None = None,
        lora: int = 0,
    ):
        self.target = list(target)
        self.media = media or {}
        self.lora = lora
        self.prompt_len = len(self.target)
        self.logits_from = logits_from
        self.gen = gen
        self.save = save
        self.state: Any = None  # DecodeState, built when the first logits and the index are in
        self.slot: int | None = None
        self.reused: int | None = None  # prompt tokens reused when first admitted
        self.rows: list[np.ndarray] = []  # logits collected since the target last grew
        self.saved: Any = None  # its slot's SavedState while it is retracted
        self.aborted = False
        self._events: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._outcome: tuple[int, Any] | None = None

    # -- engine side -----------------------------------------------------------------------
    def put_piece(self, text: str) -> None:
        self._events.put((_PIECE, text))

    def put_outcome(self, value: Any, error: BaseException | None = None) -> None:
        self._events.put((_ERROR, error) if error is not None else (_DONE, value))

    # -- caller side -----------------------------------------------------------------------
    def pieces(self) -> Iterator[str]:
        """Yield text pieces until the request ends."""
        while self._outcome is None:
            kind, value = self._events.get()
            if kind == _PIECE:
                yield value
            else:
                self._outcome = (kind, value)

    def outcome(self) -> Any:
        """Block until the request ends; return its result or raise its error."""
        for _ in self.pieces():
            pass
        kind, value = self._outcome
        if kind == _ERROR:
            raise value
        return value


class LlamaCppEngine:
    """The decode loop over one context's sequence slots. `submit`, `abort` and `close`
    are safe from any thread; everything else runs on the engine thread."""

    def __init__(
        self,
        pool: SequencePool,
        new_state: StateFactory,
        eos_token_ids: Sequence[int],
        counters: Counters,
        on_exit: Callable[[], None],
        evaluate_media: Callable[[int, Any], None] | None = None,
        adapters: Any = None,
    ):
        self.pool = pool
        self._evaluate_media = evaluate_media  # (slot, ImageRun): append an image's embeddings
        self.adapters = adapters  # LlamaCppAdapters (the pointers of the jobs' uids)
        self.ctx = pool.ctx
        self._new_state = new_state
        self._eos = tuple(eos_token_ids)
        self._counters = counters
        self._on_exit = on_exit  # frees the context and the model once the loop ends
        self._sampler = BatchSampler(self._eos)
        self._cond = threading.Condition()
        self._inbox: list[Job] = []
        self._closing = False
        self._cancel: str | None = None  # close(cancel=): why unfinished jobs fail
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []
        self._hold_admission = False  # after a retraction, until a request finishes
        self.peak_sequences = 0  # the most sequences one llama_decode call has served
        self._thread = threading.Thread(target=self._loop, name="lmprog-llamacpp", daemon=True)
        self._thread.start()

    # ---- any thread ----------------------------------------------------------------------
    def submit(self, job: Job) -> Job:
        with self._cond:
            if self._closing:
                raise BackendError("this LlamaCpp backend was shut down; create a new one")
            self._inbox.append(job)
            self._cond.notify()
        if job.gen is not None and job.gen.index is not None:
            job.gen.index.add_done_callback(lambda _: self._wake())  # built off-thread
        return job

    def abort(self, job: Job) -> None:
        """Stop `job` at the next step (a no-op once it finished)."""
        job.aborted = True
        self._wake()

    def close(self, cancel: str | None = None) -> None:
        """Stop the thread and free the context: after the requests in flight finish, or
        with `cancel`, at once (each request not finished fails with a BackendError saying
        `cancel`). Returns
        once the thread has ended, so no thread of this engine runs while the interpreter
        is finalizing (a thread that releases the GIL inside C++ then, such as a llama.cpp
        call, is ended by Python mid-unwind and aborts the process)."""
        with self._cond:
            self._closing = True
            if cancel is not None and self._cancel is None:
                self._cancel = cancel
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def load(self) -> dict[str, int]:
        """Requests running (holding a sequence) and waiting for one; a snapshot."""
        with self._cond:
            return {
                "num_running": len(self._running),
                "num_waiting": len(self._waiting) + len(self._inbox),
            }

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    # ---- the loop --------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while self._wait_for_work():
                started = time.perf_counter()
                try:
                    self._step()
                except Exception as exc:  # noqa: BLE001 - fail the running requests, serve on
                    _log.exception("llama.cpp engine step failed")
                    self._fail_running(exc)
                self._counters.add(busy_us=round((time.perf_counter() - started) * 1e6))
        finally:
            self._on_exit()

    def _wait_for_work(self) -> bool:
        with self._cond:
            while not (self._inbox or self._has_work() or self._cancel is not None):
                if self._closing and not self._waiting and not self._running:
                    return False
                self._cond.wait()
            self._waiting.extend(self._inbox)
            self._inbox.clear()
            if self._cancel is None:
                return True
        self._cancel_all(self._cancel)
        return False

    def _cancel_all(self, why: str) -> None:
        """Fail every request not finished with a BackendError saying why (close(cancel=))."""
        for job in list(self._running):
            self._counters.add(requests=int(job.gen is not None))
            self._leave(job)
            job.put_outcome(None, BackendError(why))
        for job in self._waiting:
            self._counters.add(requests=int(job.gen is not None))
            job.put_outcome(None, BackendError(why))
        self._waiting.clear()

    def _has_work(self) -> bool:
        if self._waiting and self.pool.n_free and not self._hold_admission:
            return True
        return any(j.aborted or self._pending(j) or self._samplable(j) for j in self._running)

    def _step(self) -> None:
        self._drop_aborted()
        self._free_retired_adapters()
        self._admit()
        self._images()
        for lora, rows, jobs in _by_adapter(*self._plan()):  # llama.cpp: an adapter a batch
            self._collect(jobs, rows, self._evaluate(rows, jobs, lora))
        for job in [j for j in self._running if j.gen is None and not self._pending(j)]:
            self._finish_prefill(job)
        self._sample()

    # ---- the steps ---------------------------------------------------------------------------
    def _drop_aborted(self) -> None:
        for job in [j for j in self._waiting if j.aborted]:
            self._waiting.remove(job)
            self._counters.add(requests=int(job.gen is not None), aborted=1)
        for job in [j for j in self._running if j.aborted]:
            self._counters.add(requests=1, aborted=1)
            self._leave(job)

    def _admit(self) -> None:
        while self._waiting and not self._hold_admission:
            job = self._waiting[0]
            if self.adapters is not None and not self.adapters.known(job.lora):
                self._waiting.popleft()  # unloaded and freed between submission and here
                self._counters.add(requests=int(job.gen is not None))
                job.put_outcome(None, self.adapters.gone(job.lora))
                continue
            lease = self._lease(job)
            if lease is None:
                return
            self._waiting.popleft()
            job.slot, job.saved = lease.slot, None
            self._whole_images(job)
            if job.reused is None:  # its first admission: its prompt counted here, as the
                job.reused = len(self.ctx.tokens[job.slot])  # runtime counts admitted prompts
                if job.gen is not None:
                    self._counters.add(
                        prompt_tokens=job.prompt_len,
                        cached_tokens=job.reused,
                        prefix_hits=int(bool(job.reused)),
                    )
            self._running.append(job)

    def _whole_images(self, job: Job) -> None:
        """A slot that holds part of one of the job's images (a prefix shared up to inside
        it) drops that part: an image is evaluated whole."""
        held = len(self.ctx.tokens[job.slot])
        for start, run in job.media.items():
            if start < held < start + len(run.ids):
                self.ctx.truncate(job.slot, start)
                return

    def _images(self) -> None:
        """Evaluate the images the running jobs have reached, one job and image at a time
        (libmtmd encodes an image and decodes its embeddings in calls of its own)."""
        for job in [j for j in self._running if j.media]:
            run = job.media.get(len(self.ctx.tokens[job.slot]))
            if run is not None and self.adapters is not None:  # its embeddings under its adapter
                self.ctx.set_adapter(self.adapters.pointer(job.lora))
            while run is not None and job in self._running:
                try:
                    assert self._evaluate_media is not None
                    self._evaluate_media(job.slot, run)
                except Exception as exc:  # noqa: BLE001 - this request's failure only
                    self._finish(job, exc)
                    break
                run = job.media.get(len(self.ctx.tokens[job.slot]))

    def _lease(self, job: Job) -> Any:
        """A slot for the job: a retracted one's own state restored (evaluated again only if
        it cannot fit even with nothing else running), else the best prefix of its target."""
        if job.saved is not None:
            lease = self.pool.resume(job.saved, job.lora)
            if lease is not None or self._running:
                return lease
            _log.warning("a retracted request's KV state does not fit: evaluating it again")
        return self.pool.acquire(job.target, _limit(job), job.lora)

    def _plan(self) -> tuple[list[Row], list[Job]]:
        """Decodes first (one token each), then prompt chunks, within n_batch tokens."""
        rows: list[Row] = []
        jobs: list[Job] = []
        budget = self.ctx.n_batch
        for decodes in (True, False):
            for job in self._running:
                n = self._pending(job)
                if budget == 0 or n == 0 or (n == 1) != decodes:
                    continue
                pos0 = len(self.ctx.tokens[job.slot])
                end = pos0 + min(n, budget)
                end = min([end, *(p for p in job.media if pos0 <= p < end)])  # text only
                if end == pos0:
                    continue  # an image comes next (evaluated by _images)
                chunk = job.target[pos0:end]
                first = None
                if job.logits_from is not None and job.logits_from < pos0 + len(chunk):
                    first = max(job.logits_from - pos0, 0)
                rows.append((job.slot, chunk, first))
                jobs.append(job)
                budget -= len(chunk)
        return rows, jobs

    def _evaluate(self, rows: list[Row], jobs: list[Job], lora: int = 0) -> np.ndarray | None:
        """One llama_decode of the rows under LoRA adapter `lora`; on full KV cells, free
        some and retry (rows and jobs lose the requests retracted)."""
        if self.adapters is not None:
            self.ctx.set_adapter(self.adapters.pointer(lora))
        while rows:
            try:
                logits = self.ctx.decode(rows, prompt=any(len(c) > 1 for _, c, _ in rows))
            except KVFull as exc:
                if self.pool.evict_idle():
                    continue
                if len(jobs) == 1:  # alone, it does not fit beside the other requests
                    self._finish(jobs.pop(), BackendError(f"llama.cpp: {exc}"))
                    rows.clear()
                    return None
                victim = max(range(len(jobs)), key=lambda i: self._running.index(jobs[i]))
                self._retract(jobs.pop(victim))
                rows.pop(victim)
                continue
            self.pool.count(evaluated_tokens=sum(len(c) for _, c, _ in rows), decode_calls=1)
            self.peak_sequences = max(self.peak_sequences, len(rows))
            return logits
        return None

    def _collect(self, jobs: list[Job], rows: list[Row], logits: np.ndarray | None) -> None:
        at = 0
        for job, (_, chunk, first) in zip(jobs, rows):
            if first is not None:
                n = len(chunk) - first
                job.rows.append(logits[at : at + n])
                at += n

    def _finish_prefill(self, job: Job) -> None:
        if job.save:
            self.pool.save(job.slot)
        out = None
        if job.logits_from is not None:
            out = np.concatenate(job.rows) if len(job.rows) > 1 else job.rows[0]
        self._leave(job)
        job.put_outcome(out)

    def _sample(self) -> None:
        """Draw the next token of every request whose logits are in, in one sampler call."""
        batch = [j for j in list(self._running) if self._samplable(j) and self._started(j)]
        if not batch:
            return
        logits = np.stack([j.rows[-1][-1] for j in batch])  # numpy: no torch on this path
        draws = self._sampler.sample(logits, [j.state for j in batch])  # masks logits in place
        before = sum(len(j.state.output_ids) for j in batch)
        for job, draw in zip(batch, draws):
            job.rows = []
            try:
                if draw.error is not None:
                    raise draw.error
                jump = job.state.accept(draw.token, logprob=draw.logprob, top=draw.top)
            except Exception as exc:  # noqa: BLE001 - this request's error only
                self._finish(job, exc)
                continue
            if not job.state.done:
                self._extend(job, draw.token, jump)
            if job.state.done:
                self._finish(job)
        # counted as they are made (jump-forward tokens too), as the runtime counts them
        self._counters.add(generated_tokens=sum(len(j.state.output_ids) for j in batch) - before)

    def _started(self, job: Job) -> bool:
        """Build the job's DecodeState once its constraint index is ready; False if not yet
        (it waits, its logits kept) or if it ended here (max_tokens=0, a bad constraint)."""
        if job.state is not None:
            return True
        gen = job.gen
        if gen.index is not None and not gen.index.done():
            return False
        try:
            guide = gen.index.result().new_guide() if gen.index is not None else None
            emit = job.put_piece if gen.stream else None
            prompt = job.target[: job.prompt_len]
            if job.media:  # the decoding state reads text: an image's placeholders left out
                prompt = [t for t in prompt if t >= 0]
            job.state = self._new_state(gen, prompt, guide, emit)
        except Exception as exc:  # noqa: BLE001 - e.g. a ConstraintError: this request only
            self._finish(job, exc)
            return False
        if gen.params.max_tokens == 0:
            job.state.finish("length")
            self._finish(job)
            return False
        return True

    def _extend(self, job: Job, token: int, jump: Any) -> None:
        """The target after an accepted token (re-read whole after a jump-forward)."""
        if jump is None:
            job.target.append(token)
        else:
            job.target[job.prompt_len :] = job.state.output_ids
            live = self.ctx.tokens[job.slot]
            self.ctx.truncate(job.slot, common_prefix_len(live, job.target))
        if len(job.target) > self.ctx.n_ctx:
            job.state.finish("length", message=f"the context of {self.ctx.n_ctx} tokens is full")
        job.logits_from = len(job.target) - 1

    def _free_retired_adapters(self) -> None:
        if self.adapters is None:
            return
        with self._cond:
            jobs = [*self._running, *self._waiting, *self._inbox]
        self.adapters.collect({j.lora for j in jobs}, self.ctx)

    # ---- leaving -----------------------------------------------------------------------------
    def _finish(self, job: Job, error: BaseException | None = None) -> None:
        state = job.state
        self._counters.add(requests=1)
        self._leave(job)
        if error is not None:
            job.put_outcome(None, error)
        else:
            job.put_outcome(state.result(prompt_tokens=job.prompt_len, cached_tokens=job.reused))

    def _leave(self, job: Job) -> None:
        self._running.remove(job)
        self.pool.release(job.slot)
        self._hold_admission = False

    def _retract(self, job: Job) -> None:
        """Give the job's KV cells back; it waits (first in line) to be evaluated again."""
        _log.info("KV cells full: retracting a request of %d tokens", len(job.target))
        self._running.remove(job)
        # logits collected (a scored span's) are dropped: keep no token past the first wanted
        job.saved = self.pool.retract(job.slot, _limit(job))
        self.pool.count(num_retractions=1)
        job.slot, job.rows = None, []
        self._waiting.appendleft(job)
        self._hold_admission = True

    def _fail_running(self, exc: Exception) -> None:
        error = BackendError(f"llama.cpp failed while decoding: {exc}")
        error.__cause__ = exc
        self.ctx.clear()
        for job in list(self._running):
            self._finish(job, error)

    # ---- job views ---------------------------------------------------------------------------
    def _pending(self, job: Job) -> int:
        """Target tokens its slot does not hold yet."""
        return len(job.target) - len(self.ctx.tokens[job.slot])

    def _samplable(self, job: Job) -> bool:
        """A generation whose next-token logits are in, and its constraint index."""
        if job.gen is None or not job.rows or self._pending(job):
            return False
        return job.state is not None or job.gen.index is None or job.gen.index.done()


def _by_adapter(rows: list[Row], jobs: list[Job]) -> list[tuple[int, list[Row], list[Job]]]:
    """The step's rows split by LoRA adapter, each group in order (llama.cpp applies one
    adapter set per context, so each group is one llama_decode); the base model's first."""
    groups: dict[int, tuple[list[Row], list[Job]]] = {}
    for row, job in zip(rows, jobs):
        group = groups.setdefault(job.lora, ([], []))
        group[0].append(row)
        group[1].append(job)
    return [(lora, *groups[lora]) for lora in sorted(groups)]


def _limit(job: Job) -> int:
    """The most target tokens a slot may hold before the job is evaluated: up to the first
    position whose logits it wants."""
    return len(job.target) if job.logits_from is None else job.logits_from
