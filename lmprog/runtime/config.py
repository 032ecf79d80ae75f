"""Frozen configuration of the runtime's bookkeeping: the KV cache and the scheduler.

One dataclass per subsystem, each holding and validating only its own knobs, under the
names `lp.Runtime` takes them by (SGLang's, where SGLang has the knob). Values computed at
start-up (the number of KV slots from the memory budget, the model's context length) are
passed to constructors next to these configs, never written back into them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EvictionName = Literal["lru", "lfu"]
SchedulePolicyName = Literal["lpm", "fcfs"]

EVICTION_POLICIES: tuple[str, ...] = ("lru", "lfu")
SCHEDULE_POLICIES: tuple[str, ...] = ("lpm", "fcfs")


@dataclass(frozen=True)
class CacheConfig:
    """How KV slots are handed out and shared.

    page_size: slots are allocated in pages of this many tokens; prefix matches and
        insertions into the radix tree round down to whole pages. 1 = token granular.
    radix_cache: share KV of common prefixes between requests (RadixAttention). When False
        every request computes its whole prompt and frees its KV when it ends.
    eviction: which unlocked leaves of the radix tree are evicted first ("lru" or "lfu").
    """

    page_size: int = 1
    radix_cache: bool = True
    eviction: EvictionName = "lru"

    def __post_init__(self) -> None:
        _check_int("page_size", self.page_size, lo=1)
        if not isinstance(self.radix_cache, bool):
            raise TypeError(f"radix_cache must be a bool, got {self.radix_cache!r}")
        if self.eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction must be one of {EVICTION_POLICIES}, got {self.eviction!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    """How each step's batch is chosen.

    max_num_batched_tokens: the per-step token budget shared by decodes (1 token each),
        verify tokens and prefill chunks. Must be >= max_running_requests so that every
        running request can decode in every step.
    max_running_requests: requests holding a row of the request-to-token table at once.
    schedule_policy: "lpm" orders waiting requests by longest cached prefix (falling back
        to arrival order when more than `lpm_max_queue` wait); "fcfs" always uses arrival
        order.
    stagger_min_tokens: a waiting request that shares at least this many not-yet-cached
        prompt tokens with a request being prefilled waits a step, so the shared part is
        computed once and then reused from the cache. 0 disables staggering.
    init/min_new_token_ratio, new_token_ratio_decay: admission keeps room for
        `ratio * remaining max_tokens` (capped at `reserve_clip_tokens` per request) of the
        running requests' future decodes; the ratio starts at init, decays by `decay` per
        step down to min, and jumps back to init when a request had to be retracted.
    hybrid_batching: mix decodes and prefill chunks in one step (XY-Serve's hybrid batch).
        False is prefill-first scheduling, the baseline of servers without mixed batches: a
        step with any prefill work to do runs only prefill chunks, and the running decodes
        wait.
    """

    max_num_batched_tokens: int = 2048
    max_running_requests: int = 64
    schedule_policy: SchedulePolicyName = "lpm"
    lpm_max_queue: int = 128
    stagger_min_tokens: int = 32
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.001
    reserve_clip_tokens: int = 4096
    hybrid_batching: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.hybrid_batching, bool):
            raise TypeError(f"hybrid_batching must be a bool, got {self.hybrid_batching!r}")
        _check_int("max_running_requests", self.max_running_requests, lo=1)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, lo=1)
        if self.max_num_batched_tokens < self.max_running_requests:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_running_requests ({self.max_running_requests}) so every running request "
                "can decode each step; raise the token budget or lower max_running_requests"
            )
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(
                f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}"
            )
        _check_int("lpm_max_queue", self.lpm_max_queue, lo=0)
        _check_int("stagger_min_tokens", self.stagger_min_tokens, lo=0)
        _check_int("reserve_clip_tokens", self.reserve_clip_tokens, lo=0)
        for name in ("init_new_token_ratio", "min_new_token_ratio", "new_token_ratio_decay"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= 1
            ):
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if self.min_new_token_ratio > self.init_new_token_ratio:
            raise ValueError(
                f"min_new_token_ratio ({self.min_new_token_ratio}) must be <= "
                f"init_new_token_ratio ({self.init_new_token_ratio})"
            )


def _check_int(name: str, value: object, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
