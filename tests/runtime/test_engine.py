"""The engine loop on a tiny random Llama with the default model's real tokenizer (49k vocab).

Greedy outputs must not depend on the radix cache, the batch composition, chunking or
retraction; faults in one request must leave the others, the cache and the engine intact.
"""

from __future__ import annotations

import threading

import pytest
import torch
from engine_testing import PROMPTS, TINY, engine_for, greedy, model, run_all, tok  # noqa: F401

from lmprog.core.errors import BackendError, ContextLengthError
from lmprog.core.sampling import SamplingParams as SP
from lmprog.fsm.guide import Guide
from lmprog.fsm.index import TokenIndex
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def eng(model, tok):
    e = engine_for(model, tok)
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def reference(eng):
    """Greedy token ids of every prompt run alone (batch 1), radix cache on."""
    return [r.token_ids for r in run_all(eng, PROMPTS, greedy(), together=False)]


def test_batch_of_16_matches_batch_1(eng, reference):
    eng.flush_cache()
    results = run_all(eng, PROMPTS, greedy())
    assert [r.token_ids for r in results] == reference
    assert all(r.finish_reason == "length" and r.completion_tokens == 12 for r in results)
    eng.check_integrity()


def test_radix_cache_off_gives_the_same_outputs(model, tok, eng, reference):
    off = engine_for(model, tok, radix=False)
    try:
        assert [r.token_ids for r in run_all(off, PROMPTS, greedy())] == reference
        assert off.stats()["cached_tokens"] == 0 and not off.stats()["radix_cache"]
    finally:
        off.shutdown()
    assert eng.stats()["cache_hit_rate"] > 0.2  # the shared head was reused


def test_prefill_first_mode_gives_the_same_outputs_and_timestamps(model, tok, reference):
    first = engine_for(model, tok, hybrid_batching=False, budget=16, max_reqs=16)
    try:
        handles = [first.submit(EngineRequest(tuple(p), greedy())) for p in PROMPTS]
        results = [h.result(timeout=120) for h in handles]
        first.check_integrity()
    finally:
        first.shutdown()
    assert [r.token_ids for r in results] == reference
    for h in handles:
        assert h.submitted_at < h.first_token_at <= h.finished_at


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap-scheduling"])
def test_tiny_pool_retracts_and_chunks_yet_outputs_match(model, tok, reference, overlap):
    # admission that reserves almost nothing for future tokens: the pool must run out
    small = engine_for(
        model,
        tok,
        slots=120,
        budget=16,
        max_reqs=16,
        init_new_token_ratio=0.02,
        min_new_token_ratio=0.02,
        overlap=overlap,
    )
    try:
        results = run_all(small, PROMPTS, greedy())
        stats = small.stats()
        small.check_integrity()
    finally:
        small.shutdown()
    assert [r.token_ids for r in results] == reference
    assert stats["num_retractions"] > 0, "the pool was meant to run out"
    assert (stats["overlapped_steps"] > 0) == overlap


def test_prefill_only_request_caches_its_prompt(eng):
    head = list(range(2000, 2040))
    r = eng.submit(EngineRequest(tuple(head), SP(max_tokens=0))).result(timeout=60)
    assert r.completion_tokens == 0 and r.finish_reason == "length" and r.text == ""
    r2 = eng.submit(EngineRequest(tuple(head + [5, 6]), greedy(2))).result(timeout=60)
    assert r2.cached_tokens == len(head)


def test_prompt_logprobs_agree_with_output_logprobs(eng):
    prompt = PROMPTS[3]
    out = eng.submit(
        EngineRequest(tuple(prompt), greedy(6, return_logprob=True, top_logprobs_num=3))
    ).result(timeout=60)
    assert all(lp.token_id == lp.top[0].token_id and len(lp.top) == 3 for lp in out.logprobs)
    full = tuple(prompt) + out.token_ids
    scored = eng.submit(
        EngineRequest(full, SP(max_tokens=0), prompt_logprob_start=len(prompt) - 1)
    ).result(timeout=60)
    assert [lp.token_id for lp in scored.prompt_logprobs] == list(out.token_ids)
    torch.testing.assert_close(
        [lp.logprob for lp in scored.prompt_logprobs],
        [lp.logprob for lp in out.logprobs],
        atol=1e-4,
        rtol=0,
    )


def test_seeded_sampling_does_not_depend_on_the_batch(eng):
    params = SP(max_tokens=10, temperature=1.0, top_k=50, seed=1234, ignore_eos=True)
    alone = eng.submit(EngineRequest(tuple(PROMPTS[0]), params)).result(timeout=60)
    others = [
        eng.submit(EngineRequest(tuple(p), SP(max_tokens=10, temperature=0.7)))
        for p in PROMPTS[1:6]
    ]
    again = eng.submit(EngineRequest(tuple(PROMPTS[0]), params))
    assert again.result(timeout=60).token_ids == alone.token_ids
    for h in others:
        h.result(timeout=60)
    other_seed = eng.submit(
        EngineRequest(
            tuple(PROMPTS[0]),
            SP(max_tokens=10, temperature=1.0, top_k=50, seed=99, ignore_eos=True),
        )
    ).result(timeout=60)
    assert other_seed.token_ids != alone.token_ids


def test_stop_token_ids_min_tokens_and_penalties(eng, reference):
    target = reference[0][3]
    first = reference[0].index(target)
    r = eng.submit(EngineRequest(tuple(PROMPTS[0]), greedy(stop_token_ids=(target,)))).result(
        timeout=60
    )
    assert r.finish_reason == "stop" and r.matched_stop == target
    assert r.token_ids == reference[0][: first + 1]
    # min_tokens bans the stop token until enough tokens are out
    late = eng.submit(
        EngineRequest(tuple(PROMPTS[0]), greedy(stop_token_ids=(target,), min_tokens=first + 2))
    ).result(timeout=60)
    assert late.completion_tokens >= first + 2
    assert target not in late.token_ids[: first + 1]
    # a strong presence penalty makes a repeating greedy output use new tokens
    pen = eng.submit(EngineRequest(tuple(PROMPTS[0]), greedy(presence_penalty=2.0))).result(
        timeout=60
    )
    assert len(set(pen.token_ids)) == len(pen.token_ids) < len(set(reference[0])) + 12


def test_abort_mid_generation(eng, reference):
    h = eng.submit(
        EngineRequest(tuple(PROMPTS[1]), SP(max_tokens=200, temperature=0.0, ignore_eos=True))
    )
    others = [eng.submit(EngineRequest(tuple(p), greedy())) for p in PROMPTS[4:8]]
    next(iter(h.pieces()))  # it is generating
    h.abort()
    r = h.result(timeout=60)
    assert r.finish_reason == "abort" and 0 < r.completion_tokens < 200
    assert [o.result(timeout=60).token_ids for o in others] == reference[4:8]
    eng.check_integrity()


class BrokenGuide(Guide):
    """A guide whose advance fails after two tokens (a constraint bug)."""

    def advance(self, token_id: int) -> None:
        if self.num_tokens >= 2:
            raise RuntimeError("guide exploded")
        super().advance(token_id)


def test_faults_fail_only_their_request(eng, tok, reference):
    index = TokenIndex.get(r"[a-z ]{1,40}", tok)
    broken = BrokenGuide(index)
    # the pattern's only token is also a stop token that min_tokens bans: the sampler has
    # nothing to draw for that row
    (x,) = tok.encode("x", add_special_tokens=False)
    starved = TokenIndex.get(r"x", tok).new_guide()
    bad = [
        eng.submit(EngineRequest(tuple(PROMPTS[2]), greedy(20), guide=broken)),
        eng.submit(
            EngineRequest(
                tuple(PROMPTS[2]),
                SP(max_tokens=20, min_tokens=10, stop_token_ids=(x,), temperature=0.0),
                guide=starved,
            )
        ),
    ]
    good = [eng.submit(EngineRequest(tuple(p), greedy())) for p in PROMPTS[8:12]]
    with pytest.raises(RuntimeError, match="guide exploded"):
        bad[0].result(timeout=60)
    with pytest.raises(ValueError, match="no token left"):
        bad[1].result(timeout=60)
    assert [g.result(timeout=60).token_ids for g in good] == reference[8:12]
    eng.check_integrity()
    assert eng.stats()["requests_finished"]["error"] >= 2
    assert (
        eng.submit(EngineRequest(tuple(PROMPTS[8]), greedy())).result(timeout=60).token_ids
        == reference[8]
    )


def held_engine(engine):
    """Hold the engine thread between steps until the returned event is set, so that
    everything submitted meanwhile is admitted at once, in one step."""
    release, held = threading.Event(), threading.Event()

    def hold():
        held.set()
        release.wait(60)

    threading.Thread(target=engine.call, args=(hold,), daemon=True).start()
    assert held.wait(60)
    return release


def test_an_internal_error_fails_the_started_requests_and_the_engine_serves_on(
    model, tok, reference
):
    eng = engine_for(model, tok, max_reqs=2)
    try:
        calls = [0]
        process = eng.scheduler.process_results

        def planted(*args, **kwargs):  # an engine bug in the third step
            calls[0] += 1
            if calls[0] == 3:
                raise RuntimeError("planted bookkeeping bug")
            return process(*args, **kwargs)

        eng.scheduler.process_results = planted
        release = held_engine(eng)
        handles = [eng.submit(EngineRequest(tuple(p), greedy())) for p in PROMPTS[:4]]
        release.set()
        for h in handles[:2]:  # running when it struck: failed, with the cause named
            with pytest.raises(BackendError, match="internal error.*planted bookkeeping bug"):
                h.result(timeout=60)
        # the two that had not started (two rows only) run on the reset engine
        assert [h.result(timeout=60).token_ids for h in handles[2:]] == reference[2:4]
        stats = eng.stats()
        assert stats["internal_errors"] == 1 and stats["requests_finished"]["error"] == 2
        eng.check_integrity()
        assert (
            eng.submit(EngineRequest(tuple(PROMPTS[0]), greedy())).result(timeout=60).token_ids
            == reference[0]
        )
        assert eng.alive and eng.stats()["kv_used"] == eng.stats()["kv_evictable"]
    finally:
        eng.shutdown()


def test_bad_input_raises_at_submission(eng):
    with pytest.raises(ContextLengthError, match="context length"):
        eng.submit(EngineRequest(tuple(range(5, 5 + TINY.max_position)), greedy()))
    with pytest.raises(ValueError):
        EngineRequest((), greedy())
    with pytest.raises(ValueError):
        SP(temperature=-1.0)
    assert eng.alive


def test_pool_smaller_than_prompt_is_rejected(model, tok):
    small = engine_for(model, tok, slots=40, budget=16, max_reqs=4)
    try:
        with pytest.raises(ContextLengthError, match="KV pool"):
            small.submit(EngineRequest(tuple(range(5, 60)), greedy()))
        assert (
            small.submit(EngineRequest(tuple(range(5, 20)), greedy(4)))
            .result(timeout=60)
            .completion_tokens
            == 4
        )
    finally:
        small.shutdown()


def test_constraint_with_jump_forward(eng, tok):
    pattern = r"The answer is (yes|no)\. Confidence: [0-9]{2}%"
    index = TokenIndex.get(pattern, tok)
    texts = {}
    for jump in (True, False):
        eng.config = EngineConfig(jump_forward=jump, check_integrity=True)
        try:
            before = eng.stats()["jump_forward_tokens"]
            r = eng.submit(
                EngineRequest(tuple(PROMPTS[5]), greedy(40), guide=index.new_guide())
            ).result(timeout=60)
            jumped = eng.stats()["jump_forward_tokens"] - before
        finally:
            eng.config = EngineConfig(check_integrity=True)
        assert index.vocab.decode(list(r.token_ids)).decode() == r.text
        assert r.finish_reason == "stop"
        texts[jump] = r.text
        assert (jumped > 0) == jump
    import re

    assert all(re.fullmatch(pattern, t) for t in texts.values()), texts
    cut = eng.submit(EngineRequest(tuple(PROMPTS[5]), greedy(3), guide=index.new_guide())).result(
        timeout=60
    )
    assert cut.finish_reason == "length" and "max_tokens" in cut.message


def test_stats_and_clean_shutdown(model, tok):
    e = engine_for(model, tok)
    r = e.submit(EngineRequest(tuple(PROMPTS[0]), greedy(5))).result(timeout=60)
    stats = e.stats()
    for key in (
        "cache_hit_rate",
        "gen_tokens_per_s",
        "num_running",
        "num_waiting",
        "kv_usage",
        "num_retractions",
        "generated_tokens",
        "requests_finished",
    ):
        assert key in stats
    assert stats["generated_tokens"] >= r.completion_tokens and stats["num_running"] == 0
    pending = e.submit(EngineRequest(tuple(PROMPTS[1]), SP(max_tokens=200, ignore_eos=True)))
    e.shutdown()
    assert not e.alive
    assert not any(
        t.name == "lmprog-engine" and t.is_alive() and t is e._thread for t in threading.enumerate()
    )
    try:
        out = pending.result(timeout=10)
    except BackendError as exc:
        assert "shut down" in str(exc)
    else:  # it finished before the stop arrived
        assert out.completion_tokens == 200
    with pytest.raises(BackendError, match="shut down"):
        e.submit(EngineRequest(tuple(PROMPTS[0]), greedy()))
    e.shutdown()  # idempotent


def test_a_stopped_engine_lets_its_kv_pool_go(model, tok):
    """A Runtime made next in the process sizes its pool from the free device memory: the
    stopped engine's pool and table are dropped (the engine still answers stats())."""
    import gc
    import weakref

    e = engine_for(model, tok)
    e.submit(EngineRequest(tuple(PROMPTS[0]), greedy(3))).result(timeout=60)
    pool, table = weakref.ref(e.runner.kv), weakref.ref(e.runner.req_to_token)
    e.shutdown()
    gc.collect()
    assert pool() is None and table() is None
    assert e.stats()["generated_tokens"] >= 3


def test_random_mix_under_memory_pressure_leaves_no_trace(model, tok):
    """Mixed parameters, constraints, prompt logprobs and random aborts on a pool that must
    retract: every request ends, the bookkeeping holds after each step, nothing leaks."""
    import random

    rng = random.Random(7)
    index = TokenIndex.get(r"[a-z]{2,6}( [a-z]{2,6}){1,3}\.", tok)
    e = engine_for(
        model,
        tok,
        slots=100,
        budget=48,
        max_reqs=12,
        init_new_token_ratio=0.02,
        min_new_token_ratio=0.02,
    )
    try:
        handles = []
        for i in range(30):
            prompt = tuple(PROMPTS[i % 16][: rng.randint(3, 20)])
            params = SP(
                max_tokens=rng.randint(2, 40),
                temperature=rng.choice([0.0, 0.8]),
                top_p=rng.choice([1.0, 0.9]),
                seed=rng.choice([None, i]),
                frequency_penalty=rng.choice([0.0, 0.5]),
                min_tokens=rng.choice([0, 2]),
                return_logprob=rng.random() < 0.3,
            )
            guide = index.new_guide() if i % 5 == 0 else None
            start = rng.randint(0, len(prompt) - 1) if i % 7 == 0 else None
            handles.append(e.submit(EngineRequest(prompt, params, guide, start)))
            if rng.random() < 0.3:
                handles[rng.randrange(len(handles))].abort()
        results = [h.result(timeout=120) for h in handles]
        assert {r.finish_reason for r in results} <= {"stop", "length", "abort"}
        assert all(r.completion_tokens == len(r.token_ids) for r in results)
        e.check_integrity()
        stats = e.stats()
        assert stats["num_running"] == stats["num_waiting"] == 0
        assert stats["kv_used"] == stats["kv_evictable"]  # only the prefix cache holds slots
        assert stats["num_retractions"] > 0
    finally:
        e.shutdown()


def test_context_fills_during_generation(eng):
    prompt = tuple(range(5000, 5000 + TINY.max_position - 5))
    r = eng.submit(EngineRequest(prompt, greedy(20))).result(timeout=60)
    assert r.finish_reason == "length" and r.completion_tokens == 5 and "context" in r.message


def test_engine_config_checks_its_knobs():
    for bad in ({"jump_forward": 1}, {"check_integrity": "yes"}):
        with pytest.raises(TypeError, match=f"{next(iter(bad))} must be a bool"):
            EngineConfig(**bad)
    with pytest.raises(TypeError, match="overlap must be a bool or None"):
        EngineConfig(overlap=0)
    assert EngineConfig(overlap=None).overlap is None
