"""Speculative decoding, the pieces: the n-gram proposer, the adaptive draft lengths, the
config, and the rejection rule (statistically, against the target distribution)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lmprog.core.sampling import SamplingParams as SP
from lmprog.decoding.decode_state import DecodeState
from lmprog.decoding.rejection import rejection_sample
from lmprog.decoding.rng import make_generator
from lmprog.decoding.sampler import SamplingTensors, probabilities, sample
from lmprog.runtime.request import Req
from lmprog.runtime.scheduler.batch import ScheduledEntry
from lmprog.runtime.speculative import (
    Proposal,
    ProposalInput,
    Proposer,
    SpeculativeConfig,
    build_proposer,
)
from lmprog.runtime.speculative.adaptive import (
    AcceptanceRate,
    DraftLengths,
    ProposeCost,
    best_length,
    expected_tokens,
)
from lmprog.runtime.speculative.ngram import NgramProposer, lookup
from lmprog.runtime.speculative.speculator import Speculator

torch.set_num_threads(1)


# ---- n-gram proposer ------------------------------------------------------------------------
def test_lookup_copies_what_followed_the_latest_longest_match():
    seq = np.array([5, 1, 2, 9, 9, 1, 2, 3, 4, 7, 0, 1, 2, 3])
    # suffix "1 2 3" occurs at 5 (then 4 7 0): the 3-gram beats the 2-gram "2 3"
    assert lookup(seq, 1, 3, 3).tolist() == [4, 7, 0]
    # with n <= 2, "2 3" occurs only at 6 -> "4 7 ..."; latest "1 2" would be at 5 too
    assert lookup(seq, 1, 2, 2).tolist() == [4, 7]
    latest = np.array([1, 2, 8, 1, 2, 9, 1, 2])  # "1 2" at 0 and 3: the latest (3) wins,
    assert lookup(latest, 2, 2, 4).tolist() == [9, 1, 2, 9]  # its copy wraps around


def test_lookup_finds_nothing_without_an_earlier_occurrence():
    assert lookup(np.array([1, 2, 3, 4]), 1, 3, 5).tolist() == []
    assert lookup(np.array([7]), 1, 3, 5).tolist() == []
    # a repetition continues periodically (cut at max_tokens)
    assert lookup(np.array([3, 3, 3, 3, 3]), 1, 2, 4).tolist() == [3, 3, 3, 3]
    assert lookup(np.array([4, 5, 4, 5, 4]), 1, 3, 5).tolist() == [5, 4, 5, 4, 5]


def test_ngram_proposer_respects_max_tokens_and_order():
    prop = NgramProposer(2, 3)
    out = prop.propose(
        [
            ProposalInput("a", [1, 2, 3, 4, 5, 1, 2], 2),
            ProposalInput("b", [9, 8], 4),
            ProposalInput("c", [4, 5, 6, 4, 5], 1),
        ]
    )
    assert [p.token_ids for p in out] == [(3, 4), (), (6,)]
    assert all(p.probs is None for p in out)
    with pytest.raises(ValueError):
        NgramProposer(3, 2)


def test_build_proposer_and_config_validation():
    cfg = SpeculativeConfig(method="ngram", ngram_min=2, ngram_max=5)
    prop = build_proposer(cfg, vocab_size=100)
    assert isinstance(prop, NgramProposer) and (prop.ngram_min, prop.ngram_max) == (2, 5)
    assert SpeculativeConfig.coerce("ngram") == SpeculativeConfig()
    assert SpeculativeConfig.coerce({"num_tokens": 3}).num_tokens == 3
    assert SpeculativeConfig().resolved_for("cpu") == (0.15, 32)
    assert SpeculativeConfig(draft_cost=0.5, max_step_tokens=7).resolved_for("cuda") == (0.5, 7)
    for bad, err in [
        ({"method": "medusa"}, ValueError),
        ({"num_tokens": 0}, ValueError),
        ({"ngram_min": 3, "ngram_max": 2}, ValueError),
        ({"method": "draft"}, ValueError),
        ({"adaptive": 1}, TypeError),
        ({"draft_cost": 2.0}, ValueError),
        ({"nope": 1}, ValueError),
    ]:
        with pytest.raises(err):
            SpeculativeConfig.coerce(bad)
    with pytest.raises(TypeError):
        SpeculativeConfig.coerce(3)


# ---- adaptive draft lengths -----------------------------------------------------------------
def test_best_length_grows_with_the_acceptance_rate_and_shrinks_with_cost():
    lengths = [best_length(a, 8, 0.15) for a in (0.05, 0.3, 0.6, 0.8, 0.95, 1.0)]
    assert lengths == sorted(lengths) and lengths[0] == 0 and lengths[-1] == 8
    assert best_length(0.8, 8, 0.0) == 8 and best_length(0.8, 8, 1.0) <= 1
    k = best_length(0.7, 16, 0.15)  # the argmax, checked by brute force
    value = [expected_tokens(0.7, j) / (1 + 0.15 * j) for j in range(17)]
    assert k == int(np.argmax(value))


def test_acceptance_rate_follows_the_evidence():
    r = AcceptanceRate()
    for _ in range(10):
        r.update(accepted=4, rejected=False)
    assert r.rate > 0.95 and best_length(r.rate, 8, 0.15) == 8
    for _ in range(40):
        r.update(accepted=0, rejected=True)
    assert r.rate < 0.1 and best_length(r.rate, 8, 0.15) == 0


def test_a_request_at_zero_length_probes_ever_more_rarely():
    r = AcceptanceRate()
    for _ in range(40):
        r.update(accepted=0, rejected=True)
    asked = []
    for step in range(80):
        if r.ready() and r.length(best_length(r.rate, 8, 0.15)):
            asked.append(step)
            r.update(accepted=0, rejected=True)  # the probe fails too
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert asked[0] == 2 and gaps[:4] == [3, 5, 9, 17] and set(gaps[3:]) == {17}
    r.wait = 0
    assert r.length(0) == 1  # a probe ...
    r.update(accepted=2, rejected=True)  # ... that succeeds ends the back-off
    assert r.penalty == 0


def stats_with(rate: float) -> AcceptanceRate:
    """Statistics whose estimate is `rate` (long history, no back-off)."""
    r = AcceptanceRate()
    r.accepted, r.cut = rate * 1000, (1 - rate) * 1000
    return r


def test_draft_lengths_back_off_with_the_batch():
    dl = DraftLengths(num_tokens=8, draft_cost=0.15, max_step_tokens=32)

    def choose(rates, caps, num_decoding):
        return dl.choose([stats_with(a) for a in rates], caps, num_decoding)

    assert choose([0.99], [100], 1) == [8]
    assert choose([0.99], [3], 1) == [3]  # capped by what the request may still generate
    assert choose([0.99] * 32, [100] * 32, 32) == [0] * 32  # compute-bound: nobody
    many = choose([0.99] * 8, [100] * 8, 16)  # 16 decoders, room for 16 drafts
    assert sum(many) == 16 and max(many) - min(many) <= 1
    assert choose([0.95, 0.4], [100, 100], 28) == [4, 0]  # 4 drafts of room: the likely win
    assert choose([0.05], [100], 1) == [0]  # not worth a draft (it will probe later)
    fixed = DraftLengths(num_tokens=5, draft_cost=0.15, max_step_tokens=4, adaptive=False)
    assert fixed.choose([stats_with(0.0), stats_with(0.5)], [100, 2], 64) == [5, 2]


# ---- the rejection rule ---------------------------------------------------------------------
def tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


P = torch.tensor([0.05, 0.30, 0.00, 0.25, 0.15, 0.25])
Q = torch.tensor([0.40, 0.05, 0.30, 0.05, 0.20, 0.00])
N = 200_000


def _histogram(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=len(P)).float()


def test_rejection_sampling_keeps_the_target_distribution():
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    drafts = torch.multinomial(Q, N, replacement=True, generator=g)
    tokens, accepted = rejection_sample(P.expand(N, -1), Q.expand(N, -1), drafts)
    assert torch.equal(tokens[accepted], drafts[accepted])
    assert tv(_histogram(tokens), P) < 0.006
    # acceptance rate = sum min(p, q) = 1 - TV(p, q)
    expected_rate = float(torch.minimum(P, Q).sum())
    assert abs(float(accepted.float().mean()) - expected_rate) < 0.006
    # the test has power: resampling from p instead of (p - q)+ is biased by far more
    wrong = torch.where(accepted, drafts, torch.multinomial(P, N, replacement=True, generator=g))
    assert tv(_histogram(wrong), P) > 0.03


def test_rejection_sampling_is_reproducible_with_generators():
    drafts = torch.tensor([0, 2, 4, 0])
    p, q = P.expand(4, -1), Q.expand(4, -1)
    runs = [rejection_sample(p, q, drafts, [make_generator(s) for s in range(4)]) for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert not runs[0][1][1]  # draft 2 has p = 0: always rejected
    assert runs[0][0][1] != 2


def test_probabilities_is_what_sample_draws_from():
    torch.manual_seed(1)
    logits = torch.randn(3, 6) * 2
    params = [SP(temperature=0.7, top_k=4), SP(temperature=1.3, top_p=0.8), SP(temperature=0.0)]
    t = SamplingTensors.from_params(params)
    probs = probabilities(logits, t)
    assert torch.allclose(probs.sum(-1), torch.ones(3))
    assert probs[2].max() == 1.0 and probs[2].argmax() == logits[2].argmax()
    assert (probs[0] > 0).sum() == 4
    n = 20_000  # each sampled row repeated n times in one batch
    many = SamplingTensors.from_params([params[0]] * n + [params[1]] * n)
    draws = sample(logits[:2].repeat_interleave(n, dim=0), many).token_ids.view(2, n)
    for row in range(2):
        assert tv(torch.bincount(draws[row], minlength=6).float(), probs[row]) < 0.02


def test_empty_proposals_back_off_exponentially():
    r = AcceptanceRate()
    asked = []
    for step in range(60):
        if r.ready():
            asked.append(step)
            r.proposed(empty=True)
    gaps = [b - a for a, b in zip(asked, asked[1:])]
    assert gaps[:5] == [2, 3, 5, 9, 17] and set(gaps[4:]) == {17}  # waits 1, 2, 4, 8, 16
    r.wait = 0
    r.proposed(empty=False)
    assert r.penalty == 16 and r.ready()  # a non-empty proposal alone changes nothing
    r.update(accepted=1, rejected=True)
    r.proposed(empty=True)
    assert r.wait == 1  # an accepted draft reset the doubling


# ---- the speculator: drafts after jump-forward tokens ---------------------------------------
LOOP = [5, 6, 7] * 6


def running_req(rid, tokens, pending, max_tokens=60):
    """A running request's bookkeeping: `tokens` known, the last `pending` not yet fed
    (pending > 1: the sampled token and the ones a jump-forward forced after it)."""
    params = SP(max_tokens=max_tokens, temperature=0.0)
    state = DecodeState(
        params,
        tokenizer=None,
        prompt_ids=tokens[:2],
        eos_token_ids=(0,),
        vocab_size=100,
        token_text=str,
    )
    req = Req(rid, tokens[:2], params, engine_data=state)
    req.token_ids[:] = tokens
    req.num_computed = len(tokens) - pending
    return req


def report_verify(spec, req, accepted, rejected):
    """Tell spec that req's pending tokens and drafts were verified with this outcome."""
    k = len(req.draft_ids)
    e = ScheduledEntry(
        req,
        0,
        req.num_computed,
        req.pending_len + k,
        0,
        len(req.token_ids) - 1,
        True,
        False,
        tuple(req.draft_ids),
    )
    spec.on_step(
        SimpleNamespace(entries=[e]), SimpleNamespace(accepted=[accepted], rejected=[rejected])
    )


def test_drafts_after_forced_tokens_continue_them_within_the_step_limit():
    spec = Speculator(
        NgramProposer(1, 3), SpeculativeConfig(num_tokens=8, max_step_tokens=6), vocab_size=100
    )
    a = running_req("a", LOOP, 1)
    b = running_req("b", LOOP + [1, 2, 5, 6], 3)  # forced "2 5 6" after the sampled 1
    spec.propose(spec.choose([a, b]))
    # what followed the forced tokens' end "5 6" before (without them: no match for "7 1")
    assert b.draft_ids and b.draft_ids == [7, 1, 2, 5, 6][: len(b.draft_ids)]
    assert len(a.draft_ids) + len(b.draft_ids) == 6 - (1 + 3)  # forced tokens are fed too
    b.num_computed = b.seq_len - 1  # the same requests decoding: more room for drafts
    spec.propose(spec.choose([a, b]))
    assert len(a.draft_ids) + len(b.draft_ids) == 4 == 2 * best_length(0.6, 8, 0.15)
    assert spec.stats()["spec_jump_verifies"] == 0
    b.num_computed = b.seq_len - 3
    spec.propose(spec.choose([b]))
    report_verify(spec, b, 0, True)
    assert spec.stats()["spec_jump_verifies"] == 1


def test_rejections_after_forced_tokens_do_not_stop_drafting_inside_a_span():
    # an explicit draft_cost: no timing here (a "step" of this test takes no forward)
    spec = Speculator(
        NgramProposer(1, 3), SpeculativeConfig(num_tokens=4, draft_cost=0.15), vocab_size=100
    )
    req = running_req("r", LOOP + [1, 2, 5, 6], 3)
    for _ in range(12):  # guesses right after forced text keep failing
        spec.propose(spec.choose([req]))
        if req.draft_ids:
            report_verify(spec, req, 0, True)
    spec.propose(spec.choose([req]))
    assert req.draft_ids == []  # backing off there
    req.num_computed = req.seq_len - 1  # inside a span: its own statistics, still the prior
    spec.propose(spec.choose([req]))
    assert len(req.draft_ids) == best_length(0.6, 4, 0.15) > 0


# ---- the speculator: the measured cost of proposing -----------------------------------------
def test_propose_cost_is_a_weighted_mean_of_per_draft_samples():
    cost = ProposeCost()
    cost.observe(propose_s=0.8, step_s=1.8, longest=2)  # 0.4 s a draft, 1 s without
    assert cost.value == pytest.approx(0.4)
    cost.observe(propose_s=0.1, step_s=1.1, longest=1)  # the first steps: their mean
    assert cost.value == pytest.approx(0.25)
    cost.observe(propose_s=5.0, step_s=6.0, longest=1)  # capped: a draft worth a step
    assert cost.value == pytest.approx((0.4 + 0.1 + 1.0) / 3)
    cost.observe(propose_s=0.5, step_s=0.5, longest=1)  # no time left for the step: ignored
    assert cost.samples == 3
    for _ in range(60):  # later steps: an exponentially weighted mean
        cost.observe(propose_s=0.002, step_s=1.002, longest=4)
    assert cost.value == pytest.approx(0.0005, abs=1e-4)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class WrongDrafts(Proposer):
    """Drafts nobody accepts, taking `per_draft` seconds per position of the longest chain
    (a draft model's sequential forwards) on `clock`."""

    def __init__(self, clock: Clock, per_draft: float) -> None:
        self.clock, self.per_draft, self.calls = clock, per_draft, 0

    def propose(self, inputs):
        self.calls += 1
        self.clock.now += self.per_draft * max(i.max_tokens for i in inputs)
        return [Proposal((1,) * i.max_tokens) for i in inputs]


def run_wrong_drafts(per_draft: float, draft_cost: float | None, steps: int = 100):
    """A GPU engine's speculator (verify cost 0.02) asking WrongDrafts for one request, each
    step's forward taking 1 s: (the speculator, the steps that drafted, their draft counts)."""
    clock = Clock()
    spec = Speculator(
        WrongDrafts(clock, per_draft),
        SpeculativeConfig(num_tokens=4, draft_cost=draft_cost),
        vocab_size=100,
        device="cuda",
        clock=clock,
    )
    req = running_req("r", LOOP, 1, max_tokens=10_000)
    asked, ks = [], []
    for step in range(steps):
        spec.propose(spec.choose([req]))
        if req.draft_ids:
            asked.append(step)
            ks.append(len(req.draft_ids))
        clock.now += 1.0  # the target's forward
        report_verify(spec, req, 0, True)
    return spec, asked, ks


def test_a_costly_proposer_that_is_never_right_is_left_alone():
    """0% acceptance: the rate settles at ~0.08, above the GPU's verify cost 0.02, but a
    draft model costing 0.4 step per draft makes k = 0: it backs off and probes."""
    spec, asked, ks = run_wrong_drafts(per_draft=0.4, draft_cost=None)
    assert spec.stats()["spec_draft_cost"] == pytest.approx(0.02 + 0.4)
    assert ks[0] == 4 and set(ks[1:]) == {1}  # nothing measured before the first step
    gaps = [b - a for a, b in zip(asked[1:], asked[2:])]
    assert gaps == sorted(gaps) and gaps[-3:] == [17] * 3 and len(asked) <= 10


@pytest.mark.parametrize("per_draft, draft_cost", [(0.4, 0.02), (0.0, None)])
def test_a_free_or_explicitly_priced_proposer_keeps_drafting(per_draft, draft_cost):
    """An explicit draft_cost is the whole cost (the 0.4 s is not measured); a proposer that
    costs nothing is measured at 0: either way one draft a step is worth it at a ~0.08."""
    spec, asked, ks = run_wrong_drafts(per_draft, draft_cost)
    assert spec.stats()["spec_draft_cost"] == pytest.approx(0.02)
    assert (spec.propose_cost is None) == (draft_cost is not None)
    assert asked == list(range(100)) and ks[-1] == 1


def test_probes_are_rationed_in_a_large_batch():
    """64 requests a costly draft never fits: at most 64 / PROBE_SHARE of them probe in a
    step, the others wait on as if they had, so the batch probes far less than 64 lone
    requests."""
    from lmprog.runtime.speculative.adaptive import PROBE_SHARE

    def probes(batch: int, steps: int = 100) -> list[int]:
        lengths = DraftLengths(num_tokens=4, draft_cost=0.1, max_step_tokens=10_000)
        lengths.cost = 0.5  # proposing measured at 0.4: costly, probes rationed
        stats = [AcceptanceRate() for _ in range(batch)]
        for st in stats:
            st.update(0, True)
            st.update(0, True)  # rate ~0.2: k = 0 at this cost
        return [sum(k > 0 for k in lengths.choose(stats, [8] * batch, batch)) for _ in range(steps)]

    alone = sum(probes(1))
    batch = probes(64)
    assert max(batch) <= 64 // PROBE_SHARE and 5 <= alone <= 10
    assert sum(batch) <= 64 * alone / 3


def test_newcomers_take_the_pooled_rate_and_explore_in_rations_until_it_has_evidence():
    """Where proposing is costly (a draft model) newcomers go by every request's recent
    verifies, and a large batch sends only some of them to find out first."""
    from lmprog.runtime.speculative.adaptive import PROBE_SHARE

    lengths = DraftLengths(num_tokens=4, draft_cost=0.02, max_step_tokens=10_000)
    lengths.cost = 0.3  # a draft model's forwards, measured: proposing is costly
    pool = AcceptanceRate()
    stats = [AcceptanceRate(pool) for _ in range(64)]
    ks = lengths.choose(stats, [8] * 64, 64)
    assert sum(k > 0 for k in ks) == 64 // PROBE_SHARE  # nothing known yet: 8 explore
    for st, k in zip(stats, ks):
        if k:
            st.update(0, True)
            pool.update(0, True)  # every draft wrong
    assert pool.rate < 0.15 and stats[-1].pooled_rate == pool.rate  # the rest expect as much
    assert lengths.choose(stats, [8] * 64, 64) == [0] * 64  # nobody else pays to learn it
    good = AcceptanceRate()
    for _ in range(3):
        good.update(4, False)
    fresh = [AcceptanceRate(good) for _ in range(64)]
    assert all(k == 4 for k in lengths.choose(fresh, [8] * 64, 64))  # a good source: all ask
    unknown = DraftLengths(num_tokens=4, draft_cost=0.02, max_step_tokens=10_000)
    unknown.cost_known = False  # a measured proposer before its first step: as costly
    newcomers = [AcceptanceRate(AcceptanceRate()) for _ in range(64)]
    assert sum(k > 0 for k in unknown.choose(newcomers, [8] * 64, 64)) == 64 // PROBE_SHARE


@pytest.mark.parametrize("measured", [0.0, 0.4])
def test_requests_without_verifies_probe_rarely_where_proposing_is_costly(measured):
    """A pool that says drafts fail: where proposing costs about what verifying does
    (n-gram) newcomers keep asking; where it costs a draft model's forward they probe once
    in FRESH_PROBE_EVERY steps, all of them together (the pool is re-tested, not each)."""
    from lmprog.runtime.speculative.adaptive import FRESH_PROBE_EVERY

    lengths = DraftLengths(num_tokens=4, draft_cost=0.02, max_step_tokens=10_000)
    lengths.cost = 0.02 + measured
    pool = AcceptanceRate()
    for _ in range(20):
        pool.update(0, True)
    stats = [AcceptanceRate(pool) for _ in range(4)]
    asked = [sum(k > 0 for k in lengths.choose(stats, [8] * 4, 4)) for _ in range(200)]
    if measured == 0.0:
        assert sum(asked) > 100
    else:
        steps = [i for i, n in enumerate(asked) if n]
        assert set(asked) == {0, 1} and len(steps) == 200 // FRESH_PROBE_EVERY
        assert min(b - a for a, b in zip(steps, steps[1:])) >= FRESH_PROBE_EVERY
