"""One thread per state, draining a queue of steps in program order.

The program's own thread only enqueues (so it runs ahead of generation) and blocks only
where it reads a value. On an error the worker records it, keeps draining the queue
without executing (releasing any fork copies waiting on this state), and counts every
step, so that no reader waits forever:

    program thread:  s += a; s += gen; s += b; s["x"] ............ (waits on record)
    worker thread:          [a][gen ~~~~~~~~~~~~~~~~~][b] ...      (writes record)

Design: docs/design/frontend.md.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Sequence
from typing import Any

from lmprog.interpreter.executor import ForkSnapshot, NodeExecutor
from lmprog.interpreter.record import StateRecord
from lmprog.lang.frontend import Step

_END = object()
_ids = itertools.count()


class ForkPoint:
    """Where a fork's copies start; resolved (or failed) once by the parent's worker."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._snapshot: ForkSnapshot | None = None
        self._error: BaseException | None = None

    def resolve(self, snapshot: ForkSnapshot) -> None:
        if not self._event.is_set():
            self._snapshot = snapshot
            self._event.set()

    def fail(self, error: BaseException) -> None:
        if not self._event.is_set():
            self._error = error
            self._event.set()

    def wait(self) -> ForkSnapshot:
        self._event.wait()
        if self._error is not None:
            raise self._error
        assert self._snapshot is not None
        return self._snapshot


class Worker:
    """Executes one state's steps on its own daemon thread."""

    def __init__(
        self, record: StateRecord, executor: NodeExecutor, origin: ForkPoint | None = None
    ) -> None:
        self._record = record
        self._executor = executor
        self._origin = origin
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, name=f"lmprog-state-{next(_ids)}", daemon=True
        )
        self._thread.start()

    def submit(self, steps: tuple[Step, ...], defines: Sequence[str]) -> None:
        """Enqueue steps that will set the variables `defines`."""
        self._record.count_submitted(defines)
        self._queue.put(steps)

    def end(self) -> None:
        """No more steps: the worker exits once it has drained the queue."""
        self._queue.put(_END)

    def _run(self) -> None:
        record = self._record
        if self._origin is not None:
            try:
                self._executor.restore(self._origin.wait())
            except BaseException as e:  # noqa: BLE001 - the parent failed before the fork
                record.fail(e)
        while True:
            steps = self._queue.get()
            if steps is _END:
                break
            for node, payload in steps:
                if record.error is None:
                    try:
                        self._executor.execute(node, payload)
                    except BaseException as e:  # noqa: BLE001 - recorded, re-raised to readers
                        record.fail(e)
                if record.error is not None and isinstance(payload, ForkPoint):
                    payload.fail(record.error)  # no-op if the fork already resolved
            record.step_done()
        record.finish()
