"""Randomized scheduler simulation against a fake model that checks every KV read.

The fake model stores (token, position) in a fake KV pool at the scheduled out-slots and, for
every entry, reads the request's whole row back: each slot must hold exactly that request's
token at that position. It reads from a "device" mirror of req_to_token that it updates the
way a GPU engine would: only the out-slots of each entry, plus the whole row when the entry
says sync_row. Prefix-cache sharing, eviction, retraction, paging, aborts, jump-forward
appends, re-tokenized tails and speculative verify steps are all exercised; check_integrity
runs after every step, and every request's output must equal what a batch-free decode of the
same deterministic "model" gives, whatever the configuration.
"""

import random

import numpy as np
import pytest
from sched_testing import append_outputs, process, rewrite

from lmprog.core.sampling import SamplingParams
from lmprog.runtime.config import CacheConfig, SchedulerConfig
from lmprog.runtime.request import Req, ReqStatus
from lmprog.runtime.scheduler import Scheduler

STOP_MOD = 53  # a token divisible by this is a "stop token"


def next_token(tokens):
    return (sum(tokens) * 31 + len(tokens) * 7) % 1000


def reference(prompt, max_tokens, cap):
    toks = list(prompt)
    while len(toks) - len(prompt) < max_tokens and len(toks) < cap:
        t = next_token(toks)
        toks.append(t)
        if t % STOP_MOD == 0:
            return toks[len(prompt) :], "stop"
    return toks[len(prompt) :], "length"


class FakeEngine:
    def __init__(self, sched: Scheduler, rng: random.Random, speculate: bool) -> None:
        self.s = sched
        self.rng = rng
        self.speculate = speculate
        self.retokenize = False  # rewrite a running request's tail mid-step (a jump-forward)
        n = sched.cache.capacity + 1
        self.kv_tok = np.full(n, -1, dtype=np.int64)
        self.kv_pos = np.full(n, -1, dtype=np.int64)
        self.min_free = n
        self.device_table = np.zeros_like(sched.req_to_token)

    def set_drafts(self):
        for r in self.s.requests.running_reqs():
            if self.rng.random() < 0.5 and r.pending_len == 1:
                toks, drafts = list(r.token_ids), []
                for _ in range(self.rng.randint(1, 4)):
                    t = next_token(toks) if self.rng.random() < 0.7 else 999_999
                    drafts.append(t)
                    toks.append(t)
                r.draft_ids = drafts

    def step(self):
        if self.speculate:
            self.set_drafts()
        batch = self.s.schedule()
        self.min_free = min(self.min_free, self.s.cache.allocator.num_free)
        assert (batch.out_slots > 0).all()
        ids = batch.input_ids()
        self.kv_tok[batch.out_slots] = ids
        self.kv_pos[batch.out_slots] = batch.positions
        tokens, reasons = [], []
        for e in batch.entries:
            host = self.s.req_to_token[e.row, : e.end]
            assert np.array_equal(host[e.start :], batch.out_slots[e.offset : e.offset + e.num_new])
            if e.sync_row:
                self.device_table[e.row, : e.end] = host
            else:
                self.device_table[e.row, e.start : e.end] = host[e.start :]
            row = self.device_table[e.row, : e.end]
            fed = e.req.token_ids[: e.end - e.num_draft] + list(e.draft_ids)
            assert self.kv_tok[row].tolist() == fed, "a KV slot holds another token"
            assert self.kv_pos[row].tolist() == list(range(e.end)), (
                "a KV slot holds another position"
            )
            toks, reason = self.sample(e) if e.sample else ([], None)
            tokens.append(toks)
            reasons.append(reason)
        append_outputs(batch, tokens)
        running = [e.req for e in batch.entries if e.req.status is ReqStatus.RUNNING]
        if self.retokenize and running:  # re-tokenize a tail: same tokens, KV dropped
            r = self.rng.choice(running)
            keep = self.rng.randint(r.prompt_len, r.seq_len)
            rewrite(r, keep, r.token_ids[keep:])
        self.retokenize = False
        finished = self.s.process_results(batch, reasons)
        return batch, finished

    def sample(self, e):
        """Verify drafts (accepted prefix + a bonus token); sometimes append a few more
        tokens at once, as jump-forward does with text forced by a constraint."""
        seq, out = list(e.req.token_ids), []
        forced = self.rng.randint(1, 3) if self.rng.random() < 0.15 else 0
        for draft in list(e.draft_ids) + [None] * (1 + forced):
            if len(out) == e.req.remaining_tokens:
                break
            t = next_token(seq)
            out.append(t)
            seq.append(t)
            if t % STOP_MOD == 0:
                return out, "stop"
            if draft is not None and draft != t:
                break
        return out, None


CONFIGS = {
    "big-pool": dict(num_slots=4096, page=1, radix=True, eviction="lru", speculate=False),
    "tiny-pool-lfu": dict(num_slots=80, page=1, radix=True, eviction="lfu", speculate=False),
    "tiny-pool-no-radix": dict(num_slots=80, page=1, radix=False, eviction="lru", speculate=False),
    "tiny-pool-paged": dict(num_slots=96, page=4, radix=True, eviction="lru", speculate=False),
    "no-radix-paged-speculative": dict(
        num_slots=96, page=4, radix=False, eviction="lru", speculate=True
    ),
    "speculative": dict(num_slots=64, page=1, radix=True, eviction="lru", speculate=True),
    "speculative-paged": dict(num_slots=128, page=2, radix=True, eviction="lfu", speculate=True),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_random_workload_keeps_integrity_and_exact_outputs(name):
    simulate(name, seed=sorted(CONFIGS).index(name))


def simulate(name, seed):
    cfg = CONFIGS[name]
    rng = random.Random(seed)
    ctx = 64
    s = Scheduler(
        cfg["num_slots"],
        ctx,
        SchedulerConfig(
            max_num_batched_tokens=24,
            max_running_requests=6,
            stagger_min_tokens=6,
            lpm_max_queue=5,
            init_new_token_ratio=0.3,
            min_new_token_ratio=0.05,
            new_token_ratio_decay=0.01,
        ),
        CacheConfig(page_size=cfg["page"], radix_cache=cfg["radix"], eviction=cfg["eviction"]),
    )
    engine = FakeEngine(s, rng, cfg["speculate"])
    prefixes = [[rng.randint(0, 999) for _ in range(rng.randint(4, 20))] for _ in range(4)]
    submitted, aborted, finished = {}, set(), []
    for step in range(3000):  # noqa: B007 - read after the loop
        if len(submitted) < 60 and rng.random() < 0.35:
            prompt = rng.choice(prefixes + [[]]) + [
                rng.randint(0, 999) for _ in range(rng.randint(1, 12))
            ]
            pls = rng.randint(0, len(prompt) - 1) if rng.random() < 0.1 else None
            r = Req(
                len(submitted),
                prompt,
                SamplingParams(max_tokens=rng.randint(0, 24), ignore_eos=True),
                prompt_logprob_start=pls,
            )
            submitted[r.rid] = s.submit(r)
        if rng.random() < 0.02 and s.has_work:
            victim = rng.choice([*s.requests.waiting, *s.requests.running_reqs()])
            s.abort(victim.rid)
            aborted.add(victim.rid)
        engine.retokenize = rng.random() < 0.05
        finished += engine.step()[1]
        s.check_integrity()
        if len(submitted) == 60 and not s.has_work:
            break
    assert not s.has_work, f"stuck after {step} steps"
    cap = min(ctx, s.cache.capacity)
    for rid, r in submitted.items():
        expected, reason = reference(r.prompt_ids, r.params.max_tokens, cap)
        if rid in aborted:
            assert r.finish_reason == "abort"
            assert expected[: r.output_len] == r.output_ids
        else:
            assert (r.output_ids, r.finish_reason) == (expected, reason), f"request {rid}"
    assert len(finished) == 60 - len(aborted)
    stats = s.stats()
    print(
        f"{name}: {step} steps, {stats.num_retractions} retractions, hit rate "
        f"{stats.cache_hit_rate:.2f}, {len(aborted)} aborted, min free {engine.min_free}"
    )
    if cfg["radix"]:
        assert stats.cached_tokens > 0
    if cfg["num_slots"] < 100:  # the pool ran dry and requests had to be retracted
        assert engine.min_free < 8 and s.num_retractions > 0


def test_64_running_requests_decode_together_step_after_step():
    """The steady decode state that bench/bench_scheduler.py times (its time per step is a
    benchmark, not a test): 64 running requests, every one in every batch."""
    s = Scheduler(
        200_000, 4096, SchedulerConfig(max_num_batched_tokens=4096, max_running_requests=64)
    )
    for i in range(64):
        s.submit(
            Req(
                i,
                list(range(i * 1000, i * 1000 + 256)),
                SamplingParams(max_tokens=100_000, ignore_eos=True),
            )
        )
    while any(r.pending_len > 1 for r in s.requests.running_reqs()) or s.num_waiting:
        b = s.schedule()
        process(s, b, [[1] if e.sample else [] for e in b.entries])
    tokens = [[7]] * 64
    for _ in range(300):
        b = s.schedule()
        assert len(b.entries) == 64 and b.num_decodes == 64
        process(s, b, tokens)
    s.check_integrity()
