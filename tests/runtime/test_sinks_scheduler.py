"""Attention sinks' bookkeeping on plain data: evictions after the sinks, the KV moves, the
prefix cache, long prompts, overlap placeholders, drafts, and the option off.

A fake pool stands for the device: each slot holds the (token, position) written there,
and a step's KV moves shift positions down by their delta. After every step the rows of the
running requests must read (token_ids[j], j) at every computed position j, and every path of
the prefix cache its own tokens at their positions (its keys never rotated)."""

import numpy as np
import pytest
from sched_testing import append_outputs, resolve, rewrite

from lmprog.core.errors import ContextLengthError
from lmprog.core.sampling import SamplingParams
from lmprog.runtime.config import AttentionSinkConfig, CacheConfig, SchedulerConfig
from lmprog.runtime.request import Req
from lmprog.runtime.scheduler import Scheduler

SINKS, WINDOW, SHIFT = 4, 28, 8
LIMIT = SINKS + WINDOW


def make(num_slots=256, ctx=64, budget=16, max_reqs=8, page=1, sinks=(SINKS, WINDOW, SHIFT)):
    return Scheduler(
        num_slots,
        ctx,
        SchedulerConfig(max_num_batched_tokens=budget, max_running_requests=max_reqs),
        CacheConfig(page_size=page),
        None if sinks is None else AttentionSinkConfig(*sinks),
    )


def req(rid, prompt, max_tokens, **kw):
    return Req(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), **kw)


def next_token(r):
    return (sum(r.token_ids[-8:]) * 31 + len(r.token_ids)) % 1000


class Harness:
    """Steps a scheduler like the engine would, with the fake pool; records every request's
    whole sequence (`full`) and every KV move."""

    def __init__(self, s):
        self.s, self.kv, self.full, self.shifts = s, {}, {}, []

    def submit(self, r):
        self.full[r.rid] = list(r.token_ids)
        return self.s.submit(r)

    def step(self, rewrite_last=0):
        s = self.s
        batch = s.schedule()
        if batch.kv_shift is not None:
            src, dst, delta = batch.kv_shift
            moved = [(self.kv[a][0], self.kv[a][1] - d) for a, d in zip(src.tolist(), delta)]
            self.kv.update(zip(dst.tolist(), moved))
            self.shifts.append(batch.kv_shift)
        ids = batch.input_ids().tolist()
        for slot, pos, t in zip(batch.out_slots.tolist(), batch.positions.tolist(), ids):
            self.kv[slot] = (t, pos)
        assert batch.positions.max(initial=0) < (LIMIT if s.sinks else s.max_context_len)
        toks = [[next_token(e.req)] if e.sample else [] for e in batch.entries]
        for e, t in zip(batch.entries, toks):
            self.full[e.req.rid] += t
        append_outputs(batch, toks)
        if rewrite_last:  # a jump-forward rewrites the last tokens, mid-step
            (e,) = batch.entries
            keep = e.req.seq_len - rewrite_last
            rewrite(e.req, keep, [9, 8, 7, 6])
            self.full[e.req.rid] = self.full[e.req.rid][: keep + e.req.num_evicted] + [9, 8, 7, 6]
        finished = s.process_results(batch)
        s.check_integrity()
        self.check()
        return batch, finished

    def run(self, max_steps=3000):
        for _ in range(max_steps):
            if not self.s.has_work:
                return
            self.step()
        raise AssertionError("requests did not finish")

    def check(self):
        s = self.s
        for r in s.requests.running_reqs():
            row = s.req_to_token[r.row].tolist()
            got = [self.kv[row[j]] for j in range(r.num_computed)]
            assert got == [(t, j) for j, t in enumerate(r.token_ids[: r.num_computed])], r
            full = self.full[r.rid]
            assert r.token_ids == full[:SINKS] + full[SINKS + r.num_evicted :] or (
                not r.num_evicted and r.token_ids == full
            )
        stack = [(s.cache.prefix_cache.root, 0, [])]
        while stack:  # every cached path: its tokens at their positions, a prefix of a full
            node, depth, path = stack.pop()  # sequence (never a shifted one)
            for child in node.children.values():
                keys = path + list(child.key)
                for i, (t, slot) in enumerate(zip(child.key, child.slots.tolist())):
                    assert self.kv[slot] == (t, depth + i)
                assert any(f[: len(keys)] == keys for f in self.full.values())
                stack.append((child, depth + len(child.key), keys))


@pytest.mark.parametrize("page", [1, 2])
def test_decoding_past_the_context_evicts_in_chunks_and_keeps_the_kv_bounded(page):
    s = make(page=page)
    h = Harness(s)
    r = h.submit(req("a", list(range(100, 120)), max_tokens=200))
    assert r.max_seq_len > 10**9 and r.stop_len == 220  # not cut at the context of 64
    most = 0
    while s.has_work:
        h.step()
        most = max(most, r.num_allocated)
    assert r.finish_reason == "length" and r.output_len == 200
    assert most == LIMIT  # flat: never more than sinks + window
    assert r.num_evicted == 220 - len(r.token_ids) and r.num_evicted % SHIFT == 0
    assert all(set(sh.delta.tolist()) == {SHIFT} for sh in h.shifts)
    # the request's own slots are rotated in place; only its cached prompt was copied out
    first, later = h.shifts[0], h.shifts[1:]
    assert all(np.array_equal(sh.src, sh.dst) for sh in later)
    cached = len(first.src) - int(np.sum(first.src == first.dst))
    assert cached == 20 - SINKS - SHIFT  # prompt positions 12..19, inserted after prefill
    assert s.stats().evicted_tokens == r.num_evicted
    assert r.prompt_end == SINKS and r.output_ids == r.token_ids[SINKS:]


def test_the_prompt_cached_before_the_first_eviction_is_shared_and_never_rotated():
    s = make(budget=64)
    h = Harness(s)
    prompt = list(range(500, 520))
    a = h.submit(req("a", prompt + [1], max_tokens=100))
    h.run()
    assert a.num_evicted > 0
    # after a's shifted finish the cache holds its prompt (cached before the first eviction)
    assert s.cache.prefix_cache.cached_prefix_len(a.token_ids) == SINKS
    assert s.cache.prefix_cache.cached_prefix_len(prompt + [1]) == 21
    b = h.submit(req("b", prompt + [2], max_tokens=60))
    c = h.submit(req("c", prompt + [3], max_tokens=60))
    h.run()
    assert b.cached_tokens == c.cached_tokens == 20
    assert b.num_evicted and c.num_evicted


def test_a_full_pool_retracts_to_copy_a_cached_prefix_and_everything_finishes():
    s = make(num_slots=80, budget=64, max_reqs=4)
    h = Harness(s)
    shared = list(range(300, 326))
    reqs = [h.submit(req(i, shared + [i], max_tokens=70)) for i in range(4)]
    h.run()
    assert all(r.finish_reason == "length" and r.output_len == 70 for r in reqs)
    assert s.num_retractions > 0  # 4 windows of 32 do not fit 80 slots at once


def test_a_prompt_longer_than_the_window_and_the_context_streams_in_chunks():
    s = make(budget=16)
    h = Harness(s)
    prompt = [7 + (i * 13) % 900 for i in range(150)]  # past the context of 64
    s.check_fits(150)  # no ContextLengthError with sinks
    r = h.submit(req("long", prompt, max_tokens=5))
    chunks = []
    while s.has_work:
        batch, _ = h.step()
        chunks += [e.num_new for e in batch.entries]
    assert r.output_len == 5 and r.finish_reason == "length"
    assert max(chunks) <= 16 and r.output_ids == h.full["long"][-5:]
    assert r.prompt_end == len(r.token_ids) - 5  # the prompt's head: its sinks and its tail
    assert r.prompt_len == 150 and r.num_evicted == 155 - len(r.token_ids)


def test_prompt_logprobs_need_the_prompt_inside_the_window():
    s = make()
    with pytest.raises(ContextLengthError, match="attention-sink window"):
        s.submit(req("x", list(range(40)), max_tokens=1, prompt_logprob_start=3))
    h = Harness(s)
    r = h.submit(req("y", list(range(20)), max_tokens=40, prompt_logprob_start=3))
    batch, _ = h.step()
    assert batch.entries[0].logits_from == 3
    h.run()
    assert r.num_evicted and r.prompt_logprob_start is None  # never re-reported shifted


def test_overlap_placeholders_resolve_at_their_shifted_index():
    s = make()
    h = Harness(s)
    r = h.submit(req("a", list(range(10)), max_tokens=100))
    while r.num_computed < LIMIT - 1:
        h.step()
    prev = s.schedule()  # feeds position LIMIT - 1; its token stays on the "device"
    assert s.process_launched(prev, [(-1,)]) == []
    nxt = s.schedule()  # the window is full: evicts SHIFT tokens before feeding the placeholder
    assert nxt.kv_shift is not None and r.num_evicted == SHIFT
    assert r.token_ids[-1] == -1 and prev.entries[0].end == LIMIT
    assert resolve(s, prev, [(42,)], [None]) == []
    assert r.token_ids[-1] == 42 and r.token_ids[LIMIT - SHIFT] == 42


def test_verify_drafts_stop_at_the_window_and_a_rewrite_after_eviction_is_recomputed():
    s = make(budget=32)
    h = Harness(s)
    r = h.submit(req("a", list(range(10)), max_tokens=200))
    while r.num_computed < LIMIT - 3:
        h.step()
    r.draft_ids = [1, 2, 3, 4, 5]
    batch, _ = h.step()
    (e,) = batch.entries
    assert e.num_new == 3 and e.draft_ids == (1, 2)  # the pending token + 2 drafts fill it
    while not r.num_evicted:
        h.step()
    h.step(rewrite_last=3)  # a jump-forward rewrites the last tokens after an eviction
    h.run()
    assert r.output_len == 200 and r.finish_reason == "length"


def test_without_sinks_requests_are_refused_and_cut_at_the_context_as_before():
    s = make(sinks=None)
    with pytest.raises(ContextLengthError, match="context length of 64"):
        s.submit(req("x", list(range(80)), max_tokens=5))
    h = Harness(s)
    r = h.submit(req("a", list(range(10)), max_tokens=200))
    assert r.max_seq_len == 64 and r.stop_len == 64
    h.run()
    assert r.finish_reason == "length" and r.output_len == 54 and not h.shifts
    assert r.num_evicted == 0 and r.output_ids == h.full["a"][10:]


def test_config_validation():
    with pytest.raises(ValueError, match="must be smaller than"):
        AttentionSinkConfig(4, 16, 16)
    with pytest.raises(TypeError, match="attention_sink_size must be an int"):
        AttentionSinkConfig(4.0)
    with pytest.raises(ValueError, match="must be at most 64"):
        make(sinks=(4, 61, 8))
    with pytest.raises(ValueError, match="whole pages"):
        make(page=4, sinks=(2, 28, 8))
    assert make(sinks=(4, None, None)).sinks.limit == 64  # the window fills the context
    assert make(num_slots=40, sinks=(4, None, None)).sinks.limit == 40  # or the pool
    assert make(sinks=(4, None, None)).sinks.shift == 15
