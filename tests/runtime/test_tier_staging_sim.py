"""Predictive staging of the host KV tier (issue 34) under the scheduler, without a model.

A fake engine drives the Scheduler as the real one does with overlap scheduling (step N + 1
planned while step N's sampled tokens are still placeholders) or without it, over a KV pool
barely larger than a batch, with a host tier (and sometimes a disk tier) under the radix tree
and staging on. The fake "model" writes (token, position) into a fake pool at the out-slots
and reads every entry's whole row back, so a staged or loaded block must bring back exactly
the KV it claims; the mover copies those arrays. Every step must plan only slots it can get
(CacheManager.extend asserts it), check_integrity runs after each, and every request's output
equals a batch-free decode of the same deterministic "model".
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from sched_testing import append_outputs

from lmprog.core.sampling import SamplingParams
from lmprog.runtime.config import CacheConfig, SchedulerConfig
from lmprog.runtime.request import Req, ReqStatus
from lmprog.runtime.scheduler import Scheduler

STOP_MOD = 97


def next_token(tokens):
    return (sum(tokens) * 31 + len(tokens) * 7) % 1000


class PoolMover:
    """The KVMover of the fake pool: a handle is the (token, position) rows of its slots."""

    bytes_per_token = 16

    def __init__(self, engine: FakeOverlapEngine) -> None:
        self.e = engine
        self.disk: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._files = 0

    def save(self, slots):
        return self.e.kv_tok[slots].copy(), self.e.kv_pos[slots].copy()

    def load(self, handle, slots, ahead=False):
        assert len(slots) == len(handle[0])
        self.e.kv_tok[slots], self.e.kv_pos[slots] = handle

    def split(self, handle, k):
        return (handle[0][:k], handle[1][:k]), (handle[0][k:], handle[1][k:])

    def spill(self, handle):
        self._files += 1
        self.disk[self._files] = handle
        return self._files

    def load_disk(self, key, slots, ahead=False):
        self.load(self.disk[key], slots)

    def split_disk(self, key, k):
        upper, lower = self.split(self.disk.pop(key), k)
        return self.spill(upper), self.spill(lower)

    def discard(self, key):
        del self.disk[key]


class FakeOverlapEngine:
    """Engine._advance without a model: schedule, "launch" (write and check the KV, sample),
    settle the step in flight, record the launched one (process_launched) when overlapping,
    else record it at once (process_results)."""

    def __init__(self, sched: Scheduler, overlap: bool) -> None:
        self.s = sched
        self.overlap = overlap
        n = sched.cache.capacity + 1
        self.kv_tok = np.full(n, -1, dtype=np.int64)
        self.kv_pos = np.full(n, -1, dtype=np.int64)
        self.device_table = np.zeros_like(sched.req_to_token)
        self.inflight = None  # (batch, tokens, reasons) launched, not settled
        self.device_tokens: dict[int, int] = {}  # the in-flight step's placeholder -> token
        self.finished: list[Req] = []

    def step(self):
        batch = self.s.schedule()
        tokens, reasons, sampled = self.launch(batch)
        if self.inflight is not None:  # the step in flight's tokens replace its placeholders
            prev, prev_tokens, prev_reasons = self.inflight
            self.inflight = None
            append_outputs(prev, prev_tokens)
            for e, toks in zip(prev.entries, prev_tokens):  # a finished request's too
                if toks and e.req.status is ReqStatus.FINISHED and e.req.token_ids[-1] < 0:
                    e.req.token_ids[-1] = toks[0]
            self.finished += self.s.resolve_tokens(prev, prev_reasons)
        if not batch.entries:
            return batch
        if self.overlap:
            placeholders = [(-1 - i,) if e.sample else () for i, e in enumerate(batch.entries)]
            self.finished += self.s.process_launched(batch, placeholders)
            self.inflight = (batch, tokens, reasons)
            self.device_tokens = sampled
        else:
            append_outputs(batch, tokens)
            self.finished += self.s.process_results(batch, reasons)
        return batch

    def launch(self, batch):
        ids = [self.device_tokens.get(t, t) if t < 0 else t for t in batch.input_ids()]
        assert min(ids, default=0) >= 0, "a placeholder of a step not in flight was fed"
        assert (batch.out_slots > 0).all()
        self.kv_tok[batch.out_slots] = ids
        self.kv_pos[batch.out_slots] = batch.positions
        tokens, reasons, sampled = [], [], {}
        for i, e in enumerate(batch.entries):
            host = self.s.req_to_token[e.row, : e.end]
            if e.sync_row:
                self.device_table[e.row, : e.end] = host
            else:
                self.device_table[e.row, e.start : e.end] = host[e.start :]
            row = self.device_table[e.row, : e.end]
            fed = [self.device_tokens.get(t, t) for t in e.req.token_ids[: e.end]]
            assert self.kv_tok[row].tolist() == fed, "a KV slot holds another token"
            assert self.kv_pos[row].tolist() == list(range(e.end)), (
                "a KV slot holds another position"
            )
            if e.sample:
                t = next_token(fed)
                tokens.append([t])
                reasons.append("stop" if t % STOP_MOD == 0 else None)
                sampled[-1 - i] = t
            else:
                tokens.append([])
                reasons.append(None)
        return tokens, reasons, sampled


def reference(prompt, max_tokens, cap):
    toks = list(prompt)
    while len(toks) - len(prompt) < max_tokens and len(toks) < cap:
        t = next_token(toks)
        toks.append(t)
        if t % STOP_MOD == 0:
            return toks[len(prompt) :], "stop"
    return toks[len(prompt) :], "length"


def run_sessions(
    seed, overlap, pool, page=1, disk=False, staging=True, sessions=12, turns=4, max_running=None
):
    """Multi-turn sessions, a round of every session's turn at a time (`concurrency`
    outstanding), against a pool a fraction of their KV: each returning turn's history has
    left the device and comes back from the host tier, staged or at admission."""
    rng = random.Random(seed)
    ctx = 256
    s = Scheduler(
        pool,
        ctx,
        SchedulerConfig(
            max_num_batched_tokens=rng.choice([64, 128, 512]),
            max_running_requests=max_running or rng.choice([2, 4, 8]),
            stagger_min_tokens=rng.choice([0, 16]),
            init_new_token_ratio=rng.choice([0.1, 0.7]),
            min_new_token_ratio=0.05,
            new_token_ratio_decay=0.01,
        ),
        CacheConfig(
            page_size=page,
            host_kv_cache_bytes=PoolMover.bytes_per_token * rng.choice([ctx, 4 * ctx, 50 * ctx]),
            host_kv_staging=staging,
            disk_kv_cache_bytes=PoolMover.bytes_per_token * 50 * ctx if disk else 0,
        ),
    )
    engine = FakeOverlapEngine(s, overlap)
    s.cache.attach_host_tier(PoolMover(engine))
    concurrency = rng.choice([4, 8, 16])
    history = [
        [rng.randrange(1, 999) for _ in range(rng.randrange(20, 60))] for _ in range(sessions)
    ]
    done, steps = [], 0
    for _ in range(turns):
        queue = list(range(sessions))
        live: dict[int, Req] = {}
        while queue or live:
            while queue and len(live) < concurrency:
                i = queue.pop(0)
                prompt = history[i] + [rng.randrange(1, 999) for _ in range(rng.randrange(4, 16))]
                r = Req(
                    (i, len(done)),
                    prompt,
                    SamplingParams(max_tokens=rng.randrange(1, 16), ignore_eos=True),
                )
                live[i] = s.submit(r)
            engine.step()
            s.check_integrity()
            steps += 1
            assert steps < 20_000, "stuck"
            collect_finished(live, history, done)
    while engine.inflight is not None or s.has_work:
        engine.step()
        s.check_integrity()
    cap = min(ctx, s.cache.capacity)
    for r in done:
        want, reason = reference(r.prompt_ids, r.params.max_tokens, cap)
        assert list(r.output_ids) == want, r.rid
        # a stop token sampled at the length cap: overlap finishes it at launch ("length")
        capped = len(want) == r.params.max_tokens or r.seq_len == cap
        assert r.finish_reason == reason or (capped and r.finish_reason == "length"), r.rid
    return s


CASES = [  # (overlap, pool, page, disk): a pool a little past the longest request
    (True, 200, 1, False),
    (False, 200, 1, False),
    (True, 240, 4, False),
    (True, 200, 1, True),
]


def collect_finished(live: dict, history: dict, done: list) -> None:
    """Move the sessions' finished turns out of `live`: their text is the next turn's history."""
    for i, r in list(live.items()):
        if r.status is ReqStatus.FINISHED and r.num_placeholders == 0:
            history[i] = list(r.token_ids)
            done.append(r)
            del live[i]


@pytest.mark.parametrize(("overlap", "pool", "page", "disk"), CASES)
@pytest.mark.parametrize("seed", range(3))
def test_staging_under_a_tight_pool_plans_only_slots_it_can_get(overlap, pool, page, disk, seed):
    s = run_sessions(seed, overlap, pool, page, disk)
    tier = s.cache.tier_stats()
    assert tier is not None and tier["host_kv_hit_tokens"] + tier["host_kv_staged_tokens"] > 0


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("seed", range(2))
def test_staging_loads_the_queue_head_while_the_rows_are_full(overlap, seed):
    """Two rows and room in the pool for a third request: the queue's head is staged while
    it waits for a row, and admission then finds those tokens on the device. (Staging does
    not load a request that would not fit beside the running ones: its blocks would be
    evicted again before its admission; in a pool barely past a batch that is most steps.)"""
    runs = {}
    for staging in (True, False):
        s = run_sessions(seed, overlap, 400, staging=staging, max_running=2)
        stats, tier = s.stats(), s.cache.tier_stats()
        assert tier is not None
        device_hits = stats.cached_tokens - stats.cached_host_tokens
        runs[staging] = (device_hits, tier["host_kv_hit_tokens"], tier["host_kv_staged_tokens"])
    (on_device, on_loads, staged), (off_device, off_loads, _) = runs[True], runs[False]
    assert staged > 0 and on_device > off_device  # staged tokens became device hits
    assert on_loads + staged <= off_loads  # and no staged copy was wasted beyond those


def test_a_step_that_needs_every_evictable_slot_gets_them_across_a_heap_rebuild():
    """The H100 failure ("extend needs 1549 slots; check available_tokens first"), on the
    CPU: a pool full of cached histories (prefixes with two turns each), a heap churned to
    its rebuild threshold, and one request whose chunk needs every free and evictable slot.
    The plan counts them all; extend must get them all, though evicting them rebuilds the
    heap midway (radix.py once went on popping the old heap and stopped short)."""
    from test_radix import bloat_heap, two_leaves_per_prefix

    s = Scheduler(2400, 4096, SchedulerConfig(max_num_batched_tokens=4096))
    two_leaves_per_prefix(s.cache.prefix_cache, 200, s.cache.allocator)
    bloat_heap(s.cache.prefix_cache)
    assert s.cache.available_tokens == 2400 and s.cache.allocator.num_free == 800
    r = s.submit(Req("r", list(range(50_000, 52_399)), SamplingParams(max_tokens=1)))
    batch = s.schedule()  # every slot: 800 free, 1,600 evicted
    assert batch.entries[0].num_new == 2399 and s.cache.prefix_cache.evictable_size == 0
    s.check_integrity()
    assert r.num_allocated == 2399


def test_a_reset_keeps_the_queue_and_retracted_requests_and_drops_the_running():
    """Scheduler.reset (the engine's recovery from an internal error): requests holding no
    KV whose tokens are all known keep their place, the waiting and the retracted (they
    resume by prefilling); the running ones are dropped; the rest then run exactly."""
    config = SchedulerConfig(
        max_num_batched_tokens=64,
        max_running_requests=2,
        init_new_token_ratio=0.05,  # admission counts on little growth: two run at once
        min_new_token_ratio=0.05,
    )
    s = Scheduler(64, 256, config)
    engine = FakeOverlapEngine(s, overlap=False)
    a, b, c = (
        s.submit(Req(rid, [rid * 10 + j for j in range(20)], SamplingParams(max_tokens=30)))
        for rid in (1, 2, 3)
    )
    for _ in range(100):  # two of them outgrow the pool: the newer is retracted
        engine.step()
        if s.num_retractions:
            break
    retracted = [r for r in s.requests.waiting if r.status is ReqStatus.RETRACTED]
    assert retracted and c.status is ReqStatus.WAITING
    running = list(s.requests.running_reqs())
    dropped = s.reset()
    assert dropped == running and all(r.finish_reason == "error" for r in running)
    assert s.requests.waiting == [r for r in (a, b, c) if r not in running]
    assert retracted[0].status is ReqStatus.RETRACTED and retracted[0].num_computed == 0
    for _ in range(1000):
        if not s.has_work:
            break
        engine.step()
        s.check_integrity()
    assert not s.has_work
    for r in s.requests.waiting + [r for r in (a, b, c) if r not in running]:
        assert list(r.output_ids) == reference(r.prompt_ids, 30, 64)[0]
