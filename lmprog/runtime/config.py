"""Frozen configuration of the runtime's subsystems: the KV cache, the scheduler, the engine.

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
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8_e4m3", "fp8")  # "fp8": vLLM's alias


@dataclass(frozen=True)
class CacheConfig:
    """How KV slots are handed out and shared.

    page_size: slots are allocated in pages of this many tokens; prefix matches and
        insertions into the radix tree round down to whole pages. 1 = token granular.
    radix_cache: share KV of common prefixes between requests (RadixAttention). When False
        every request computes its whole prompt and frees its KV when it ends.
    eviction: which unlocked leaves of the radix tree are evicted first ("lru" or "lfu").
    kv_cache_dtype: what the KV pool stores: "auto" (the model's dtype) or "fp8_e4m3"
        ("fp8"): e4m3 K/V, half of bf16's bytes per token (lmprog.runtime.executor.kv_pool).
    host_kv_cache_bytes: a host-memory tier under the radix tree of this many bytes (pinned
        on CUDA): prefixes evicted from the KV pool are kept there (least recently used
        dropped first) and loaded back when a request matches them (cache/hiradix.py).
        0: off (an evicted prefix is recomputed). Needs radix_cache.
    host_kv_staging: with a host tier, predictive staging (TierKV): each step starts loading
        the host-tier prefixes of the requests at the head of the waiting queue into the KV
        pool, so they are on the device by the time they are admitted. Off by default
        until a GPU run shows it gains (docs/serving.md).
    disk_kv_cache_bytes: a disk tier under the host tier, of this many bytes: prefixes the
        host tier evicts are written to files (checked on load: a truncated or corrupt one
        is recomputed) instead of dropped. 0: off. Needs host_kv_cache_bytes.
    disk_kv_cache_dir: where its files go (a folder of this process's own is made inside
        and removed at exit); None: the system's temporary folder.
    """

    page_size: int = 1
    radix_cache: bool = True
    eviction: EvictionName = "lru"
    kv_cache_dtype: str = "auto"
    host_kv_cache_bytes: int = 0
    host_kv_staging: bool = False
    disk_kv_cache_bytes: int = 0
    disk_kv_cache_dir: str | None = None

    def __post_init__(self) -> None:
        _check_int("page_size", self.page_size, lo=1)
        if not isinstance(self.radix_cache, bool):
            raise TypeError(f"radix_cache must be a bool, got {self.radix_cache!r}")
        if self.eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction must be one of {EVICTION_POLICIES}, got {self.eviction!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}"
            )
        _check_int("host_kv_cache_bytes", self.host_kv_cache_bytes, lo=0)
        _check_int("disk_kv_cache_bytes", self.disk_kv_cache_bytes, lo=0)
        if self.disk_kv_cache_bytes and not self.host_kv_cache_bytes:
            raise ValueError("disk_kv_cache_bytes needs host_kv_cache_bytes (the tier above it)")
        if self.disk_kv_cache_dir is not None and not isinstance(self.disk_kv_cache_dir, str):
            raise TypeError(f"disk_kv_cache_dir must be a str, got {self.disk_kv_cache_dir!r}")
        if not isinstance(self.host_kv_staging, bool):
            raise TypeError(f"host_kv_staging must be a bool, got {self.host_kv_staging!r}")
        if self.host_kv_cache_bytes and not self.radix_cache:
            raise ValueError("host_kv_cache_bytes needs radix_cache=True (it caches prefixes)")


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


@dataclass(frozen=True)
class AttentionSinkConfig:
    """Attention sinks (StreamingLLM, arXiv 2309.17453): each request keeps the KV of its
    first `attention_sink_size` tokens plus a recent window, so generation goes on past the
    context length with a flat KV footprint. Positions are positions in the cache, as in the
    paper: when a request's KV is full, `shift_size` middle tokens (right after the sinks)
    are evicted at once and the kept keys rotated back by that many positions, so the cache
    is again contiguous (llama.cpp's context shift).

        KV of one request:  | sinks | ... evicted ... | recent window (<= sliding_window_size) |
        positions:            0..n-1                    n.. (at most n + window - 1)

    attention_sink_size: tokens kept from the start (the paper: 4); 0 keeps none (plain
        window attention, the paper's failing baseline).
    sliding_window_size: recent tokens kept after the sinks; None: the context length (or
        the KV pool, when smaller) minus the sinks. The sinks plus the window must fit both.
    shift_size: tokens evicted per shift (amortizes the re-rotation); None: a quarter of
        the window. Must be smaller than the window; with page_size > 1 the sinks, the window
        and the shift must be whole pages.
    """

    attention_sink_size: int = 4
    sliding_window_size: int | None = None
    shift_size: int | None = None

    def __post_init__(self) -> None:
        _check_int("attention_sink_size", self.attention_sink_size, lo=0)
        if self.sliding_window_size is not None:
            _check_int("sliding_window_size", self.sliding_window_size, lo=2)
        if self.shift_size is not None:
            _check_int("shift_size", self.shift_size, lo=1)
            if self.sliding_window_size is not None and self.shift_size >= self.sliding_window_size:
                raise ValueError(
                    f"shift_size ({self.shift_size}) must be smaller than sliding_window_size "
                    f"({self.sliding_window_size})"
                )

    def window(self, max_len: int) -> int:
        """The recent window for requests of at most max_len tokens of KV (the context
        length or the pool, whichever is smaller)."""
        window = self.sliding_window_size
        if window is None:
            window = max_len - self.attention_sink_size
        if window < 2 or self.attention_sink_size + window > max_len:
            raise ValueError(
                f"attention_sink_size ({self.attention_sink_size}) + sliding_window_size "
                f"({window}) must be at most {max_len} (the context length or the KV pool, "
                "whichever is smaller), with a window of at least 2 tokens"
            )
        return window

    def shift(self, window: int, page_size: int) -> int:
        """Tokens evicted per shift for this window (whole pages)."""
        shift = self.shift_size if self.shift_size is not None else max(1, window // 4)
        shift = -(-shift // page_size) * page_size
        if shift >= window or self.attention_sink_size % page_size or window % page_size:
            raise ValueError(
                f"with page_size {page_size}, attention_sink_size ({self.attention_sink_size}) "
                f"and sliding_window_size ({window}) must be whole pages and the shift "
                f"({shift}) smaller than the window"
            )
        return shift


@dataclass(frozen=True)
class EngineConfig:
    """jump_forward: append constraint-forced text in one prefill (off: one token per step).
    check_integrity: verify the scheduler's bookkeeping after every step (slow; tests).
    overlap: overlap scheduling (lmprog.runtime.engine.engine's docstring); None: on when the
        model is on a GPU."""

    jump_forward: bool = True
    check_integrity: bool = False
    overlap: bool | None = None

    def __post_init__(self) -> None:
        for name in ("jump_forward", "check_integrity"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.overlap is not None and not isinstance(self.overlap, bool):
            raise TypeError(f"overlap must be a bool or None, got {self.overlap!r}")


LORA_TARGET_MODULES: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


@dataclass(frozen=True)
class LoraConfig:
    """Serving LoRA adapters (lmprog.runtime.lora), under SGLang's names.

    max_loras_per_batch: adapters resident on the device at once (the adapter pool's
        slots); the scheduler runs requests of at most this many adapters together, the
        others wait, and a slot whose adapter no scheduled request uses is reused least
        recently used first.
    max_lora_rank: the pool's rank (every adapter's rank must be at most this); None: the
        largest rank of the adapters given at start-up (16 without any).
    lora_target_modules: the projections adapters may adapt (of q_proj, k_proj, v_proj,
        o_proj, gate_proj, up_proj, down_proj, or "all"); None: those of the adapters given
        at start-up (all seven without any). Only these get pool memory.
    max_loaded_loras: adapters loaded (kept in host memory) at once; None: no limit.
    """

    max_loras_per_batch: int = 8
    max_lora_rank: int | None = None
    lora_target_modules: tuple[str, ...] | None = None
    max_loaded_loras: int | None = None

    def __post_init__(self) -> None:
        _check_int("max_loras_per_batch", self.max_loras_per_batch, lo=1)
        if self.max_lora_rank is not None:
            _check_int("max_lora_rank", self.max_lora_rank, lo=1)
        if self.max_loaded_loras is not None:
            _check_int("max_loaded_loras", self.max_loaded_loras, lo=1)
        targets = self.lora_target_modules
        if targets is not None:
            if isinstance(targets, str):
                targets = (targets,)
            targets = tuple(targets)
            if "all" in targets or "all-linear" in targets:
                targets = LORA_TARGET_MODULES
            bad = [t for t in targets if t not in LORA_TARGET_MODULES]
            if bad or not targets:
                raise ValueError(
                    f"lora_target_modules must name some of {', '.join(LORA_TARGET_MODULES)} "
                    f"(or 'all'), got {self.lora_target_modules!r}"
                )
            object.__setattr__(self, "lora_target_modules", targets)


def _check_int(name: str, value: object, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
