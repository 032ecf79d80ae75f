"""/metrics: the server's counters and the backend's stats() in Prometheus text format.

Updated on the event loop thread only (no locks). Backend gauges come from
`backend.stats()` at scrape time: running/queued requests, cache hit rate, KV usage, ...
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

# backend.stats() key -> (metric name, type, help)
_BACKEND = {
    "num_running": ("lmprog_requests_running", "gauge", "Requests in the running batch."),
    "num_waiting": ("lmprog_requests_queued", "gauge", "Requests waiting to be scheduled."),
    "cache_hit_rate": (
        "lmprog_prefix_cache_hit_rate",
        "gauge",
        "Share of prompt tokens served from the prefix cache.",
    ),
    "cached_tokens": (
        "lmprog_prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens served from the prefix cache.",
    ),
    "kv_usage": ("lmprog_kv_cache_usage_ratio", "gauge", "Share of KV cache slots in use."),
    "generated_tokens": (
        "lmprog_engine_generated_tokens_total",
        "counter",
        "Tokens sampled by the engine.",
    ),
    "gen_tokens_per_s": (
        "lmprog_engine_gen_tokens_per_second",
        "gauge",
        "Generation throughput over busy time.",
    ),
    "num_retractions": (
        "lmprog_engine_retractions_total",
        "counter",
        "Requests retracted for lack of KV cache.",
    ),
}


class ServerMetrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()  # (path, status) -> count
        self.in_flight = 0
        self.client_aborts = 0  # requests whose client left before the whole response
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.latency_sum = 0.0
        self.latency_count = 0

    def on_response(self, path: str, status: int, seconds: float) -> None:
        self.requests[(path, status)] += 1
        self.latency_sum += seconds
        self.latency_count += 1

    def on_client_abort(self) -> None:
        self.client_aborts += 1

    def on_usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def on_first_token(self, seconds: float) -> None:
        self.ttft_sum += seconds
        self.ttft_count += 1

    def render(self, stats: Mapping[str, Any]) -> str:
        lines: list[str] = []
        _family(
            lines,
            "lmprog_http_requests_total",
            "counter",
            "HTTP requests by path and status.",
            [
                (f'{{path="{_escape(p)}",status="{s}"}}', v)
                for (p, s), v in sorted(self.requests.items())
            ],
        )
        _family(
            lines,
            "lmprog_http_requests_in_flight",
            "gauge",
            "Requests being served.",
            [("", self.in_flight)],
        )
        _family(
            lines,
            "lmprog_http_client_aborts_total",
            "counter",
            "Requests whose client disconnected before the whole response (not errors).",
            [("", self.client_aborts)],
        )
        _family(
            lines,
            "lmprog_prompt_tokens_total",
            "counter",
            "Prompt tokens of finished requests.",
            [("", self.prompt_tokens)],
        )
        _family(
            lines,
            "lmprog_completion_tokens_total",
            "counter",
            "Generated tokens of finished requests.",
            [("", self.completion_tokens)],
        )
        _summary(
            lines,
            "lmprog_time_to_first_token_seconds",
            "Time to the first streamed text.",
            self.ttft_sum,
            self.ttft_count,
        )
        _summary(
            lines,
            "lmprog_http_request_duration_seconds",
            "Time to serve a request.",
            self.latency_sum,
            self.latency_count,
        )
        for key, (name, kind, help_) in _BACKEND.items():
            value = stats.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                _family(lines, name, kind, help_, [("", value)])
        finished = stats.get("requests_finished")
        if isinstance(finished, Mapping):
            _family(
                lines,
                "lmprog_engine_requests_finished_total",
                "counter",
                "Engine requests by finish reason.",
                [(f'{{reason="{_escape(str(r))}"}}', v) for r, v in sorted(finished.items())],
            )
        return "\n".join(lines) + "\n"


def _family(
    lines: list[str], name: str, kind: str, help_: str, samples: list[tuple[str, float]]
) -> None:
    lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{labels} {_number(v)}" for labels, v in samples]


def _summary(lines: list[str], name: str, help_: str, total: float, count: int) -> None:
    lines += [
        f"# HELP {name} {help_}",
        f"# TYPE {name} summary",
        f"{name}_sum {_number(total)}",
        f"{name}_count {count}",
    ]


def _number(v: float) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
