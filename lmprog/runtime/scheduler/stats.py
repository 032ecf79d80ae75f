"""SchedulerStats: a snapshot of the scheduler's counters (for Backend.stats / metrics)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    num_retractions: int  # since start
    prompt_tokens: int  # prompts admitted (first admissions)
    cached_tokens: int  # of those, served from the prefix cache (device pool and tiers)
    used_slots: int  # held by running requests or the prefix cache
    evictable_slots: int
    capacity: int
    evicted_tokens: int = 0  # attention sinks: tokens evicted from running requests
    tiers: dict[str, int] | None = None  # the host tier's usage and loads (cache/hiradix.py)
    cached_host_tokens: int = 0  # of cached_tokens, loaded from the host tier (disk included)
    cached_disk_tokens: int = 0  # of cached_host_tokens, read from the disk tier

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def token_usage(self) -> float:
        """Fraction of slots held (cached-but-evictable included)."""
        return self.used_slots / self.capacity
