"""Sampled speculative decoding keeps the target distribution: a tiny-vocabulary model in
the engine, drafts drawn from a fixed distribution q far from the model's (with q given to
the rejection rule), thousands of sampled requests, chi-square against the exact target
probabilities of the generated tokens. A wrong acceptance rule fails the same test."""

from __future__ import annotations

import itertools

import pytest
import torch
from engine_testing import random_llama
from spec_testing import Oracle

from lmprog.core.sampling import SamplingParams as SP
from lmprog.decoding import rejection
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.models import ModelConfig
from lmprog.runtime.speculative import Proposal, Proposer, SpeculativeConfig

torch.set_num_threads(1)
V = 6
CFG = ModelConfig(
    "llama",
    vocab_size=V,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    max_position=64,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_ids=(0,),
)
PROMPT = (1, 2, 3)
PARAMS = SP(max_tokens=4, temperature=1.1, top_k=5, ignore_eos=True)
Q = torch.tensor([0.02, 0.02, 0.06, 0.40, 0.10, 0.40])  # far from the model's distributions
N = 3000


class SampledDrafts(Proposer):
    """Drafts drawn i.i.d. from Q (an RNG per request), reported with their distribution."""

    def __init__(self) -> None:
        self.rngs: dict = {}

    def propose(self, inputs):
        out = []
        for inp in inputs:
            g = self.rngs.setdefault(inp.rid, torch.Generator().manual_seed(10_000 + inp.rid))
            d = torch.multinomial(Q, inp.max_tokens, replacement=True, generator=g)
            out.append(Proposal(tuple(d.tolist()), Q.expand(inp.max_tokens, V).clone()))
        return out

    def release(self, rid):
        self.rngs.pop(rid, None)


@pytest.fixture(scope="module")
def model():
    return random_llama(CFG, 0.7, seed=3)


def engine(model, speculative: bool):
    return launch_engine(
        model,
        None,
        eos_token_ids=(0,),
        max_total_tokens=8192,
        engine_config=EngineConfig(check_integrity=False),
        speculative=SpeculativeConfig(num_tokens=3, adaptive=False) if speculative else None,
        proposer=SampledDrafts() if speculative else None,
    )


def target(raw_logprobs: torch.Tensor) -> torch.Tensor:
    """PARAMS' sampling distribution from raw logprobs [..., V]: temperature, then top-k."""
    probs = torch.softmax(raw_logprobs / PARAMS.temperature, dim=-1)
    kth = probs.topk(PARAMS.top_k, dim=-1).values[..., -1:]
    probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    return probs / probs.sum(-1, keepdim=True)


@pytest.fixture(scope="module")
def exact(model):
    """P(t1 t2 t3 t4) [V]*4, from prompt logprobs of every continuation (one engine pass)."""
    e = engine(model, speculative=False)
    try:
        seqs = list(itertools.product(range(V), repeat=3))
        params = SP(max_tokens=0, return_logprob=True, top_logprobs_num=V)
        hs = [
            e.submit(EngineRequest(PROMPT + s + (0,), params, prompt_logprob_start=len(PROMPT) - 1))
            for s in seqs
        ]
        dists = {}
        for s, h in zip(seqs, hs):
            lps = h.result(timeout=120).prompt_logprobs  # positions after PROMPT + s[:i]
            for i in range(4):
                row = torch.full((V,), float("-inf"))
                for alt in lps[i].top:
                    row[alt.token_id] = alt.logprob
                dists[s[:i]] = target(row)
    finally:
        e.shutdown()
    joint = torch.zeros(V, V, V, V)
    for t in itertools.product(range(V), repeat=4):
        joint[t] = dists[()][t[0]] * dists[t[:1]][t[1]] * dists[t[:2]][t[2]] * dists[t[:3]][t[3]]
    assert abs(float(joint.sum()) - 1) < 1e-4
    return joint


def sample_outputs(model) -> torch.Tensor:
    e = engine(model, speculative=True)
    try:
        # seeded requests and per-request draft RNGs: the outcome does not depend on timing
        hs = [
            e.submit(EngineRequest(PROMPT, PARAMS.merged({"seed": i})), stream=False)
            for i in range(N)
        ]
        out = torch.tensor([h.result(timeout=300).token_ids for h in hs])
        stats = e.stats()
    finally:
        e.shutdown()
    assert out.shape == (N, 4)
    assert stats["spec_verified_tokens"] > N and 0 < stats["spec_acceptance_rate"] < 0.9
    return out


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of counts against probs (cells of tiny mass pooled)."""
    counts, probs = counts.flatten().double(), probs.flatten().double()
    expected = probs * counts.sum()
    small = expected < 5
    if small.any():  # pool the sparse cells into one
        counts = torch.cat([counts[~small], counts[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    stat = float(((counts - expected) ** 2 / expected.clamp_min(1e-12)).sum())
    df = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))


def check(out: torch.Tensor, joint: torch.Tensor) -> list[float]:
    """p-values: marginals of each position and the pairs (t1, t2), (t2, t3), (t3, t4)."""
    pvalues = []
    for i in range(4):
        dims = tuple(d for d in range(4) if d != i)
        pvalues.append(chi2_pvalue(torch.bincount(out[:, i], minlength=V), joint.sum(dims)))
    for i in range(3):
        dims = tuple(d for d in range(4) if d not in (i, i + 1))
        pair = torch.bincount(out[:, i] * V + out[:, i + 1], minlength=V * V)
        pvalues.append(chi2_pvalue(pair, joint.sum(dims)))
    return pvalues


def test_sampled_speculation_keeps_the_target_distribution(model, exact):
    pvalues = check(sample_outputs(model), exact)
    assert min(pvalues) > 1e-4, pvalues


def test_a_wrong_acceptance_rule_is_detected(model, exact, monkeypatch):
    """Resampling from p instead of (p - q)+ after a rejection skews toward q's favourites."""
    right = rejection.rejection_sample

    def wrong(p, q, drafts, generators=None):
        tokens, accepted = right(p, q, drafts, generators)
        fresh = torch.multinomial(p, 1)[:, 0]
        return torch.where(accepted, tokens, fresh), accepted

    monkeypatch.setattr(rejection, "rejection_sample", wrong)
    pvalues = check(sample_outputs(model), exact)
    assert min(pvalues) < 1e-6, pvalues


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (Triton attention)")
def test_greedy_verify_on_the_gpu_matches_plain_decoding():
    """Verify entries through the Triton hybrid-attention kernels (decode steps replayed from
    CUDA graphs in the plain run), fp32 so that only the kernels' order of sums differs."""
    cfg = ModelConfig(
        "llama",
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        max_position=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_ids=(0,),
    )
    net = random_llama(cfg, 0.3, device="cuda", attention="triton")
    prompts = [tuple(range(5 + i, 25 + 3 * i)) for i in range(12)]
    params = SP(max_tokens=40, temperature=0.0, ignore_eos=True)

    def run(**kw):
        e = launch_engine(
            net,
            None,
            eos_token_ids=(0,),
            max_total_tokens=8192,
            engine_config=EngineConfig(check_integrity=True),
            **kw,
        )
        try:
            out = [
                h.result(timeout=300).token_ids
                for h in [e.submit(EngineRequest(p, params)) for p in prompts]
            ]
            return out, e.stats()
        finally:
            e.shutdown()

    plain, _ = run()
    oracle = Oracle(cfg.vocab_size, [list(p) + list(o) for p, o in zip(prompts, plain)])
    spec, stats = run(speculative=SpeculativeConfig(num_tokens=5, adaptive=False), proposer=oracle)
    assert spec == plain
    assert (
        stats["spec_accepted_tokens"] > 100
        and stats["spec_verified_tokens"] > stats["spec_accepted_tokens"]
    )
