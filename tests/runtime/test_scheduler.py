"""Scheduler on plain data: budget, chunking, ordering, retraction, abort, rejection, verify."""

import numpy as np
import pytest
from sched_testing import append_outputs, process, rewrite

from lmprog.core.errors import ContextLengthError
from lmprog.core.sampling import SamplingParams
from lmprog.runtime.cache import IntegrityError
from lmprog.runtime.config import CacheConfig, SchedulerConfig
from lmprog.runtime.request import Req, ReqStatus
from lmprog.runtime.scheduler import Scheduler


def make(num_slots=256, ctx=128, budget=16, max_reqs=8, page=1, radix=True, **kw):
    return Scheduler(
        num_slots,
        ctx,
        SchedulerConfig(max_num_batched_tokens=budget, max_running_requests=max_reqs, **kw),
        CacheConfig(page_size=page, radix_cache=radix),
    )


def req(rid, prompt, max_tokens=4, **kw):
    return Req(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), **kw)


def next_token(r):
    """A deterministic 'model': the next token depends on the whole sequence."""
    return (sum(r.token_ids) * 31 + len(r.token_ids)) % 1000


def step(s, reasons=None):
    batch = s.schedule()
    toks = [[next_token(e.req)] if e.sample else [] for e in batch.entries]
    finished = process(s, batch, toks, reasons)
    s.check_integrity()
    return batch, finished


def run(s, max_steps=1000):
    done = []
    for _ in range(max_steps):
        if not s.has_work:
            return done
        done += step(s)[1]
    raise AssertionError("requests did not finish")


def expected_output(prompt, n):
    r = Req("x", prompt, SamplingParams())
    for _ in range(n):
        r.token_ids.append(next_token(r))
    return r.output_ids


def test_one_prompt_is_chunked_and_samples_on_the_last_chunk_only():
    s = make(budget=16)
    r = s.submit(req("a", list(range(100, 140)), max_tokens=3))
    shapes = []
    for _ in range(3):
        batch, _ = step(s)
        (e,) = batch.entries
        shapes.append((e.start, e.num_new, e.sample, e.logits_from))
        assert batch.positions.tolist() == list(range(e.start, e.end))
        assert np.array_equal(batch.out_slots, s.req_to_token[e.row, e.start : e.end])
    assert shapes == [(0, 16, False, None), (16, 16, False, None), (32, 8, True, 39)]
    assert r.output_len == 1 and r.num_computed == 40
    run(s)
    assert r.finish_reason == "length" and r.output_ids == expected_output(list(range(100, 140)), 3)


def test_budget_serves_all_decodes_and_fills_the_rest_with_a_prefill_chunk():
    s = make(budget=16)
    decoding = [s.submit(req(i, [i + 1, i + 2], max_tokens=50)) for i in range(3)]
    step(s)  # three short prefills in one step
    assert all(r.output_len == 1 for r in decoding)
    long = s.submit(req("long", list(range(500, 540)), max_tokens=2))
    chunks = []
    while long.output_len == 0:
        batch, _ = step(s)
        decodes = [e for e in batch.entries if e.req in decoding]
        assert len(decodes) == 3 and all(e.num_new == 1 and e.sample for e in decodes)
        (chunk,) = [e for e in batch.entries if e.req is long]
        chunks.append(chunk.num_new)
        assert batch.num_tokens == sum(e.num_new for e in batch.entries) <= 16
    assert chunks == [13, 13, 13, 1]
    run(s)
    assert [r.output_ids for r in decoding] == [
        expected_output([i + 1, i + 2], 50) for i in range(3)
    ]


def test_prefill_first_mode_pauses_decodes_while_prompts_are_pending():
    s = make(budget=16, hybrid_batching=False)
    decoding = [s.submit(req(i, [i + 1, i + 2], max_tokens=50)) for i in range(3)]
    step(s)
    long = s.submit(req("long", list(range(500, 540)), max_tokens=2))
    kinds = []
    while long.output_len == 0:
        batch, _ = step(s)
        assert [e.req for e in batch.entries] == [long]
        kinds.append(batch.entries[0].num_new)
    assert kinds == [16, 16, 8]  # the whole budget goes to the prompt; decodes waited
    assert all(r.output_len == 1 for r in decoding)
    batch, _ = step(s)  # nothing left to prefill: everyone decodes together
    assert sorted(e.num_new for e in batch.entries) == [1, 1, 1, 1]
    run(s)
    assert [r.output_ids for r in decoding] == [
        expected_output([i + 1, i + 2], 50) for i in range(3)
    ]
    with pytest.raises(TypeError, match="hybrid_batching must be a bool"):
        SchedulerConfig(hybrid_batching=1)


def test_lpm_prefers_cached_prefixes_and_falls_back_to_fcfs_on_a_long_queue():
    shared = list(range(300, 340))
    for lpm_max_queue, first in ((8, "b"), (1, "a")):
        s = make(max_reqs=1, budget=64, lpm_max_queue=lpm_max_queue)
        s.submit(req("warm", shared + [1], max_tokens=1))
        run(s)
        a = s.submit(req("a", [7, 8, 9], max_tokens=1))
        b = s.submit(req("b", shared + [2], max_tokens=1))
        ordered, lpm = s.prefill_policy.order(s.requests.waiting)
        assert lpm == (lpm_max_queue == 8)
        assert [r.rid for r, _ in ordered] == [first, {"a": "b", "b": "a"}[first]]
        batch, _ = step(s)
        assert [e.req.rid for e in batch.entries] == [first]
        run(s)
        assert b.cached_tokens == 40 and a.cached_tokens == 0


def test_fcfs_policy_ignores_the_cache():
    s = make(max_reqs=1, budget=64, schedule_policy="fcfs")
    s.submit(req("warm", list(range(40)), max_tokens=1))
    run(s)
    s.submit(req("a", [7, 8, 9], max_tokens=1))
    s.submit(req("b", list(range(40)) + [5], max_tokens=1))
    assert [e.req.rid for e in step(s)[0].entries] == ["a"]


@pytest.mark.parametrize("stagger", [32, 0])
def test_requests_sharing_an_uncached_prefix_are_staggered(stagger):
    s = make(budget=64, stagger_min_tokens=stagger)
    shared = list(range(1000, 1100))  # longer than one step's budget
    a = s.submit(req("a", shared + [1], max_tokens=2))
    b = s.submit(req("b", shared + [2], max_tokens=2))
    step(s)  # a takes the whole budget: 64 of the 100 shared tokens
    step(s)  # a finishes its prompt; b would recompute 36 shared tokens unless it waits
    run(s)
    if stagger:
        assert b.cached_tokens == 100  # the shared prefix was computed once
    else:
        assert b.cached_tokens == 64
    assert a.output_ids == expected_output(shared + [1], 2)
    assert b.output_ids == expected_output(shared + [2], 2)


def test_tiny_pool_retracts_and_resumes_until_everything_finishes():
    s = make(num_slots=48, budget=16, max_reqs=4)
    prompts = {i: [i * 10 + j for j in range(10)] for i in range(4)}
    reqs = [s.submit(req(i, p, max_tokens=20)) for i, p in prompts.items()]
    done = run(s)
    assert {r.rid for r in done} == set(prompts)
    assert s.num_retractions > 0 and any(r.num_retractions for r in reqs)
    for r in reqs:
        assert r.finish_reason == "length" and r.status is ReqStatus.FINISHED
        assert r.output_ids == expected_output(prompts[r.rid], 20)  # no token lost or repeated
    assert s.cache.allocator.num_free + s.cache.prefix_cache.evictable_size == 48


def test_retraction_takes_the_newest_request_first():
    # an optimistic admission (no reserve for future tokens) must be repaired by retraction
    s = make(num_slots=40, budget=32, max_reqs=4, init_new_token_ratio=0.0, min_new_token_ratio=0.0)
    old = s.submit(req("old", list(range(10)), max_tokens=30))
    new = s.submit(req("new", list(range(50, 60)), max_tokens=30))
    retracted = []
    while old.status is not ReqStatus.FINISHED:
        retracted += [r.rid for r in step(s)[0].retracted]
    assert retracted and set(retracted) == {"new"}
    run(s)
    assert new.output_ids == expected_output(list(range(50, 60)), 30)


def test_cached_prefixes_are_evicted_before_anything_is_retracted():
    s = make(num_slots=64, budget=64, max_reqs=4)
    for i in range(4):
        s.submit(req(i, [i * 100 + j for j in range(14)], max_tokens=1))
    run(s)
    assert s.cache.prefix_cache.evictable_size == 56  # 14 computed tokens each stay cached
    r = s.submit(req("big", list(range(500, 540)), max_tokens=10))
    run(s)
    assert s.num_retractions == 0 and r.finish_reason == "length"
    assert s.cache.prefix_cache.evictable_size <= 64


def test_abort_waiting_running_and_mid_step():
    s = make(budget=8, max_reqs=2)
    a = s.submit(req("a", list(range(20)), max_tokens=50))
    b = s.submit(req("b", list(range(30, 50)), max_tokens=50))
    c = s.submit(req("c", [1, 2, 3], max_tokens=50))
    step(s)
    assert a.status is ReqStatus.RUNNING and c.status is ReqStatus.WAITING
    assert s.abort("c") is c and c.finish_reason == "abort" and s.requests.waiting == [b]
    assert s.abort("nope") is None
    s.abort("a")  # running, mid-prefill
    assert a.row is None and a.finish_reason == "abort"
    s.check_integrity()
    batch = s.schedule()  # b is in this step...
    s.abort("b")  # ...and aborted before its results come back
    process(s, batch, [[1] if e.sample else [] for e in batch.entries])
    s.check_integrity()
    assert not s.has_work and b.output_len == 0
    assert s.finish(b, "stop") is False  # already finished: a no-op


def test_oversized_prompts_are_rejected_at_submission():
    s = make(num_slots=64, ctx=32)
    with pytest.raises(ContextLengthError, match=r"32 tokens.*context length of 32"):
        s.submit(req("a", list(range(32))))
    s2 = make(num_slots=20, ctx=128)
    with pytest.raises(ContextLengthError, match=r"20 tokens.*KV pool of 20"):
        s2.submit(req("b", list(range(20))))
    s2.submit(req("c", list(range(19))))  # prompt + 1 fits exactly
    with pytest.raises(ValueError, match="already in use"):
        s2.submit(req("c", [1]))
    assert s.num_waiting == 0 and s2.num_waiting == 1


def test_resubmission_and_bad_results_are_rejected():
    s = make()
    r = s.submit(req("a", [1, 2, 3]))
    with pytest.raises(ValueError, match="submitted before"):
        s.submit(r)
    batch = s.schedule()
    with pytest.raises(ValueError, match="one finish reason per batch entry"):
        s.process_results(batch, [])
    with pytest.raises(ValueError, match="one placeholder tuple per batch entry"):
        s.process_launched(batch, [])


def test_output_length_is_capped_by_the_context():
    s = make(num_slots=256, ctx=16)
    r = s.submit(req("a", list(range(10)), max_tokens=100))
    run(s)
    assert r.seq_len == 16 and r.finish_reason == "length"


def test_engine_finish_reasons_end_requests_and_cache_their_tokens():
    s = make()
    r = s.submit(req("a", [5, 6, 7, 8], max_tokens=10))
    step(s)
    step(s, reasons=["stop"])
    assert r.finish_reason == "stop" and r.output_len == 2
    assert s.cache.prefix_cache.cached_prefix_len(r.token_ids) == 5  # computed tokens kept


def test_prefill_only_request_caches_its_prompt_for_the_next_one():
    s = make(budget=32)
    p = s.submit(req("prefix", list(range(20)), max_tokens=0))
    batch, finished = step(s)
    assert not batch.entries[0].sample and finished == [p] and p.finish_reason == "length"
    q = s.submit(req("q", list(range(20)) + [99], max_tokens=1))
    run(s)
    assert q.cached_tokens == 20


def test_prompt_logprobs_request_logits_and_are_never_served_from_cache():
    s = make(budget=8)
    s.submit(req("warm", list(range(12)), max_tokens=1))
    run(s)
    r = s.submit(req("lp", list(range(12)), max_tokens=1, prompt_logprob_start=4))
    batch, _ = step(s)
    (e,) = batch.entries
    assert (e.start, e.num_new, e.logits_from, e.sample) == (4, 8, 4, True)  # hit stops at 4
    assert batch.logits_indices().tolist() == list(range(8))
    run(s)
    assert r.cached_tokens == 4


def test_verify_tokens_accept_a_prefix_of_the_drafts_and_free_the_rest():
    s = make(budget=16)
    r = s.submit(req("a", [1, 2, 3], max_tokens=10))
    step(s)
    free_before = s.cache.allocator.num_free
    good = next_token(r)
    r.draft_ids = [good, 4242, 7]
    batch = s.schedule()
    (e,) = batch.entries
    assert (e.num_new, e.draft_ids, e.sample) == (4, (good, 4242, 7), True)
    assert e.input_ids() == [r.token_ids[-1], good, 4242, 7]
    assert e.logits_from == e.start and batch.logits_indices().tolist() == [0, 1, 2, 3]
    assert s.cache.allocator.num_free == free_before - 4
    r2 = Req("probe", r.token_ids + [good], SamplingParams())
    bonus = next_token(r2)
    process(s, batch, [[good, bonus]])  # first draft accepted, second rejected
    s.check_integrity()
    assert r.output_ids[-2:] == [good, bonus] and r.num_computed == r.seq_len - 1
    assert s.cache.allocator.num_free == free_before - 2  # rejected drafts' slots came back
    assert r.draft_ids == []
    run(s)
    assert r.output_ids == expected_output([1, 2, 3], 10)


def test_a_rewritten_tail_loses_its_kv_at_the_next_results():
    s = make()
    r = s.submit(req("a", [1, 2, 3], max_tokens=20))
    for _ in range(6):
        step(s)
    assert r.output_len == 6 and r.num_computed == 8
    batch = s.schedule()
    append_outputs(batch, [[next_token(r)]])
    rewrite(r, 5, [77, 78])  # a jump-forward re-tokenized the tail mid-step
    assert r.token_ids[5:] == [77, 78] and r.rewritten_from == 5
    s.process_results(batch)
    assert r.num_computed == 5 and r.rewritten_from is None
    s.check_integrity()
    batch, _ = step(s)
    assert (batch.entries[0].start, batch.entries[0].num_new) == (5, 2)
    with pytest.raises(ValueError, match="cannot rewrite"):
        rewrite(r, 1, [])
    run(s)
    assert r.output_len == 20


def test_paged_pool_runs_and_keeps_rows_page_aligned():
    s = make(num_slots=64, budget=8, page=4, max_reqs=4)
    reqs = [s.submit(req(i, [i * 50 + j for j in range(9)], max_tokens=12)) for i in range(4)]
    run(s)
    for r in reqs:
        assert r.output_ids == expected_output(r.prompt_ids, 12)
    assert s.cache.prefix_cache.total_size % 4 == 0


def test_radix_off_frees_everything_and_never_hits():
    s = make(radix=False)
    for i in range(3):
        s.submit(req(i, [1, 2, 3, 4, 5, 6], max_tokens=3))
    run(s)
    stats = s.stats()
    assert stats.cached_tokens == 0 and stats.used_slots == 0 and stats.prompt_tokens == 18


def test_flush_cache_only_when_idle():
    s = make()
    s.submit(req("a", [1, 2, 3, 4], max_tokens=2))
    step(s)
    assert s.flush_cache() is False
    run(s)
    assert s.cache.prefix_cache.total_size > 0
    assert s.flush_cache() is True and s.cache.allocator.num_free == 256


def test_whole_system_integrity_catches_planted_corruption():
    s = make()
    a = s.submit(req("a", list(range(10)), max_tokens=20))
    s.submit(req("b", list(range(10)) + [99], max_tokens=20))
    for _ in range(3):
        step(s)
    s.check_integrity()
    leaked = s.cache.allocator.alloc(1)  # a slot nobody owns
    with pytest.raises(IntegrityError, match="leaked"):
        s.check_integrity()
    s.cache.allocator.free(leaked)
    s.check_integrity()
    row = s.req_to_token[a.row]
    saved = row[a.cache_len]
    row[a.cache_len] = s.cache.prefix_cache.all_slots()[0]  # own slot aliases a cached one
    with pytest.raises(IntegrityError, match="held twice"):
        s.check_integrity()
    row[a.cache_len] = saved
    row[0] = saved  # the locked prefix no longer matches the tree
    with pytest.raises(IntegrityError, match="locked cache path"):
        s.check_integrity()


def test_bookkeeping_modules_import_no_model_kernel_or_torch_code():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "lmprog" / "runtime"
    files = [
        root / "config.py",
        root / "request.py",
        *(root / "cache").glob("*.py"),
        *(root / "scheduler").glob("*.py"),
    ]
    banned = {"models", "layers", "kernels", "engine", "model_runner", "kv_pool", "forward_batch"}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] != "torch", f"{path.name} imports {name}"
                assert not set(name.split(".")) & banned, f"{path.name} imports {name}"
