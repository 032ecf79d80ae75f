"""Speculative decoding through the engine, on a tiny random Llama with the default model's
real tokenizer (as test_engine.py): outputs identical with speculation on and off, under
batching, retraction, constraints, stop strings and seeds; bookkeeping checked every step."""

from __future__ import annotations

import re

import pytest
import torch

from lmprog.core.models import load_tokenizer, resolve_model
from lmprog.core.sampling import SamplingParams as SP
from lmprog.fsm.index import TokenIndex
from lmprog.runtime.config import CacheConfig, SchedulerConfig
from lmprog.runtime.engine import EngineConfig
from lmprog.runtime.engine_io import EngineRequest
from lmprog.runtime.launch import launch_engine
from lmprog.runtime.models import ModelConfig, build_model
from lmprog.runtime.speculative import Proposal, Proposer, SpeculativeConfig

torch.set_num_threads(1)
EOS = (0, 2)
TINY = ModelConfig("llama", vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16, max_position=512,
                   tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,))
SHARED = list(range(1000, 1024))
PROMPTS = [SHARED[: 8 + i % 16] + [3000 + 7 * i + j for j in range(1 + i % 5)] for i in range(16)]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model())


def random_model(std):
    net = build_model(TINY, dtype="float32")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, std, generator=g)
    return net


@pytest.fixture(scope="module")
def model():
    """Random weights (std 0.3): outputs depend on the whole context (see test_engine.py)."""
    return random_model(0.3)


def greedy(n=12, **kw):
    return SP(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def run_all(engine, prompts, params):
    handles = [engine.submit(EngineRequest(tuple(p), params)) for p in prompts]
    return [h.result(timeout=120) for h in handles]
FIXED = SpeculativeConfig(num_tokens=4, adaptive=False)


class Oracle(Proposer):
    """Drafts the known continuation of a sequence (from spec-off runs), one token of it
    wrong in every third call; nothing for unknown sequences."""

    def __init__(self) -> None:
        self.known: list[list[int]] = []
        self.calls = 0
        self.released: set = set()

    def learn(self, prompts, results) -> None:
        self.known += [list(p) + list(r.token_ids) for p, r in zip(prompts, results)]

    def propose(self, inputs):
        out = []
        for inp in inputs:
            self.calls += 1
            seq = list(inp.token_ids)
            full = next((k for k in self.known if k[: len(seq)] == seq and len(k) > len(seq)), None)
            chain = full[len(seq): len(seq) + inp.max_tokens] if full else []
            if chain and self.calls % 3 == 0:
                chain[-1] = (chain[-1] + 1) % TINY.vocab_size
            out.append(Proposal(tuple(chain)))
        return out

    def release(self, rid):
        self.released.add(rid)


class Broken(Proposer):
    def propose(self, inputs):
        raise RuntimeError("proposer bug")


def spec_engine(model, tok, proposer, config=FIXED, slots=4096, budget=512, max_reqs=32, **sched):
    return launch_engine(
        model, tok, eos_token_ids=EOS, max_total_tokens=slots,
        scheduler_config=SchedulerConfig(max_num_batched_tokens=budget, max_running_reqs=max_reqs,
                                         **sched),
        engine_config=EngineConfig(check_integrity=True), speculative=config, proposer=proposer)


@pytest.fixture(scope="module")
def plain(model, tok):
    e = launch_engine(model, tok, eos_token_ids=EOS, max_total_tokens=4096,
                      engine_config=EngineConfig(check_integrity=True))
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def oracle_engine(model, tok):
    oracle = Oracle()
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


@pytest.mark.parametrize("params", [
    SP(max_tokens=24, temperature=0.8, top_p=0.9, seed=11, ignore_eos=True),
    SP(max_tokens=24, temperature=0.0, frequency_penalty=0.7, presence_penalty=0.3,
       min_tokens=5, return_logprob=True, top_logprobs_num=3),
    SP(max_tokens=7, temperature=0.0, ignore_eos=True),
], ids=["seeded-sampling", "penalties-logprobs", "max-tokens"])
def test_parameters_give_the_same_result(plain, oracle_engine, params):
    eng, oracle = oracle_engine
    prompts = PROMPTS[:6]
    ref = run_all(plain, prompts, params)
    oracle.learn(prompts, ref)
    out = run_all(eng, prompts, params)
    for a, b in zip(out, ref):
        assert (a.token_ids, a.finish_reason, a.completion_tokens) == \
            (b.token_ids, b.finish_reason, b.completion_tokens)
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
    stop = text[len(text) // 2: len(text) // 2 + 3]
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
        hs = [engine.submit(EngineRequest(tuple(p), greedy(40), guide=index.new_guide()))
              for p in prompts]
        return [h.result(timeout=120) for h in hs]

    ref = run(plain)
    # the oracle's continuations include one corrupted token (mostly one the FSM forbids)
    oracle.learn(prompts, ref)
    before = eng.stats()
    out = run(eng)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    assert all(re.fullmatch(pattern, r.text) for r in out), [r.text for r in out]
    after = eng.stats()
    assert after["spec_accepted_tokens"] > before["spec_accepted_tokens"]
    assert after["spec_guide_cuts"] > before["spec_guide_cuts"]  # cut before verification
    check_clean(eng)


def test_retraction_with_speculation(model, tok, plain):
    ref = run_all(plain, PROMPTS, greedy(40))
    oracle = Oracle()
    oracle.learn(PROMPTS, ref)
    small = spec_engine(model, tok, oracle, slots=120, budget=24, max_reqs=16,
                        init_new_token_ratio=0.02, min_new_token_ratio=0.02)
    try:
        out = run_all(small, PROMPTS, greedy(40))
        assert [r.token_ids for r in out] == [r.token_ids for r in ref]
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


def test_ngram_proposer_and_switching(tok, plain):
    # small weights: outputs repeat a token for a while, then move on (prompt lookup finds
    # something to copy, and is wrong at every change)
    loopy = random_model(0.1)
    prompts = PROMPTS[:8]
    eng = launch_engine(loopy, tok, eos_token_ids=EOS, max_total_tokens=4096,
                        cache_config=CacheConfig(radix_cache=False),
                        engine_config=EngineConfig(check_integrity=True),
                        speculative=SpeculativeConfig(method="ngram", num_tokens=4))
    try:
        on = [r.token_ids for r in run_all(eng, prompts, greedy(30))]
        stats = eng.stats()
        assert stats["speculative"] == "ngram" and stats["spec_accepted_tokens"] > 30
        assert stats["spec_verified_tokens"] > stats["spec_accepted_tokens"]
        eng.set_speculation(False)
        assert [r.token_ids for r in run_all(eng, prompts, greedy(30))] == on
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
    oracle = Oracle()
    oracle.learn(PROMPTS[:8], ref)
    eng = spec_engine(model, tok, oracle, hybrid=False)
    try:
        out = run_all(eng, PROMPTS[:8], greedy(16))
        assert [r.token_ids for r in out] == [r.token_ids for r in ref]
        assert eng.stats()["spec_accepted_tokens"] > 0
        check_clean(eng)
    finally:
        eng.shutdown()
