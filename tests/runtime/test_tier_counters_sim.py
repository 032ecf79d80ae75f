"""The tiered KV cache's counters at the shape of the H100 bench run (issue 34), no model.

bench/bench_tiered_kv.py --sessions 64 --no-disk on an H100 printed host hits above the
prefix hits (92.6% of the prompt tokens as host hits, -10.9% as device hits; with staging
178.6% and -97.0%). The scheduler over the fake engine of test_tier_staging_sim at that
shape (Llama-3.1-8B's pool of 34,816 tokens; 64 sessions x 6 turns, history 1,024 + 128 a
turn, 64 out; 32 running, 64 outstanding, 8,192-token steps) showed why: admission loaded a
request's host blocks before checking that it fits and released it when it did not (71k
tokens in 567 tries, each counted again when it came back), and staging loaded blocks for
requests that could not run yet, which the running ones evicted again before their
admission (631k staged tokens, under a thousand device hits). Each request's first
admission now splits exactly into device hits, host hits and prefilled tokens.
"""

from __future__ import annotations

import random

import pytest
import test_tier_staging_sim as sim
from test_tier_staging_sim import FakeOverlapEngine, PoolMover, collect_finished

from lmprog.core.sampling import SamplingParams
from lmprog.runtime.config import CacheConfig, SchedulerConfig
from lmprog.runtime.request import Req
from lmprog.runtime.scheduler import Scheduler

SESSIONS, TURNS, HISTORY, USER, OUTPUT = 64, 6, 1024, 128, 64
POOL, RUNNING, OUTSTANDING, CHUNK = 34_816, 32, 64, 8192


def bench_rounds(overlap: bool, staging: bool):
    """The bench's rounds of turns; the scheduler, the finished requests, and per request
    the prompt tokens fed before its first retraction."""
    final = SESSIONS * (HISTORY + TURNS * (USER + OUTPUT))
    s = Scheduler(
        POOL,
        HISTORY + TURNS * (USER + OUTPUT) + 8,
        SchedulerConfig(max_num_batched_tokens=CHUNK, max_running_requests=RUNNING),
        CacheConfig(host_kv_cache_bytes=PoolMover.bytes_per_token * final, host_kv_staging=staging),
    )
    engine = FakeOverlapEngine(s, overlap)
    s.cache.attach_host_tier(PoolMover(engine))
    rng = random.Random(0)
    history = [[rng.randrange(1, 999) for _ in range(HISTORY)] for _ in range(SESSIONS)]
    params = SamplingParams(max_tokens=OUTPUT, ignore_eos=True)
    fed: dict[int, int] = {}  # id(req) -> prompt positions fed before a retraction
    done: list[Req] = []
    steps = [0]

    def step() -> None:
        batch = engine.step()
        steps[0] += 1
        for e in batch.entries:
            if e.req.num_retractions == 0 and e.start < e.req.prompt_len:
                fed[id(e.req)] = fed.get(id(e.req), 0) + min(e.end, e.req.prompt_len) - e.start
        if steps[0] % 50 == 0:  # (the whole pool's check: not every step)
            s.check_integrity()

    for turn in range(TURNS):
        queue, live = list(range(SESSIONS)), {}
        while queue or live:
            while queue and len(live) < OUTSTANDING:
                i = queue.pop(0)
                prompt = history[i] + [rng.randrange(1, 999) for _ in range(USER)]
                live[i] = s.submit(Req((i, turn), prompt, params))
            step()
            collect_finished(live, history, done)
    while engine.inflight is not None or s.has_work:
        step()
    s.check_integrity()
    return s, done, fed


@pytest.mark.parametrize(  # each setting once (the four pairs took 34 s)
    "overlap, staging", [(True, True), (False, False)], ids=["overlap-staged", "sync-host"]
)
def test_the_tier_counters_add_up_to_the_prompt_tokens_at_the_h100_shape(
    overlap, staging, monkeypatch
):
    monkeypatch.setattr(sim, "STOP_MOD", 1 << 40)  # every turn generates its 64 tokens
    s, done, fed = bench_rounds(overlap, staging)
    stats, tier = s.stats(), s.cache.tier_stats()
    assert tier is not None and len(done) == SESSIONS * TURNS
    assert all(len(r.output_ids) == OUTPUT for r in done)
    for r in done:  # a first admission: device hits + host hits + prefilled = its prompt
        assert 0 <= r.cached_disk_tokens <= r.cached_host_tokens <= r.cached_tokens, r.rid
        device = r.cached_tokens - r.cached_host_tokens
        assert device + r.cached_host_tokens + fed[id(r)] == r.prompt_len, r.rid
    assert stats.prompt_tokens == sum(r.prompt_len for r in done)
    assert stats.cached_tokens == sum(r.cached_tokens for r in done)
    assert stats.cached_host_tokens == sum(r.cached_host_tokens for r in done)
    assert stats.cached_host_tokens > 0.5 * stats.prompt_tokens  # the tier does its work
    # every admission load is used by the request it was made for: beyond the first
    # admissions' host hits only retracted requests' second admissions load (at most what
    # they held); staged tokens are device hits or re-admissions' too, none wasted
    retracted = sum(r.seq_len for r in done if r.num_retractions)
    assert stats.num_retractions < 20
    extra_loads = tier["host_kv_hit_tokens"] - stats.cached_host_tokens
    assert 0 <= extra_loads <= retracted
    device_hits = stats.cached_tokens - stats.cached_host_tokens
    assert tier["host_kv_staged_tokens"] <= device_hits + retracted
    assert tier["host_kv_partial_loads"] == 0 or staging
