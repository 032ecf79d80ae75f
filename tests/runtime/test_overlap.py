"""Overlap scheduling (EngineConfig.overlap): step N+1 is scheduled and launched before step
N's tokens are read (its draws queued then, or, for constraints and penalties, once step N has
settled). Forced on here, on the CPU, where it gains nothing but must change
nothing: outputs equal those of the plain loop for every kind of request, placeholders
never reach the prefix cache (check_integrity runs after every step and rejects a cached
negative id), and aborts and constraints behave as without it (retractions: test_engine.py's
tiny-pool test runs both ways)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from engine_testing import PROMPTS, engine_for, greedy, model, run_all, tok  # noqa: F401
from sched_testing import resolve

from lmprog.core.sampling import SamplingParams as SP
from lmprog.fsm.index import TokenIndex
from lmprog.runtime.config import CacheConfig, SchedulerConfig
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.models import ModelConfig, load_model
from lmprog.runtime.request import Req
from lmprog.runtime.scheduler import Scheduler


def outcome(r):
    """What must not change; logprobs compared apart (float sums vary with the batch)."""
    ids = None if r.logprobs is None else [lp.token_id for lp in r.logprobs]
    return r.token_ids, r.finish_reason, r.text, r.matched_stop, ids


def logprobs(r):
    return [] if r.logprobs is None else [lp.logprob for lp in r.logprobs]


def mixed_params(reference_ids, tok):
    """Per prompt: greedy to max_tokens, stop tokens and strings, seeded sampling with
    top-k/top-p, logprobs, min_tokens, a penalty (history-bound: those steps settle at once)."""
    out = []
    for i, ids in enumerate(reference_ids):
        kind = i % 6
        if kind == 0 and i:
            out.append(greedy(stop=(tok.decode(list(ids[2:4])),)))
        elif kind == 0:
            out.append(greedy(5))
        elif kind == 1:
            out.append(greedy(stop_token_ids=(ids[4],)))
        elif kind == 2:
            out.append(
                SP(max_tokens=9, temperature=0.9, top_k=40, top_p=0.9, seed=i, ignore_eos=True)
            )
        elif kind == 3:
            out.append(greedy(7, return_logprob=True, top_logprobs_num=2))
        elif kind == 4:
            out.append(greedy(stop_token_ids=(ids[1],), min_tokens=3))
        else:
            out.append(greedy(8, presence_penalty=1.5))
    return out


@pytest.fixture(scope="module")
def engines(model, tok):
    plain, over = engine_for(model, tok), engine_for(model, tok, overlap=True)
    yield plain, over
    plain.shutdown()
    over.shutdown()


@pytest.fixture(scope="module")
def reference_ids(engines):
    return [r.token_ids for r in run_all(engines[0], PROMPTS, greedy())]


def test_every_kind_of_request_gives_the_same_outputs(engines, reference_ids, tok):
    plain, over = engines
    params = mixed_params(reference_ids, tok)
    expected = [
        plain.submit(EngineRequest(tuple(p), sp)).result(timeout=120)
        for p, sp in zip(PROMPTS, params)
    ]
    before = over.stats()["overlapped_steps"]
    handles = [over.submit(EngineRequest(tuple(p), sp)) for p, sp in zip(PROMPTS, params)]
    results = [h.result(timeout=120) for h in handles]
    got = [outcome(r) for r in results]
    assert got == [outcome(r) for r in expected]
    for r, e in zip(results, expected):
        assert logprobs(r) == pytest.approx(logprobs(e), abs=1e-3)
    assert [g[1] for g in got].count("stop") >= 4  # the stop paths were exercised
    stats = over.stats()
    assert stats["overlapped_steps"] > before  # penalised steps too, once the last settled
    over.check_integrity()


def test_batched_greedy_matches_and_every_step_overlaps(engines, reference_ids):
    _, over = engines
    over.flush_cache()
    before = over.stats()
    assert [r.token_ids for r in run_all(over, PROMPTS, greedy())] == reference_ids
    after = over.stats()
    assert (
        after["overlapped_steps"] - before["overlapped_steps"] == after["steps"] - before["steps"]
    )
    # again, from the KV those requests left in the prefix cache: it must be right
    assert [r.token_ids for r in run_all(over, PROMPTS, greedy())] == reference_ids
    assert over.stats()["cached_tokens"] - after["cached_tokens"] > 16 * 8


def test_a_constraint_beside_plain_requests(engines, reference_ids, tok):
    plain, over = engines
    index = TokenIndex.get(r"[0-9]{2,6}", tok)

    def submit(eng):
        c = eng.submit(
            EngineRequest(
                tuple(PROMPTS[5]), SP(max_tokens=10, temperature=0.0), guide=index.new_guide()
            )
        )
        others = [eng.submit(EngineRequest(tuple(p), greedy())) for p in PROMPTS[:6]]
        return c.result(timeout=120), [o.result(timeout=120).token_ids for o in others]

    (c_plain, o_plain), (c_over, o_over) = submit(plain), submit(over)
    assert o_plain == o_over == reference_ids[:6]
    assert c_over.token_ids == c_plain.token_ids and c_over.text.isdigit()


def test_constrained_steps_overlap_with_the_same_outputs(engines, tok):
    """Constraints under overlap scheduling (issue 36): a step's masks are computed once the
    step before has settled, while its forward pass runs, so constrained steps stay in
    flight too. JSON (keys jump-forwarded), a regex, seeded sampling and a presence penalty,
    alone and beside plain requests: the same outputs and jumps as the plain loop; every
    step of a batch of constrained requests overlaps."""
    from lmprog.fsm import Constraint

    plain, over = engines
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}},
        "required": ["name", "n"],
    }
    json_index = TokenIndex.get(Constraint.from_json_schema(schema), tok)
    digits = TokenIndex.get(r"[0-9]{2,6}(-[a-z]{1,4})?", tok)
    kinds = [
        (json_index, SP(max_tokens=40, temperature=0.0)),
        (digits, SP(max_tokens=12, temperature=0.8, seed=3)),
        (json_index, SP(max_tokens=40, temperature=0.7, seed=5, presence_penalty=0.5)),
        (digits, SP(max_tokens=12, temperature=0.0)),
    ]

    def run(eng, with_plain):
        handles = [
            eng.submit(EngineRequest(tuple(PROMPTS[i]), sp, guide=index.new_guide()))
            for i, (index, sp) in enumerate(kinds)
        ]
        others = [eng.submit(EngineRequest(tuple(p), greedy())) for p in PROMPTS[4:7] if with_plain]
        return [outcome(h.result(timeout=120)) for h in handles] + [
            outcome(o.result(timeout=120)) for o in others
        ]

    for with_plain in (True, False):
        jumps = plain.stats()["jump_forward_tokens"], over.stats()["jump_forward_tokens"]
        expected = run(plain, with_plain)
        before = over.stats()
        got = run(over, with_plain)
        after = over.stats()
        assert got == expected
        assert after["jump_forward_tokens"] - jumps[1] == (
            plain.stats()["jump_forward_tokens"] - jumps[0]
        )
        overlapped = after["overlapped_steps"] - before["overlapped_steps"]
        assert overlapped == after["steps"] - before["steps"] if not with_plain else overlapped
    assert plain.stats()["jump_forward_tokens"] > 0
    for text, reason in ((r[2], r[1]) for r in got[::2]):
        assert reason != "stop" or json.loads(text)["n"] is not None
    over.check_integrity()


def test_abort_while_a_step_is_in_flight(engines, reference_ids):
    _, over = engines
    h = over.submit(
        EngineRequest(tuple(PROMPTS[1]), SP(max_tokens=200, temperature=0.0, ignore_eos=True))
    )
    others = [over.submit(EngineRequest(tuple(p), greedy())) for p in PROMPTS[4:8]]
    next(iter(h.pieces()))
    h.abort()
    r = h.result(timeout=60)
    assert r.finish_reason == "abort" and 0 < r.completion_tokens < 200
    assert [o.result(timeout=60).token_ids for o in others] == reference_ids[4:8]
    over.check_integrity()
    assert over.stats()["num_running"] == 0


# ---- the scheduler's side: placeholders, resolution, a request at its length cap --------


def test_placeholders_are_resolved_in_place_and_never_cached():
    sched = Scheduler(
        64, 64, SchedulerConfig(max_num_batched_tokens=32, max_running_requests=4), CacheConfig()
    )
    a = sched.submit(Req("a", [5, 6, 7], SP(max_tokens=2, temperature=0.0)))
    b = sched.submit(Req("b", [5, 6, 8, 9], SP(max_tokens=5, temperature=0.0)))
    step1 = sched.schedule()  # both prompts; each samples its first token
    assert sched.process_launched(step1, [(-1,), (-2,)]) == []
    assert a.token_ids[-1] == -1 and b.token_ids[-1] == -2 and a.num_computed == 3
    step2 = sched.schedule()  # decodes feeding the placeholders, before they are known
    assert [e.req.rid for e in step2.entries] == ["a", "b"]
    assert step2.input_ids().tolist() == [-1, -2]
    assert resolve(sched, step1, [(11,), (21,)], [None, None]) == []
    assert a.token_ids == [5, 6, 7, 11] and b.token_ids == [5, 6, 8, 9, 21]
    # a's next token is its last (max_tokens): it ends now, its row and KV freed at once,
    # the KV of its real tokens cached, its placeholder not
    assert sched.process_launched(step2, [(-1,), (-2,)]) == [a]
    assert a.finished and a.finish_reason == "length" and a.token_ids[-1] == -1
    assert sched.cache.prefix_cache.match_prefix([5, 6, 7, 11]).length == 4
    step3 = sched.schedule()
    assert [e.req.rid for e in step3.entries] == ["b"]
    sched.check_integrity()
    # a finished already: skipped; b stops (its stop token, say) and ends
    assert resolve(sched, step2, [(12,), (22,)], [None, "stop"]) == [b]
    assert a.token_ids[-1] == -1 and b.output_ids == [21, 22] and b.finish_reason == "stop"
    sched.process_launched(step3, [(-1,)])  # b's extra step: dropped
    sched.check_integrity()
    assert sched.cache.prefix_cache.match_prefix([5, 6, 8, 9, 21, 22]).length == 5
    assert len(sched.cache.prefix_cache.all_slots()) == 7  # 5 6 | 7 11 | 8 9 21
    assert not sched.has_work and int(np.min(sched.req_to_token)) >= 0


def test_prefill_only_requests_finish_when_their_last_chunk_is_recorded():
    """A request that samples nothing (max_tokens=0: a fork's or select's shared prefix, a
    scoring request) waits for no placeholder: it ends with its last chunk, also when it
    runs alone (it used to stay running with nothing to compute)."""
    sched = Scheduler(
        64, 64, SchedulerConfig(max_num_batched_tokens=8, max_running_requests=4), CacheConfig()
    )
    head = list(range(100, 120))
    p = sched.submit(Req("prefix", head, SP(max_tokens=0)))
    for chunk in (8, 8):
        step = sched.schedule()
        assert [e.num_new for e in step.entries] == [chunk] and not step.entries[0].sample
        assert sched.process_launched(step, [()]) == []
    step = sched.schedule()
    assert sched.process_launched(step, [()]) == [p]
    assert p.finish_reason == "length" and not sched.has_work
    assert sched.cache.prefix_cache.match_prefix(head).length == len(head)
    sched.check_integrity()


def test_shared_prefixes_and_scoring_under_overlap(engines):
    """What select and fork send: a prefill-only request for the shared prefix, then
    scoring requests (prompt logprobs) or several children at once; alone and together.
    Exact on any CPU by margin: the smallest top-2 gap of these greedy outputs is 0.044,
    ~2,000x the noise between batch shapes (tests/greedy_agreement.py explains)."""
    plain, over = engines
    head = tuple(range(2000, 2030))
    children = [head + (3000 + i, 3001 + i) for i in range(3)]

    def program(eng):
        first = eng.submit(EngineRequest(head, SP(max_tokens=0))).result(timeout=60)
        scored = [
            eng.submit(EngineRequest(c, SP(max_tokens=0), prompt_logprob_start=len(head)))
            for c in children
        ]
        forks = [eng.submit(EngineRequest(c, greedy(4))) for c in children]
        both = [
            eng.submit(EngineRequest(head[:20], SP(max_tokens=0))),
            eng.submit(EngineRequest(head + (9,), greedy(3))),
        ]
        return (
            first.finish_reason,
            first.cached_tokens,
            [[lp.token_id for lp in h.result(timeout=60).prompt_logprobs] for h in scored],
            [(h.result(timeout=60).token_ids, h.result().cached_tokens) for h in forks],
            [h.result(timeout=60).token_ids for h in both],
        )

    plain.flush_cache()
    over.flush_cache()
    expected = program(plain)
    assert program(over) == expected
    assert expected[:2] == ("length", 0) and all(c == len(head) for _, c in expected[3])
    over.check_integrity()
    assert over.stats()["num_running"] == 0


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU (run through the device tool: tests/runtime/test_overlap.py)",
)
def test_on_the_gpu_with_graphs_outputs_are_bitwise_those_without_overlap():
    """The real thing: asynchronous draws, pinned copies, decode and piecewise CUDA graphs
    fed placeholders. Fixed-length greedy and seeded requests give the same batches with
    and without overlap (a request at its length cap leaves at once in both), so the
    tokens must be identical, with fewer rows than requests (admissions as slots free up)."""
    cfg = ModelConfig(
        "llama",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        max_position=512,
    )
    model = load_model(
        cfg, load_format="dummy", seed=5, device="cuda", dtype="float32", attention="triton"
    )
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(3, 512, (int(n),), generator=g).tolist()
        for n in torch.randint(4, 200, (24,), generator=g)
    ]
    params = [
        SP(max_tokens=8 + 5 * i, temperature=0.0, ignore_eos=True)
        if i % 3
        else SP(max_tokens=30, temperature=0.8, top_k=20, seed=i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    outs, stats = [], []
    for overlap in (False, True):
        eng = launch_engine(
            model,
            None,
            eos_token_ids=(0,),
            max_total_tokens=8192,
            scheduler_config=SchedulerConfig(max_num_batched_tokens=256, max_running_requests=12),
            engine_config=EngineConfig(check_integrity=True, overlap=overlap),
        )
        try:
            handles = [eng.submit(EngineRequest(tuple(p), sp)) for p, sp in zip(prompts, params)]
            outs.append([h.result(timeout=300).token_ids for h in handles])
            stats.append(eng.stats())
        finally:
            eng.shutdown()
    assert outs[0] == outs[1]
    assert stats[0]["overlapped_steps"] == 0 and stats[1]["overlapped_steps"] == stats[1]["steps"]


@pytest.mark.parametrize("overlap", [False, True])
def test_a_request_cut_at_the_context_says_so_with_and_without_overlap(model, tok, overlap):
    """The context cap is a finish rule of the request's DecodeState (its `room`), also for
    a request that overlap scheduling released before its last token was read."""
    prompt = tuple(PROMPTS[0])
    eng = engine_for(model, tok, slots=len(prompt) + 6, overlap=overlap)
    try:
        r = eng.submit(EngineRequest(prompt, greedy(50))).result(timeout=60)
        assert (r.finish_reason, len(r.token_ids)) == ("length", 6)
        assert r.message == f"the context of {len(prompt) + 6} tokens is full"
        eng.check_integrity()
    finally:
        eng.shutdown()
