"""/metrics: the server's counters and histograms and the backend's stats(), in
prometheus-client's text format.

Each server has a CollectorRegistry of its own, so several servers in one process count
apart; backend values are read from `backend.stats()` at scrape time.
Design: docs/design/server.md#logs-and-metrics.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST

# backend.stats() key -> (metric name, type, help)
_BACKEND = {
    "num_running": ("lmprog_requests_running", "gauge", "Requests in the running batch."),
    "num_waiting": ("lmprog_requests_queued", "gauge", "Requests waiting to be scheduled."),
    "cache_hit_rate": (
        "lmprog_prefix_cache_hit_rate",
        "gauge",
        "Share of prompt tokens served from the prefix cache (the engine's count).",
    ),
    "cached_tokens": (
        "lmprog_prefix_cache_hit_tokens",
        "counter",
        "Prompt tokens served from the prefix cache (the engine's count).",
    ),
    "cached_host_tokens": (
        "lmprog_prefix_cache_host_hit_tokens",
        "counter",
        "Of the prefix cache's prompt tokens, those loaded from the host KV tier at their "
        "request's first admission (the disk tier's included).",
    ),
    "cached_disk_tokens": (
        "lmprog_prefix_cache_disk_hit_tokens",
        "counter",
        "Of those, the ones read from the disk KV tier.",
    ),
    "kv_usage": ("lmprog_kv_cache_usage_ratio", "gauge", "Share of KV cache slots in use."),
    "generated_tokens": (
        "lmprog_engine_generated_tokens",
        "counter",
        "Tokens sampled by the engine.",
    ),
    "gen_tokens_per_s": (
        "lmprog_engine_gen_tokens_per_second",
        "gauge",
        "Generation throughput over busy time.",
    ),
    "num_retractions": (
        "lmprog_engine_retractions",
        "counter",
        "Requests retracted for lack of KV cache.",
    ),
    # the KV tiers under the prefix cache (the runtime's host and disk tiers; llama.cpp's
    # saved states in memory and on disk report the bytes, hits and failures)
    "host_kv_used_bytes": (
        "lmprog_host_kv_cache_used_bytes",
        "gauge",
        "Bytes of KV held in the host-memory tier under the prefix cache.",
    ),
    "host_kv_capacity_bytes": (
        "lmprog_host_kv_cache_capacity_bytes",
        "gauge",
        "Bytes of KV the host-memory tier can hold.",
    ),
    "host_kv_capacity_tokens": (
        "lmprog_host_kv_cache_capacity_tokens",
        "gauge",
        "Tokens the host-memory KV tier can hold.",
    ),
    "host_kv_hit_tokens": (
        "lmprog_host_kv_cache_hit_tokens",
        "counter",
        "Tokens loaded back from the host KV tier at admission instead of recomputed (those "
        "read from the disk tier under it included; a retracted request's second admission "
        "counts again).",
    ),
    "host_kv_staged_tokens": (
        "lmprog_host_kv_cache_staged_tokens",
        "counter",
        "Tokens loaded from the host KV tier ahead of admission (predictive staging).",
    ),
    "host_kv_written_tokens": (
        "lmprog_host_kv_cache_written_tokens",
        "counter",
        "Tokens evicted from the KV pool into the host-memory tier.",
    ),
    "host_kv_evicted_tokens": (
        "lmprog_host_kv_cache_evicted_tokens",
        "counter",
        "Tokens dropped from the host-memory KV tier for room.",
    ),
    "host_kv_dropped_tokens": (
        "lmprog_host_kv_cache_dropped_tokens",
        "counter",
        "Evicted KV tokens the host tier could not take, and host blocks replaced.",
    ),
    "host_kv_load_failures": (
        "lmprog_host_kv_cache_load_failures",
        "counter",
        "Host- or disk-tier loads that failed (a failed copy, a damaged file): recomputed.",
    ),
    "host_kv_load_misses": (
        "lmprog_host_kv_cache_load_misses",
        "counter",
        "Host-tier loads that found a block gone: recomputed.",
    ),
    "host_kv_partial_loads": (
        "lmprog_host_kv_cache_partial_loads",
        "counter",
        "Host-tier loads the KV pool could take only part of (the rest left on the host).",
    ),
    "disk_kv_used_bytes": (
        "lmprog_disk_kv_cache_used_bytes",
        "gauge",
        "Bytes of KV held in the disk tier under the host tier.",
    ),
    "disk_kv_capacity_bytes": (
        "lmprog_disk_kv_cache_capacity_bytes",
        "gauge",
        "Bytes of KV the disk tier can hold.",
    ),
    "disk_kv_hit_tokens": (
        "lmprog_disk_kv_cache_hit_tokens",
        "counter",
        "Tokens loaded back from the disk KV tier instead of recomputed.",
    ),
    "disk_kv_staged_tokens": (
        "lmprog_disk_kv_cache_staged_tokens",
        "counter",
        "Tokens loaded from the disk KV tier ahead of admission (predictive staging).",
    ),
    "disk_kv_written_tokens": (
        "lmprog_disk_kv_cache_written_tokens",
        "counter",
        "Tokens the host tier evicted into the disk tier.",
    ),
    "disk_kv_evicted_tokens": (
        "lmprog_disk_kv_cache_evicted_tokens",
        "counter",
        "Tokens dropped from the disk KV tier for room.",
    ),
    "disk_kv_write_failures": (
        "lmprog_disk_kv_cache_write_failures",
        "counter",
        "Disk-tier writes that failed (a full disk); those tokens were dropped.",
    ),
    "constraint_lexer_renewals": (
        "lmprog_constraint_lexer_renewals",
        "counter",
        "Constraint lexers renewed after reaching their state limit (this process).",
    ),
}

# seconds; vLLM's buckets for the same histograms, cut to what a CPU or GPU server sees
_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
_TPOT = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


# [prompt, completion, cached prompt] tokens of the HTTP request being answered (set by the
# Gate; the handlers' tasks share the list, so usage counted in a streaming task reaches it).
REQUEST_TOKENS: contextvars.ContextVar[list[int]] = contextvars.ContextVar("lmprog_tokens")


class ServerMetrics:
    """One server's metrics. `registry`: its own CollectorRegistry; `stats`: a callable
    returning the backend's stats() (read at each scrape; None: no backend metrics)."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "lmprog_http_requests",
            "HTTP requests by path and status.",
            ["path", "status"],
            registry=r,
        )
        self.in_flight = Gauge(
            "lmprog_http_requests_in_flight", "Requests being served.", registry=r
        )
        self.client_aborts = Counter(
            "lmprog_http_client_aborts",
            "Requests whose client disconnected before the whole response (not errors).",
            registry=r,
        )
        self.prompt_tokens = Counter(
            "lmprog_prompt_tokens", "Prompt tokens of finished requests.", registry=r
        )
        self.cached_prompt_tokens = Counter(
            "lmprog_cached_prompt_tokens",
            "Prompt tokens of finished requests served from the prefix cache "
            "(hit rate: this over lmprog_prompt_tokens_total).",
            registry=r,
        )
        self.completion_tokens = Counter(
            "lmprog_completion_tokens", "Generated tokens of finished requests.", registry=r
        )
        self.reasoning_tokens = Counter(
            "lmprog_reasoning_tokens",
            "Of the generated tokens, those of a reasoning model's thinking.",
            registry=r,
        )
        self.duration = Histogram(
            "lmprog_http_request_duration_seconds",
            "Time to serve an HTTP request, to its last byte (streams included), by path.",
            ["path"],
            buckets=_LATENCY,
            registry=r,
        )
        self.e2e = Histogram(
            "lmprog_e2e_request_latency_seconds",
            "Time from a request's arrival to the end of each of its generations.",
            buckets=_LATENCY,
            registry=r,
        )
        self.ttft = Histogram(
            "lmprog_time_to_first_token_seconds",
            "Time from a request's arrival to each generation's first text piece.",
            buckets=_TTFT,
            registry=r,
        )
        self.tpot = Histogram(
            "lmprog_time_per_output_token_seconds",
            "Time per output token after the first, per generation of two tokens or more.",
            buckets=_TPOT,
            registry=r,
        )
        self.queue = Histogram(
            "lmprog_request_queue_time_seconds",
            "Time a generation waited for a worker thread (max_concurrency) before its "
            "backend call began.",
            buckets=_LATENCY,
            registry=r,
        )
        if stats is not None:
            r.register(_BackendCollector(stats))

    # -- the gate, the handlers (event loop) ------------------------------------------------
    def on_response(self, path: str, status: int, seconds: float) -> None:
        self.requests.labels(path, str(status)).inc()
        self.duration.labels(path).observe(seconds)

    def on_client_abort(self) -> None:
        self.client_aborts.inc()

    def on_usage(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        *,
        reasoning_tokens: int = 0,
    ) -> None:
        tally = REQUEST_TOKENS.get(None)
        if tally is not None:  # the request's access log line reports them
            tally[0] += prompt_tokens
            tally[1] += completion_tokens
            tally[2] += cached_tokens
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)
        self.cached_prompt_tokens.inc(cached_tokens)
        self.reasoning_tokens.inc(reasoning_tokens)

    # -- Generations (worker threads) -------------------------------------------------------
    def on_generation(
        self,
        *,
        arrival: float,
        submitted: float,
        started: float,
        first_piece: float | None,
        finished: float,
        completion_tokens: int,
    ) -> None:
        """One finished generation's times (time.perf_counter() values)."""
        self.queue.observe(max(0.0, started - submitted))
        self.e2e.observe(max(0.0, finished - arrival))
        if first_piece is not None:
            self.ttft.observe(max(0.0, first_piece - arrival))
            if completion_tokens > 1:
                self.tpot.observe(max(0.0, finished - first_piece) / (completion_tokens - 1))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric of this server."""
        return generate_latest(self.registry)


class _BackendCollector:
    """backend.stats() as metric families, read at each scrape."""

    def __init__(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        self._stats = stats

    def describe(self) -> list[Metric]:
        return []  # names depend on what the backend reports: no duplicate check up front

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        for key, (name, kind, help_) in _BACKEND.items():
            value = stats.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                    name, help_, value=value
                )
                yield family
        finished = stats.get("requests_finished")
        if isinstance(finished, Mapping):
            family = CounterMetricFamily(
                "lmprog_engine_requests_finished",
                "Engine requests by finish reason.",
                labels=["reason"],
            )
            for reason, value in sorted(finished.items(), key=lambda kv: str(kv[0])):
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    family.add_metric([str(reason)], value)
            yield family
