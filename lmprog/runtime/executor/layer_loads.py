"""LayerLoads: the host KV tier's copies into the pool still running on the side stream, per
layer (CUDA), so a forward pass waits for layer i's copies only when it reaches layer i
(SGLang HiCache's layer-wise loading). Design: docs/design/kv-cache.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class LayerLoads:
    """Per layer, the last copy event a forward pass must wait for before it writes or reads
    that layer of the pool (`wait`); loads made ahead of admission (staging) are left out
    of the next forward pass, which reads none of their slots, and waited for by the one
    after (`step_done`). Anything else that reads or reuses pool rows (a save to the host,
    attention sinks' moves, a decode graph's replay) waits for them all first (`fence`).

    `wait_event(event)`: make the current stream wait for an event (never blocks the host).
    """

    def __init__(self, num_slots: int, wait_event: Callable[[Any], None]) -> None:
        self._wait_event = wait_event
        self._now: dict[int, Any] = {}  # layer -> event: the next forward pass waits for it
        self._later: dict[int, Any] = {}  # staged this step: the forward pass after it
        self._pending = np.zeros(num_slots + 1, dtype=bool)  # slots being written
        self._slots_now: list[np.ndarray] = []
        self._slots_later: list[np.ndarray] = []

    @property
    def pending(self) -> bool:
        return bool(self._now or self._later)

    def record(self, layer: int, event: Any, ahead: bool = False) -> None:
        """A load's copies of `layer` end at `event` (the side stream runs loads in order,
        so the last event of a layer covers every earlier one)."""
        (self._later if ahead else self._now)[layer] = event

    def add_slots(self, slots: np.ndarray, ahead: bool = False) -> None:
        """The slots a load writes (checked by `fence`)."""
        self._pending[slots] = True
        (self._slots_later if ahead else self._slots_now).append(np.asarray(slots))

    def wait(self, layer: int) -> None:
        """A forward pass reached `layer`: the current stream waits for its copies."""
        event = self._now.pop(layer, None)
        if event is not None:
            self._wait_event(event)

    def fence(self, slots: np.ndarray | None = None) -> None:
        """The current stream waits for every pending copy (with `slots`: only if one of
        them is being written)."""
        if not self.pending:
            return
        if slots is not None and not self._pending[np.asarray(slots)].any():
            return
        for event in (*self._now.values(), *self._later.values()):
            self._wait_event(event)
        self._now, self._later = {}, {}
        self._clear(self._slots_now + self._slots_later)
        self._slots_now, self._slots_later = [], []

    def step_done(self) -> None:
        """After a forward pass was queued (or failed): any layer it did not reach is waited
        for now, and the loads staged meanwhile are what the next one waits for."""
        for event in self._now.values():
            self._wait_event(event)
        self._clear(self._slots_now)
        self._now, self._later = self._later, {}
        self._slots_now, self._slots_later = self._slots_later, []
        for slots in self._slots_now:  # a slot of both lists stays pending
            self._pending[slots] = True

    def _clear(self, parts: list[np.ndarray]) -> None:
        for slots in parts:
            self._pending[slots] = False
