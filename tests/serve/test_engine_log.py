"""The server's engine line (engine_log.py): one line per interval while the backend is busy,
silent while idle, rates and hit rate over the interval, parts a backend lacks left out."""

from __future__ import annotations

import logging
import time

import pytest

from lmprog.serve.engine_log import EngineLog


class Stats:
    def __init__(self, **values):
        self.values = dict(values)

    def __call__(self):
        return dict(self.values)


BUSY = {
    "num_running": 3,
    "num_waiting": 1,
    "generated_tokens": 0,
    "prompt_tokens": 0,
    "cached_tokens": 0,
    "kv_used": 512,
    "kv_capacity": 4096,
}


def test_a_line_per_busy_interval_and_none_while_idle():
    stats = Stats(**BUSY)
    log = EngineLog(stats, interval_s=10)
    assert log.line(now=0.0) is None  # the starting counts
    stats.values.update(generated_tokens=413, prompt_tokens=2100, cached_tokens=1200)
    assert log.line(now=10.0) == (
        "engine: 3 running, 1 queued | generation 41.3 tok/s, prompt 210.0 tok/s | "
        "prefix cache hit rate 57.1% | KV cache 12.5% (512 of 4096 tokens)"
    )
    stats.values.update(num_running=0, num_waiting=0)
    assert log.line(now=20.0) is None  # nothing happened since
    stats.values.update(num_waiting=2)  # waiting requests are activity
    assert log.line(now=30.0).startswith("engine: 0 running, 2 queued | generation 0.0 tok/s")


def test_what_a_backend_lacks_is_left_out():
    stats = Stats(generated_tokens=0)
    log = EngineLog(stats)
    log.line(now=0.0)
    stats.values["generated_tokens"] = 50
    assert log.line(now=5.0) == "engine: generation 10.0 tok/s"
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        EngineLog(stats, interval_s=0)


def test_the_thread_logs_at_info(caplog):
    caplog.set_level(logging.INFO, logger="lmprog.serve.engine")
    stats = Stats(**BUSY)
    log = EngineLog(stats, interval_s=0.05).start()
    try:
        for _ in range(200):
            stats.values["generated_tokens"] += 1
            if any(r.name == "lmprog.serve.engine" for r in caplog.records):
                break
            time.sleep(0.01)
    finally:
        log.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "lmprog.serve.engine"]
    assert lines and lines[0].startswith("engine: 3 running, 1 queued | generation ")


def test_the_kv_tiers_usage_and_hits_join_the_line():
    tiers = dict(host_kv_used_tokens=800, host_kv_capacity_tokens=2000, host_kv_hit_tokens=0)
    tiers.update(disk_kv_used_tokens=50, disk_kv_capacity_tokens=1000, disk_kv_hit_tokens=0)
    stats = Stats(**BUSY, **tiers)
    log = EngineLog(stats, interval_s=10)
    log.line(now=0.0)
    stats.values.update(prompt_tokens=2000, cached_tokens=1200, host_kv_hit_tokens=500)
    stats.values.update(disk_kv_hit_tokens=100)
    assert log.line(now=10.0).endswith(
        "KV cache 12.5% (512 of 4096 tokens) | host tier 40.0% (800 of 2000 tokens), 25.0% of "
        "prompt tokens loaded from it | disk tier 5.0% (50 of 1000 tokens), 5.0% of prompt "
        "tokens loaded from it"
    )


def test_tiers_counted_in_bytes_join_the_line_in_mib():
    """llama.cpp's saved states report their tiers in bytes (LlamaCpp.stats())."""
    tiers = dict(host_kv_used_bytes=3 << 20, host_kv_capacity_bytes=12 << 20)
    tiers.update(host_kv_hit_tokens=0, disk_kv_used_bytes=1 << 20, disk_kv_capacity_bytes=0)
    stats = Stats(**BUSY, **tiers)
    log = EngineLog(stats, interval_s=10)
    log.line(now=0.0)
    stats.values.update(prompt_tokens=400, cached_tokens=300, host_kv_hit_tokens=100)
    assert log.line(now=10.0).endswith(
        "KV cache 12.5% (512 of 4096 tokens) | host tier 25.0% (3.0 of 12.0 MiB), 25.0% of "
        "prompt tokens loaded from it"
    )  # a tier of no capacity is left out
