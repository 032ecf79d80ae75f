"""EngineMetrics: counters the engine thread updates, and the stats() snapshot built from them.

Throughput is measured over busy time (steps that ran a forward pass), so idle gaps between
a benchmark's phases do not dilute it; `recent_*` uses only the steps of the last
`window_s` seconds of wall time.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from ..scheduler import SchedulerStats


class EngineMetrics:
    """Engine-thread only, except `snapshot` results, which are plain dicts."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self.started = time.monotonic()
        self.steps = 0
        self.prefill_tokens = 0  # tokens fed as prefill chunks (incl. jump-forward text)
        self.decode_tokens = 0  # tokens fed as single-token decodes
        self.generated_tokens = 0  # tokens sampled
        self.jump_forward_tokens = 0  # tokens appended by jump-forward
        self.overlapped_steps = 0  # steps whose tokens were read while the next one ran
        self.internal_errors = 0  # engine resets after an internal error (Engine._recover)
        self.busy_s = 0.0
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        self._recent: deque[tuple[float, float, int]] = deque()  # (end, duration, generated)
        self._recent_busy = 0.0  # sums over _recent, kept as steps enter and leave it
        self._recent_generated = 0

    def on_step(self, duration: float, fed: int, decodes: int, generated: int) -> None:
        self.steps += 1
        self.decode_tokens += decodes
        self.prefill_tokens += fed - decodes
        self.generated_tokens += generated
        self.busy_s += duration
        now = time.monotonic()
        self._recent.append((now, duration, generated))
        self._recent_busy += duration
        self._recent_generated += generated
        while self._recent and self._recent[0][0] < now - self.window_s:
            _, old_duration, old_generated = self._recent.popleft()
            self._recent_busy -= old_duration
            self._recent_generated -= old_generated

    def on_finish(self, reason: str) -> None:
        self.finished[reason] = self.finished.get(reason, 0) + 1

    def snapshot(self, sched: SchedulerStats, extra: dict[str, Any]) -> dict[str, Any]:
        busy = self._recent_busy if self._recent else 0.0  # (no float residue when empty)
        recent = self._recent_generated
        return {
            **extra,
            "num_running": sched.num_running,
            "num_waiting": sched.num_waiting,
            "num_retractions": sched.num_retractions,
            "prompt_tokens": sched.prompt_tokens,
            "cached_tokens": sched.cached_tokens,
            "cached_host_tokens": sched.cached_host_tokens,
            "cached_disk_tokens": sched.cached_disk_tokens,
            "cache_hit_rate": sched.cache_hit_rate,
            "kv_capacity": sched.capacity,
            "kv_used": sched.used_slots,
            "kv_evictable": sched.evictable_slots,
            "kv_usage": sched.token_usage,
            "kv_evicted_tokens": sched.evicted_tokens,
            **(sched.tiers or {}),
            "steps": self.steps,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "generated_tokens": self.generated_tokens,
            "jump_forward_tokens": self.jump_forward_tokens,
            "overlapped_steps": self.overlapped_steps,
            "internal_errors": self.internal_errors,
            "requests_finished": dict(self.finished),
            "busy_seconds": self.busy_s,
            "uptime_seconds": time.monotonic() - self.started,
            "gen_tokens_per_s": self.generated_tokens / self.busy_s if self.busy_s else 0.0,
            "recent_gen_tokens_per_s": recent / busy if busy else 0.0,
        }
