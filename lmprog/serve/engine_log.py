"""EngineLog: one line about the engine every `interval_s` seconds while it is busy (the
`lmprog.serve.engine` logger).

    engine: 3 running, 1 queued | generation 41.3 tok/s, prompt 210.0 tok/s | prefix cache
    hit rate 62.5% | KV cache 12.5% (512 of 4096 tokens) | host tier 40.0% (800 of 2000
    tokens), 25.0% of prompt tokens loaded from it

Read from `backend.stats()` over the interval; an idle server is silent.
Design: docs/design/server.md#logs-and-metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("lmprog.serve.engine")

_COUNTERS = (
    "generated_tokens",
    "prompt_tokens",
    "cached_tokens",
    "host_kv_hit_tokens",
    "disk_kv_hit_tokens",
    "cached_host_tokens",
    "cached_disk_tokens",
)


class EngineLog:
    """`start()` a daemon thread that logs `line()` each interval; `stop()` ends it. `line()`
    alone (no thread) is what a test calls."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]], interval_s: float = 10.0) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self._stats = stats
        self.interval_s = interval_s
        self._last: tuple[float, dict[str, float]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> EngineLog:
        self._thread = threading.Thread(target=self._run, name="lmprog-engine-log", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _run(self) -> None:
        self.line()  # the starting counts: the first line covers one interval
        while not self._stop.wait(self.interval_s):
            if not log.isEnabledFor(logging.INFO):
                continue
            try:
                text = self.line()
            except Exception as exc:  # noqa: BLE001 - a stats() failure must not end the line
                log.debug("engine stats unavailable: %s", exc)
                continue
            if text is not None:
                log.info("%s", text)

    def line(self, now: float | None = None) -> str | None:
        """The line for the interval since the last call, or None when nothing happened in it
        (the first call only takes the starting counts)."""
        now = time.monotonic() if now is None else now
        stats = self._stats()
        counts = {k: float(stats[k]) for k in _COUNTERS if _number(stats.get(k))}
        last, self._last = self._last, (now, counts)
        if last is None:
            return None
        dt = max(now - last[0], 1e-9)
        delta = {k: counts[k] - last[1][k] for k in counts if k in last[1]}
        running, queued = stats.get("num_running"), stats.get("num_waiting")
        busy = any(delta.values()) or bool(running) or bool(queued)
        return _format(stats, delta, dt) if busy else None


def _format(stats: Mapping[str, Any], delta: Mapping[str, float], dt: float) -> str:
    parts = []
    running, queued = stats.get("num_running"), stats.get("num_waiting")
    if _number(running) and _number(queued):
        parts.append(f"{running} running, {queued} queued")
    rates = []
    if "generated_tokens" in delta:
        rates.append(f"generation {delta['generated_tokens'] / dt:.1f} tok/s")
    if "prompt_tokens" in delta:
        rates.append(f"prompt {delta['prompt_tokens'] / dt:.1f} tok/s")
    if rates:
        parts.append(", ".join(rates))
    prompt, cached = delta.get("prompt_tokens"), delta.get("cached_tokens")
    if prompt and cached is not None:
        parts.append(f"prefix cache hit rate {100 * cached / prompt:.1f}%")
    used, capacity = stats.get("kv_used"), stats.get("kv_capacity")
    if _number(used) and _number(capacity) and capacity:
        parts.append(f"KV cache {100 * used / capacity:.1f}% ({used} of {capacity} tokens)")
    for tier in ("host", "disk"):  # the KV tiers, when the backend has them
        text = _tier_usage(stats, tier)
        if text is not None:
            # the runtime's first admissions' tier hits (parts of cached_tokens); else
            # every load (llama.cpp's restored states)
            hits = delta.get(f"cached_{tier}_tokens", delta.get(f"{tier}_kv_hit_tokens"))
            if prompt and hits is not None:
                text += f", {100 * hits / prompt:.1f}% of prompt tokens loaded from it"
            parts.append(text)
    return "engine: " + " | ".join(parts)


def _tier_usage(stats: Mapping[str, Any], tier: str) -> str | None:
    """A tier's use in tokens (the runtime's tiers) or else in bytes (llama.cpp's saved
    states); None when the backend reports neither."""
    for unit, scale, name in (("tokens", 1, "tokens"), ("bytes", 2**20, "MiB")):
        used, capacity = (
            stats.get(f"{tier}_kv_used_{unit}"),
            stats.get(f"{tier}_kv_capacity_{unit}"),
        )
        if _number(used) and _number(capacity) and capacity:
            amounts = (
                f"{used} of {capacity}"
                if scale == 1
                else f"{used / scale:.1f} of {capacity / scale:.1f}"
            )
            return f"{tier} tier {100 * used / capacity:.1f}% ({amounts} {name})"
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
