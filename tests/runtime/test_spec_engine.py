"""Speculative decoding through the engine, on a tiny random Llama with the default model's
real tokenizer (as test_engine.py): outputs identical with speculation on and off, under
batching, retraction, constraints, stop strings and seeds; bookkeeping checked every step."""

from __future__ import annotations

import re
from dataclasses import replace

import engine_testing
import pytest
import torch
from engine_testing import EOS, PROMPTS, engine_for, greedy, random_llama, run_all, tok  # noqa: F401
from greedy_agreement import assert_greedy_agrees, top2_logprobs
from spec_testing import Oracle

from lmprog.core.sampling import SamplingParams as SP
from lmprog.fsm.index import TokenIndex
from lmprog.runtime.config import CacheConfig
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.speculative import Proposer, SpeculativeConfig

torch.set_num_threads(1)
TINY = replace(engine_testing.TINY, max_position=512)
# fp32: paths with other batch shapes (chunked re-prefill, verify vs decode, batch 16 vs 1)
# differ by up to ~2e-5 in a logprob (measured); top-2 gaps below this may flip between them
NEAR_TIE = 1e-3


@pytest.fixture(scope="module")
def model():
    """Random weights (std 0.3): outputs depend on the whole context (see test_engine.py)."""
    return random_llama(TINY, 0.3)


@pytest.fixture(scope="module")
def loopy():
    """Small weights (std 0.1): outputs repeat a token for a while, then move on (prompt
    lookup finds something to copy, and is wrong at every change)."""
    return random_llama(TINY, 0.1)


FIXED = SpeculativeConfig(num_tokens=4, adaptive=False)


class Broken(Proposer):
    def propose(self, inputs):
        raise RuntimeError("proposer bug")


def spec_engine(model, tok, proposer, config=FIXED, **kw):
    """engine_for's engine (its slots/budget/max_reqs/overlap/scheduler knobs) speculating."""
    return engine_for(model, tok, speculative=config, proposer=proposer, **kw)


@pytest.fixture(scope="module")
def plain(model, tok):
    e = launch_engine(
        model,
        tok,
        eos_token_ids=EOS,
        max_total_tokens=4096,
        engine_config=EngineConfig(check_integrity=True),
    )
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def oracle_engine(model, tok):
    oracle = Oracle(TINY.vocab_size)
    e = spec_engine(model, tok, oracle)
    yield e, oracle
    e.shutdown()


def check_clean(engine):
    engine.check_integrity()
    stats = engine.stats()
    assert stats["num_running"] == stats["num_waiting"] == 0
    assert stats["kv_used"] == stats["kv_evictable"]  # only the prefix cache holds slots


def test_batch_outputs_identical_with_speculation(plain, oracle_engine):
    eng, oracle = oracle_engine
    ref = run_all(plain, PROMPTS, greedy(16))
    oracle.learn(PROMPTS, ref)
    before = eng.stats()
    out = run_all(eng, PROMPTS, greedy(16))
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    stats = eng.stats()
    accepted = stats["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    verified = stats["spec_verified_tokens"] - before["spec_verified_tokens"]
    assert verified > 100 and 0.5 < accepted / verified < 1.0  # mostly right, some wrong
    steps = stats["steps"] - before["steps"]
    assert steps < 16 * 0.6  # fewer steps than one token per step
    assert oracle.released >= set(range(len(PROMPTS)))  # every finished request released
    check_clean(eng)


def test_overlap_scheduling_keeps_steps_without_drafts_in_flight(plain, model, tok):
    """Overlap scheduling with speculation: a step that asks for drafts settles the one in
    flight first (the proposer never sees a placeholder: Oracle asserts it); once the
    unknown sequences back off, steps without drafts overlap again. Outputs unchanged."""
    ref = run_all(plain, PROMPTS, greedy(16))
    oracle = Oracle(TINY.vocab_size)
    oracle.learn(PROMPTS[:4], ref[:4])  # the others get empty proposals: they back off
    eng = spec_engine(model, tok, oracle, config=SpeculativeConfig(num_tokens=4), overlap=True)
    try:
        out = run_all(eng, PROMPTS, greedy(16))
        stats = eng.stats()
        check_clean(eng)
    finally:
        eng.shutdown()
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    assert stats["spec_accepted_tokens"] > 10
    assert 0 < stats["overlapped_steps"] < stats["steps"]


@pytest.mark.parametrize(
    "params",
    [
        SP(max_tokens=24, temperature=0.8, top_p=0.9, seed=11, ignore_eos=True),
        SP(
            max_tokens=24,
            temperature=0.0,
            frequency_penalty=0.7,
            presence_penalty=0.3,
            min_tokens=5,
            return_logprob=True,
            top_logprobs_num=3,
        ),
        SP(max_tokens=7, temperature=0.0, ignore_eos=True),
    ],
    ids=["seeded-sampling", "penalties-logprobs", "max-tokens"],
)
def test_parameters_give_the_same_result(plain, oracle_engine, params):
    eng, oracle = oracle_engine
    prompts = PROMPTS[:6]
    ref = run_all(plain, prompts, params)
    oracle.learn(prompts, ref)
    out = run_all(eng, prompts, params)
    for a, b in zip(out, ref):
        assert (a.token_ids, a.finish_reason, a.completion_tokens) == (
            b.token_ids,
            b.finish_reason,
            b.completion_tokens,
        )
        if params.return_logprob:
            assert [lp.token_id for lp in a.logprobs] == list(a.token_ids)
            for x, y in zip(a.logprobs, b.logprobs):
                assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
                assert [t.token_id for t in x.top] == [t.token_id for t in y.top]
    check_clean(eng)


def test_stop_string_inside_an_accepted_chain(plain, oracle_engine, tok):
    eng, oracle = oracle_engine
    prompt = PROMPTS[3]
    free = run_all(plain, [prompt], greedy(24))[0]
    oracle.learn([prompt], [free])
    text = free.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    params = greedy(24, stop=(stop,))
    ref, out = run_all(plain, [prompt], params)[0], run_all(eng, [prompt], params)[0]
    assert out.text == ref.text == text[: text.index(stop)]
    assert out.token_ids == ref.token_ids
    assert out.finish_reason == "stop" and out.matched_stop == stop
    check_clean(eng)


def test_constrained_generation_stays_valid(plain, oracle_engine, tok):
    eng, oracle = oracle_engine
    pattern = r"[a-z]{2,6}( [a-z]{2,6}){1,4}\. Score: [0-9]{2}"
    index = TokenIndex.get(pattern, tok)
    prompts = PROMPTS[6:10]

    def run(engine):
        hs = [
            engine.submit(EngineRequest(tuple(p), greedy(40), guide=index.new_guide()))
            for p in prompts
        ]
        return [h.result(timeout=120) for h in hs]

    ref = run(plain)
    # the oracle drafts unconstrained continuations first (which the FSM cuts: mostly
    # tokens it forbids), then the constrained ones (one token in three corrupted)
    oracle.learn(prompts, run_all(plain, prompts, greedy(8)))
    oracle.learn(prompts, ref)
    before = eng.stats()
    out = run(eng)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    assert all(re.fullmatch(pattern, r.text) for r in out), [r.text for r in out]
    after = eng.stats()
    assert after["spec_accepted_tokens"] > before["spec_accepted_tokens"]
    assert after["spec_guide_cuts"] > before["spec_guide_cuts"]  # cut before verification
    assert after["spec_jump_verifies"] > before["spec_jump_verifies"]  # ". Score: " forced
    check_clean(eng)


# Long forced spans (the keys) between short free ones that the loopy model fills with one
# digit repeated: n-gram drafts after a key copy the previous value.
FIELDS = (
    r'\{"alpha": "[0-9]{5}", "beta": "[0-9]{5}", "gamma": "[0-9]{5}", '
    r'"delta": "[0-9]{5}", "epsilon": "[0-9]{5}", "zeta": "[0-9]{5}"\}'
)


def test_jump_forward_tokens_are_verified_with_drafts(tok, loopy, monkeypatch):
    """A jump-forward's forced tokens and the drafts after them go in one verify entry:
    the same greedy outputs in fewer forward passes than with speculation off, and than
    with speculation on but no drafts after forced tokens (the forced tokens then prefill
    in a step of their own, as before)."""
    index = TokenIndex.get(FIELDS, tok)
    eng = launch_engine(
        loopy,
        tok,
        eos_token_ids=EOS,
        max_total_tokens=4096,
        engine_config=EngineConfig(check_integrity=True),
        speculative=SpeculativeConfig(method="ngram", num_tokens=6),
    )

    def run():
        """Outputs of PROMPTS[:4] one at a time, and the stats' growth meanwhile."""
        eng.flush_cache()
        before = eng.stats()
        out = [
            eng.submit(EngineRequest(tuple(p), greedy(120), guide=index.new_guide())).result(
                timeout=120
            )
            for p in PROMPTS[:4]
        ]
        after = eng.stats()
        return [r.token_ids for r in out], {
            k: after[k] - before[k]
            for k in ("steps", "spec_jump_verifies", "spec_accepted_tokens", "jump_forward_tokens")
        }

    try:
        eng.set_speculation(False)
        off, off_stats = run()
        eng.set_speculation(True)
        on, on_stats = run()
        decoding = eng.scheduler.decoding  # drafts only for requests with one pending token
        monkeypatch.setattr(
            eng.scheduler, "decoding", lambda: [r for r in decoding() if r.pending_len == 1]
        )
        no_tail, no_tail_stats = run()
        monkeypatch.undo()
        assert on == off == no_tail
        texts = [tok.decode(ids) for ids in on]
        assert all(re.fullmatch(FIELDS, t) for t in texts), texts
        assert off_stats["jump_forward_tokens"] >= 4 * 5 * 5  # five keys forced per request
        assert on_stats["spec_jump_verifies"] >= 4 and no_tail_stats["spec_jump_verifies"] == 0
        assert on_stats["steps"] < no_tail_stats["steps"] < off_stats["steps"], (
            on_stats,
            no_tail_stats,
            off_stats,
        )
        check_clean(eng)
    finally:
        eng.shutdown()


def test_retraction_with_speculation(model, tok, plain):
    """Retracted requests prefill their prompt and output again, in chunks: other batch shapes
    than the reference's decoding, so the outputs agree up to the reference's first near tie."""
    ref = run_all(plain, PROMPTS, greedy(40, return_logprob=True, top_logprobs_num=2))
    oracle = Oracle(TINY.vocab_size)
    oracle.learn(PROMPTS, ref)
    small = spec_engine(
        model,
        tok,
        oracle,
        slots=120,
        budget=24,
        max_reqs=16,
        init_new_token_ratio=0.02,
        min_new_token_ratio=0.02,
    )
    try:
        out = run_all(small, PROMPTS, greedy(40))
        compared = [
            assert_greedy_agrees(o.token_ids, r.token_ids, top2_logprobs(r.logprobs), NEAR_TIE)
            for o, r in zip(out, ref)
        ]
        assert sum(compared) >= 0.75 * 40 * len(PROMPTS), compared  # near ties are rare
        stats = small.stats()
        assert stats["num_retractions"] > 0 and stats["spec_accepted_tokens"] > 0, stats
        check_clean(small)
    finally:
        small.shutdown()


def test_abort_while_speculating(oracle_engine, plain):
    eng, oracle = oracle_engine
    prompt = PROMPTS[12]
    oracle.learn([prompt], run_all(plain, [prompt], greedy(200)))
    h = eng.submit(EngineRequest(tuple(prompt), greedy(200)))
    next(iter(h.pieces()))
    h.abort()
    r = h.result(timeout=60)
    assert r.finish_reason == "abort" and r.completion_tokens < 200
    check_clean(eng)


def test_ngram_proposer_and_switching(tok, plain, loopy):
    prompts = PROMPTS[:8]
    eng = launch_engine(
        loopy,
        tok,
        eos_token_ids=EOS,
        max_total_tokens=4096,
        cache_config=CacheConfig(radix_cache=False),
        engine_config=EngineConfig(check_integrity=True),
        speculative=SpeculativeConfig(method="ngram", num_tokens=4),
    )
    try:
        on = [r.token_ids for r in run_all(eng, prompts, greedy(30))]
        stats = eng.stats()
        assert stats["speculative"] == "ngram" and stats["spec_accepted_tokens"] > 30
        assert stats["spec_verified_tokens"] > stats["spec_accepted_tokens"]
        eng.set_speculation(False)
        # the small weights give near ties (PROMPTS[4]'s 7th token: 5e-5 apart), which verify
        # steps and plain decoding may resolve differently
        off = run_all(eng, prompts, greedy(30, return_logprob=True, top_logprobs_num=2))
        compared = [
            assert_greedy_agrees(a, b.token_ids, top2_logprobs(b.logprobs), NEAR_TIE)
            for a, b in zip(on, off)
        ]
        assert sum(compared) >= 0.75 * 30 * len(prompts), compared
        stats2 = eng.stats()
        assert stats2["spec_verified_tokens"] == stats["spec_verified_tokens"]
        assert stats2["speculative"] is None
        check_clean(eng)
    finally:
        eng.shutdown()
    with pytest.raises(ValueError, match="without speculative"):
        plain.set_speculation(True)


def test_a_failing_proposer_only_costs_the_drafts(model, tok, plain):
    ref = run_all(plain, PROMPTS[:4], greedy(8))
    eng = spec_engine(model, tok, Broken())
    try:
        out = run_all(eng, PROMPTS[:4], greedy(8))
        assert [r.token_ids for r in out] == [r.token_ids for r in ref]
        check_clean(eng)
    finally:
        eng.shutdown()


def test_prefill_first_mode_with_speculation(model, tok, plain):
    ref = run_all(plain, PROMPTS[:8], greedy(16))
    oracle = Oracle(TINY.vocab_size)
    oracle.learn(PROMPTS[:8], ref)
    eng = spec_engine(model, tok, oracle, hybrid_batching=False)
    try:
        out = run_all(eng, PROMPTS[:8], greedy(16))
        assert [r.token_ids for r in out] == [r.token_ids for r in ref]
        assert eng.stats()["spec_accepted_tokens"] > 0
        check_clean(eng)
    finally:
        eng.shutdown()
