"""Token-tree speculation: the tree arithmetic, tree attention in both backends against the
reference (paged KV, masks of many shapes), verification over trees without a model (outputs
of plain decoding, greedy and seeded; the target distribution at temperature 1 with sampled
sibling drafts), the accepted path's KV equal to plain decoding's in a real model, and
trees through the engine (greedy identity, constraints, abort mid-tree, n-gram trees)."""

from __future__ import annotations

import functools
import re
from dataclasses import replace

import engine_testing
import numpy as np
import pytest
import torch
from engine_testing import EOS, engine_for, greedy, random_llama, run_all, tok  # noqa: F401
from spec_testing import TreeOracle
from triton_testing import one_thread, requires_triton  # noqa: F401

from lmprog.core.sampling import SamplingParams as SP
from lmprog.decoding.batch_sampler import BatchSampler
from lmprog.decoding.decode_state import DecodeState
from lmprog.decoding.rejection import sibling_rejection
from lmprog.decoding.rng import make_generator
from lmprog.fsm.index import TokenIndex
from lmprog.runtime.config import CacheConfig, SchedulerConfig
from lmprog.runtime.draft_tree import (
    depths,
    first_branch,
    mask_block,
    path_moves,
    prune,
    walk,
)
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.step_outputs import StepOutputs
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.executor.model_runner import ModelRunner
from lmprog.runtime.kernels.attention_ref import hybrid_attention_ref
from lmprog.runtime.layers.attention import create_attention_backend
from lmprog.runtime.request import Req, ReqOutputs, ReqStatus
from lmprog.runtime.scheduler import Scheduler
from lmprog.runtime.speculative import Proposal, Proposer, SpeculativeConfig
from lmprog.runtime.speculative.ngram import NgramProposer, lookup, lookup_tree

torch.set_num_threads(1)


# ---- the tree arithmetic ---------------------------------------------------------------------
def test_tree_arithmetic():
    parents = (-1, 0, -1, 2, 0, 3)
    assert depths(parents) == [0, 1, 0, 1, 1, 2]
    assert first_branch(parents) == 2
    drafts = (5, 6, 7, 8, 9, 4)
    assert walk(drafts, parents, [7, 8, 4, 1]) == [2, 3, 5]
    assert walk(drafts, parents, [5, 9, 1]) == [0, 4]
    assert walk(drafts, None, [5, 6, 1]) == [0, 1]
    assert path_moves([2, 3, 5]) == [(2, 0), (3, 1), (5, 2)]
    assert path_moves([0, 1]) == []
    assert prune(parents, [True, True, False, True, True, True]) == ([0, 1, 4], (-1, 0, 0))
    m = mask_block(2, parents, 10)  # prefix 2, real tokens at 2..3, drafts at 4..9
    assert m[:, :2].all() and m[0, 2] and not m[0, 3] and m[1, 2:4].all()
    assert [np.flatnonzero(m[2 + i, 4:]).tolist() for i in range(6)] == [
        [0], [0, 1], [2], [2, 3], [0, 4], [2, 3, 5],
    ]  # fmt: skip
    with pytest.raises(ValueError, match="earlier draft"):
        Proposal((1, 2), parents=(-1, 1))
    with pytest.raises(ValueError, match="one parent per token"):
        Proposal((1, 2), parents=(-1,))


def test_ngram_trees_merge_continuations_of_several_matches():
    seq = np.array([5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2, 3, 8, 1, 2])
    ids, parents = lookup_tree(seq, 1, 3, 6, 3)
    # the chain lookup proposes is the first branch; the other match's "4" a sibling of "3"
    first = first_branch(parents)
    assert first >= 3 and ids[:first] == lookup(seq, 1, 3, first).tolist()
    assert len(ids) <= 6 and 4 in ids and parents[ids.index(4)] == -1
    p = NgramProposer(1, 3, branches=3)
    from lmprog.runtime.speculative import ProposalInput

    (prop,) = p.propose([ProposalInput(0, seq.tolist(), 6)])
    assert prop.token_ids == tuple(ids) and prop.parents == tuple(parents)
    with pytest.raises(ValueError, match="branches"):
        NgramProposer(1, 3, branches=0)


# ---- tree attention against the reference -----------------------------------------------------
HQ, HKV, D = 6, 2, 16


def _tree_batch(seed, dtype=torch.float32):
    """Random requests: decodes, prefill chunks, chains and trees of random shapes (each a
    verify entry of 1-3 real tokens then 1-9 drafts), scattered slots, random pool."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    kinds = rng.choice(["decode", "prefill", "tree", "tree", "tree"], size=6)
    reqs, blocks, indptr, at = [], [], [], 0
    for kind in kinds:
        prefix = int(rng.integers(0, 30))
        if kind == "decode":
            reqs.append((prefix + 1, 1))
            indptr.append(-1)
            continue
        if kind == "prefill":
            n = int(rng.integers(2, 12))
            reqs.append((prefix + n, n))
            indptr.append(-1)
            continue
        real, n = int(rng.integers(1, 4)), int(rng.integers(1, 10))
        parents = [int(rng.integers(-1, i)) for i in range(n)]  # any shape, chains included
        seq = prefix + real + n
        block = mask_block(real, parents, seq)
        reqs.append((seq, real + n))
        blocks.append(torch.from_numpy(block.reshape(-1)))
        indptr.append(at)
        at += block.size
    if not blocks:  # every batch here has a tree
        return _tree_batch(seed + 1000, dtype)
    num_slots = 4 * sum(s for s, _ in reqs) + 8
    kv = KVPool(num_slots, 1, HKV, D, dtype, "cpu")
    kv.k[0].copy_(torch.randn(kv.k[0].shape, generator=g) * 2)
    kv.v[0].copy_(torch.randn(kv.v[0].shape, generator=g))
    r2t = torch.zeros(len(reqs) + 2, 64, dtype=torch.int32)
    rows = torch.randperm(r2t.shape[0], generator=g)[: len(reqs)].tolist()
    free = (torch.randperm(num_slots, generator=g) + 1).tolist()
    locs = []
    for row, (s, n) in zip(rows, reqs):
        slots = [free.pop() for _ in range(s)]
        r2t[row, :s] = torch.tensor(slots)
        locs += slots[s - n :]
    t = sum(n for _, n in reqs)
    batch = ForwardBatch.build(
        input_ids=[0] * t,
        out_cache_loc=locs,
        req_pool_indices=rows,
        seq_lens=[s for s, _ in reqs],
        extend_lens=[n for _, n in reqs],
        req_to_token=r2t,
        custom_mask=torch.cat(blocks),
        mask_indptr=indptr,
    )
    q = (torch.randn(t, HQ, D, generator=g) * 2).to(dtype)
    return batch, kv, q


def _reference(batch, kv, q):
    return hybrid_attention_ref(
        q, kv.k[0], kv.v[0], batch.req_to_token, batch.req_pool_indices, batch.seq_lens,
        batch.extend_lens, batch.extend_start_loc, custom_mask=batch.custom_mask,
        mask_indptr=batch.mask_indptr,
    )  # fmt: skip


def _attend(name, batch, kv, q):
    backend = create_attention_backend(name, HQ, HKV, D, "cpu")
    with torch.inference_mode():
        return backend.forward(q, None, None, 0, kv, backend.plan(batch))


@pytest.mark.parametrize("seed", range(5))
def test_torch_backend_tree_masks_match_the_reference(seed):
    batch, kv, q = _tree_batch(seed)
    ref = _reference(batch, kv, q)
    torch.testing.assert_close(_attend("torch", batch, kv, q), ref, atol=2e-5, rtol=2e-5)
    causal = hybrid_attention_ref(q, kv.k[0], kv.v[0], *_tensors(batch))
    assert not torch.allclose(causal, ref, atol=1e-3)  # the masks matter


def test_mask_offsets_and_table_columns():
    batch, _, _ = _tree_batch(3)
    offsets = batch.mask_offsets()
    assert offsets == batch.mask_indptr.tolist() and min(offsets) == -1
    with pytest.raises(ValueError, match="runs past custom_mask"):
        ForwardBatch.build(input_ids=[0, 0], out_cache_loc=[1, 2], req_pool_indices=[0],
                           seq_lens=[4], extend_lens=[2], req_to_token=batch.req_to_token,
                           custom_mask=torch.ones(7, dtype=torch.bool), mask_indptr=[0])  # fmt: skip
    # a mirrored table (GPU) is written at each fed token's column, not its position
    from lmprog.runtime.executor.model_runner import _columns

    cols = _columns(torch.tensor([7, 3, 10]), torch.tensor([3, 1, 4]), 8)
    assert cols.tolist() == [4, 5, 6, 2, 6, 7, 8, 9]


def _tensors(batch):
    return (batch.req_to_token, batch.req_pool_indices, batch.seq_lens, batch.extend_lens,
            batch.extend_start_loc)  # fmt: skip


@requires_triton
@pytest.mark.parametrize("seed", range(2))
def test_triton_backend_tree_masks_match_the_reference(seed, one_thread):
    batch, kv, q = _tree_batch(seed)  # fp32: the interpreter's bf16 dot is not exact
    out = _attend("triton", batch, kv, q)
    torch.testing.assert_close(out, _reference(batch, kv, q), atol=1e-4, rtol=1e-4)


# ---- verification over trees, without a model --------------------------------------------------
V = 16


def row_for(seq) -> torch.Tensor:
    """The 'model': next-token logits of a sequence (random, a function of it)."""
    return _row(tuple(seq))


@functools.lru_cache(maxsize=1 << 16)
def _row(seq: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash(seq) % (1 << 31))
    return torch.randn(V, generator=g) * 2


def logits_for(batch) -> torch.Tensor:
    """Rows as a model would give them: a tree draft's row follows its ancestors only."""
    rows = []
    for e in batch.entries:
        if e.logits_from is None:
            continue
        real = e.req.token_ids[: e.end - e.num_draft]
        seqs = [real[: p + 1] for p in range(e.logits_from, e.end - e.num_draft)]
        for i in range(e.num_draft):
            path, node = [], i
            while node != -1:
                path.append(e.draft_ids[node])
                node = node - 1 if e.draft_parents is None else e.draft_parents[node]
            seqs.append(real + path[::-1])
        rows += [row_for(s) for s in seqs]
    return torch.stack(rows) if rows else torch.empty(0, V)


class Harness:
    """Scheduler + StepOutputs as the engine drives them; trees from `trees(req)` ->
    (ids, parents, probs or None)."""

    def __init__(self, trees=None, slots=600, budget=64, max_reqs=16, check=True, **sched):
        self.s = Scheduler(
            slots,
            128,
            SchedulerConfig(max_num_batched_tokens=budget, max_running_requests=max_reqs, **sched),
            CacheConfig(page_size=1),
        )
        self.out = StepOutputs(BatchSampler((0,)))
        self.trees, self.check = trees, check
        self.probs: dict = {}
        self.accepted = self.moves = self.tree_entries = 0

    def submit(self, rid, prompt, params):
        req = Req(rid, prompt, params)
        req.engine_data = DecodeState(params, tokenizer=None, prompt_ids=prompt,
                                      eos_token_ids=(0,), vocab_size=V, token_text=str,
                                      outputs=ReqOutputs(req))  # fmt: skip
        return self.s.submit(req)

    def step(self):
        self.probs.clear()
        if self.trees is not None:
            for r in self.s.decoding():
                ids, parents, probs = self.trees(r)
                r.draft_ids, r.draft_parents = list(ids), parents
                if probs is not None:
                    self.probs[r.rid] = probs
        batch = self.s.schedule()
        self.tree_entries += sum(e.draft_parents is not None for e in batch.entries)
        res = self.out.process(batch, logits_for(batch), lambda r: self.probs.get(r.rid))
        self.record(batch, res)
        return batch, res

    def record(self, batch, res):
        self.accepted += res.num_accepted
        self.s.process_results(batch, res.reasons)
        moves = self.s.take_kv_moves()
        self.moves += 0 if moves is None else len(moves.src)
        if not self.check:
            return
        self.s.check_integrity()
        for r in self.s.requests.running_reqs():  # nothing of a rejected branch survives
            assert r.num_allocated == r.num_computed and r.draft_ids == []

    def run(self):
        while self.s.has_work:
            self.step()


def plain(prompts, params):
    h = Harness()
    reqs = [h.submit(i, p, params) for i, p in enumerate(prompts)]
    h.run()
    return [r.engine_data.output_ids for r in reqs]


def oracle_tree(reference):
    """A tree whose right branch is not always first: per position a wrong sibling, the
    reference token (on the first branch, or second), and a wrong child below the wrong one."""
    calls = [0]

    def trees(req):
        ref = reference[req.rid]
        done = len(req.engine_data.output_ids)
        chain = ref[done : done + 3]
        calls[0] += 1
        ids, parents, parent = [], [], -1
        for j, t in enumerate(chain):
            wrong = (t + 1 + j) % V
            at = len(ids)
            if (calls[0] + j) % 2:  # the right token first
                ids += [t, wrong]
                parents += [parent, parent]
                parent = at
            else:  # behind a wrong sibling with a child of its own
                ids += [wrong, (wrong + 3) % V, t]
                parents += [parent, at, parent]
                parent = at + 2
        return ids, (tuple(parents) if ids else None), None

    return trees


PROMPTS = [[3, 4, 5], [7, 8], [9, 10, 11, 12, 13], [5, 4, 3, 2]]


@pytest.mark.parametrize(
    "params",
    [
        SP(max_tokens=14, temperature=0.0, ignore_eos=True),
        SP(max_tokens=14, temperature=1.0, seed=5, ignore_eos=True),  # seeded sampling
        SP(max_tokens=12, temperature=0.0, frequency_penalty=1.5, min_tokens=4),  # EOS is 0
    ],
    ids=["greedy", "seeded-sampling", "penalty-min-tokens"],
)
def test_tree_verification_reproduces_plain_decoding(params):
    ref = plain(PROMPTS, params)
    h = Harness(oracle_tree(dict(enumerate(ref))))
    reqs = [h.submit(i, p, params) for i, p in enumerate(PROMPTS)]
    h.run()
    assert [r.engine_data.output_ids for r in reqs] == ref
    assert h.tree_entries >= 8 and h.accepted >= 8 and h.moves > 0


def test_abort_and_retraction_mid_tree():
    params = SP(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = [[i, i + 1, i + 2] for i in range(1, 9)]
    ref = plain(prompts, params)
    h = Harness(oracle_tree(dict(enumerate(ref))), slots=110, budget=40,
                init_new_token_ratio=0.01, min_new_token_ratio=0.01)  # fmt: skip
    reqs = [h.submit(i, p, params) for i, p in enumerate(prompts)]
    while True:
        for r in h.s.decoding():
            ids, parents, _ = h.trees(r)
            r.draft_ids, r.draft_parents = list(ids), parents
        batch = h.s.schedule()
        trees = [e.req for e in batch.entries if e.draft_parents is not None]
        if len(trees) >= 2:
            break
        h.record(batch, h.out.process(batch, logits_for(batch)))
    victim = trees[-1]  # aborted while its tree is in flight
    h.s.abort(victim.rid)
    h.record(batch, h.out.process(batch, logits_for(batch)))
    assert victim.status is ReqStatus.FINISHED and victim.num_allocated == 0
    h.run()
    assert h.s.num_retractions > 0
    for r, want in zip(reqs, ref):
        if r is not victim:
            assert r.engine_data.output_ids == want
    cache = h.s.cache
    assert cache.allocator.num_free + cache.prefix_cache.evictable_size == cache.capacity


# ---- the distribution at temperature 1 ---------------------------------------------------------
def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of counts against probs (cells of tiny mass pooled)."""
    counts, probs = counts.flatten().double(), probs.flatten().double()
    expected = probs * counts.sum()
    small = expected < 5
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    stat = float(((counts - expected) ** 2 / expected.clamp_min(1e-12)).sum())
    df = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))


# Tolerance of the statistical tests: a p-value above 1e-3 (fixed seeds: the outcome is
# deterministic; a correct rule fails one test in a thousand seeds, the wrong rules below
# give p-values under 1e-12).
ALPHA = 1e-3


def _sibling_counts(rule, n=2000):
    p = torch.softmax(torch.tensor([1.0, 0.2, -0.5, 0.8, 0.0, -1.0]), 0)
    qs = torch.tensor([[0.5, 0.1, 0.1, 0.1, 0.1, 0.1], [0.05, 0.05, 0.6, 0.1, 0.1, 0.1],
                       [0.1, 0.1, 0.1, 0.1, 0.5, 0.1]])  # fmt: skip
    g = torch.Generator().manual_seed(0)
    all_drafts = torch.stack([torch.multinomial(q, n, True, generator=g) for q in qs], 1).tolist()
    counts = torch.zeros(6)
    for i, drafts in enumerate(all_drafts):
        token, j = rule(p, qs, drafts, make_generator(i))
        assert j == -1 or drafts[j] == token
        counts[token] += 1
    return counts, p


def test_sibling_rejection_keeps_the_target_distribution():
    counts, p = _sibling_counts(sibling_rejection)
    assert chi2_pvalue(counts, p) > ALPHA

    def no_residual(p, q, drafts, gen):  # wrong: a rejection leaves p as it was
        for j, d in enumerate(drafts):
            if float(torch.rand(())) * q[j, d] < p[d]:
                return d, j
        return int(torch.multinomial(p, 1)), -1

    torch.manual_seed(0)
    counts, p = _sibling_counts(no_residual, 1000)
    assert chi2_pvalue(counts, p) < 1e-12


Q = torch.softmax(torch.arange(V, dtype=torch.float32) % 5 - 2.0, 0)  # far from the model's


def sampled_trees(req):
    """Two siblings per position (drawn from Q), the first one's child two more: a tree of 4
    with its draft distributions."""
    g = torch.Generator().manual_seed(10_000 * (1 + req.rid) + len(req.token_ids))
    d = torch.multinomial(Q, 4, replacement=True, generator=g).tolist()
    return d, (-1, -1, 0, 0), Q.expand(4, V).clone()


def test_sampled_tree_drafts_keep_the_target_distribution():
    """Chi-square of the first 3 tokens of 1000 seeded requests at temperature 1 against the
    exact joint distribution of the 'model', positions and pairs. (6 tokens each, so that the
    verify after the prefill holds the whole tree: the cap is remaining tokens - 1.)"""
    params = SP(max_tokens=6, temperature=1.0, ignore_eos=True)
    prompt = [1, 2]
    h = Harness(sampled_trees, slots=4000, budget=512, max_reqs=128, check=False)
    n = 1000
    reqs = [h.submit(i, prompt, params.merged({"seed": i})) for i in range(n)]
    h.run()
    out = torch.tensor([list(r.engine_data.output_ids[:3]) for r in reqs])
    assert h.tree_entries > n and 0 < h.accepted < h.tree_entries * 2
    joint = torch.zeros(V, V, V)
    p0 = torch.softmax(row_for(prompt), 0)
    for a in range(V):
        p1 = torch.softmax(row_for(prompt + [a]), 0)
        for b in range(V):
            joint[a, b] = p0[a] * p1[b] * torch.softmax(row_for(prompt + [a, b]), 0)
    pvalues = [
        chi2_pvalue(
            torch.bincount(out[:, i], minlength=V), joint.sum(tuple(d for d in range(3) if d != i))
        )
        for i in range(3)
    ]
    pair = torch.bincount(out[:, 0] * V + out[:, 1], minlength=V * V)
    pvalues.append(chi2_pvalue(pair, joint.sum(2)))
    assert min(pvalues) > ALPHA, pvalues


# ---- the accepted path's KV in a real model ----------------------------------------------------
SMALL = replace(engine_testing.TINY, vocab_size=64, max_position=128)


def test_accepted_path_kv_equals_plain_decoding():
    """A tree verify step whose accepted path is not the first branch: after the moves, the
    request's KV at every computed position is what plain decoding of the same tokens
    computes, and the next logits agree."""
    model = random_llama(SMALL, 0.3, seed=1)
    prompt = [5, 9, 13, 17, 21]

    def setup():
        s = Scheduler(256, 128, SchedulerConfig(max_num_batched_tokens=64), CacheConfig())
        runner = ModelRunner(model, 256, s.req_to_token, cuda_graphs=False)
        req = Req("a", prompt, SP(max_tokens=20, temperature=0.0, ignore_eos=True))
        req.engine_data = DecodeState(req.params, tokenizer=None, prompt_ids=prompt,
                                      eos_token_ids=(0,), vocab_size=64, token_text=str,
                                      outputs=ReqOutputs(req))  # fmt: skip
        s.submit(req)
        return s, runner, req, StepOutputs(BatchSampler((0,)))

    def step(s, runner, out):
        batch = s.schedule()
        res = out.process(batch, runner.forward(batch))
        s.process_results(batch, res.reasons)
        moves = s.take_kv_moves()
        if moves is not None:
            runner.copy_kv(moves)
        return batch, res

    # plain decoding: the reference tokens
    s0, r0, req0, out0 = setup()
    for _ in range(6):
        step(s0, r0, out0)
    ref = req0.engine_data.output_ids  # 6 tokens
    # speculating: after the prefill, one tree whose accepted path is its second branch
    s, runner, req, out = setup()
    step(s, runner, out)
    t1, t2, t3 = ref[1:4]
    w = (t1 + 1) % 64
    req.draft_ids = [w, (w + 1) % 64, t1, (t2 + 1) % 64, t2, t3]
    req.draft_parents = (-1, 0, -1, 2, 2, 4)
    batch, res = step(s, runner, out)
    assert batch.entries[0].draft_parents is not None
    assert res.accepted == [3] and list(res.tokens[0]) == ref[1:5]
    n = req.num_computed
    assert n == len(prompt) + 4 and req.token_ids[:n] == req0.token_ids[:n]
    # the same positions of the plain run hold the KV of the same tokens
    slots = torch.from_numpy(s.req_to_token[req.row, :n].astype(np.int64))
    slots0 = torch.from_numpy(s0.req_to_token[req0.row, :n].astype(np.int64))
    for layer in range(SMALL.num_layers):
        torch.testing.assert_close(runner.kv.k[layer][slots], r0.kv.k[layer][slots0],
                                   atol=1e-5, rtol=1e-5)  # fmt: skip
        torch.testing.assert_close(runner.kv.v[layer][slots], r0.kv.v[layer][slots0],
                                   atol=1e-5, rtol=1e-5)  # fmt: skip
    step(s, runner, out)  # decoding goes on from the moved KV: the reference's next token
    assert req.engine_data.output_ids[:6] == ref[:6]


# ---- through the engine ------------------------------------------------------------------------
TINY = replace(engine_testing.TINY, max_position=512)


@pytest.fixture(scope="module")
def model():
    return random_llama(TINY, 0.3)


@pytest.fixture(scope="module")
def plain_engine(model, tok):
    e = engine_for(model, tok)
    yield e
    e.shutdown()


PROMPTS_E = engine_testing.PROMPTS[:6]
TREES = SpeculativeConfig(num_tokens=6, adaptive=False)


def test_engine_trees_give_plain_greedy_outputs(model, tok, plain_engine):
    ref = run_all(plain_engine, PROMPTS_E, greedy(16))
    oracle = TreeOracle(TINY.vocab_size)
    oracle.learn(PROMPTS_E, ref)
    eng = engine_for(model, tok, speculative=TREES, proposer=oracle)
    try:
        out = run_all(eng, PROMPTS_E, greedy(16))
        assert [r.token_ids for r in out] == [r.token_ids for r in ref]
        stats = eng.stats()
        assert stats["spec_tree_verifies"] > 5 and stats["spec_accepted_tokens"] > 30, stats
        assert stats["steps"] < 16 * 0.6
        # abort mid-tree: a long request, stopped after its first pieces
        prompt = engine_testing.PROMPTS[12]
        oracle.learn([prompt], run_all(plain_engine, [prompt], greedy(120)))
        h = eng.submit(EngineRequest(tuple(prompt), greedy(120)))
        next(iter(h.pieces()))
        h.abort()
        assert h.result(timeout=60).finish_reason == "abort"
        eng.check_integrity()
        stats = eng.stats()
        assert stats["num_running"] == stats["num_waiting"] == 0
        assert stats["kv_used"] == stats["kv_evictable"]
    finally:
        eng.shutdown()


def test_engine_trees_under_a_constraint(model, tok, plain_engine):
    pattern = r"[a-z]{2,6}( [a-z]{2,6}){1,4}\. Score: [0-9]{2}"
    index = TokenIndex.get(pattern, tok)
    prompts = engine_testing.PROMPTS[6:9]

    def run(engine):
        hs = [engine.submit(EngineRequest(tuple(p), greedy(30), guide=index.new_guide()))
              for p in prompts]  # fmt: skip
        return [h.result(timeout=120) for h in hs]

    ref = run(plain_engine)
    oracle = TreeOracle(TINY.vocab_size)
    oracle.learn(prompts, ref)
    eng = engine_for(model, tok, speculative=TREES, proposer=oracle)
    try:
        out = run(eng)
        assert [r.token_ids for r in out] == [r.token_ids for r in ref]
        assert all(re.fullmatch(pattern, r.text) for r in out), [r.text for r in out]
        stats = eng.stats()
        assert stats["spec_guide_cuts"] > 0 and stats["spec_accepted_tokens"] > 0, stats
    finally:
        eng.shutdown()


def test_guide_prunes_forbidden_nodes_with_their_subtrees(tok):
    from lmprog.runtime.speculative.speculator import Speculator

    index = TokenIndex.get(r"ab(c|d)+", tok)
    enc = [tok.encode(x, add_special_tokens=False) for x in ("a", "b", "c", "d", "x")]
    a, b, c, d, x = (e[0] for e in enc)

    class Fixed(Proposer):
        def propose(self, inputs):
            # root: x (forbidden, its child c goes too), a -> {b -> {c, x, d}, x}
            ids = (x, c, a, b, c, x, d, x)
            return [Proposal(ids, parents=(-1, 0, -1, 2, 3, 3, 3, 2))]

    spec = Speculator(Fixed(), SpeculativeConfig(num_tokens=8, adaptive=False),
                      vocab_size=tok.vocab_size)  # fmt: skip
    req = Req(0, [1, 2], SP(max_tokens=20))
    req.engine_data = DecodeState(req.params, tokenizer=tok, prompt_ids=[1, 2],
                                  eos_token_ids=(0,), vocab_size=tok.vocab_size, token_text=str,
                                  guide=index.new_guide(), outputs=ReqOutputs(req))  # fmt: skip
    req.status = ReqStatus.RUNNING
    spec.propose([(req, 8)])
    assert req.draft_ids == [a, b, c, d] and req.draft_parents == (-1, 0, 1, 1)
    assert spec.guide_cuts == 3 and spec.draft_probs(req) is None

    class Sampled(Fixed):  # the same tree, drawn from uniform distributions
        def propose(self, inputs):
            (prop,) = super().propose(inputs)
            return [Proposal(prop.token_ids, torch.full((8, tok.vocab_size), 1.0 / tok.vocab_size),
                             prop.parents)]  # fmt: skip

    spec.set_proposer(Sampled())
    spec.propose([(req, 8)])
    assert req.draft_ids == [a, b, c, d]
    q = spec.draft_probs(req)  # each kept node's row, restricted to what its parent allows
    assert q.shape == (4, tok.vocab_size)
    torch.testing.assert_close(q.sum(1), torch.ones(4))
    assert q[0, a] > 0 and q[0, x] == 0 and q[1, b] > 0 and q[1, a] == 0
    assert q[2, c] > 0 and q[2, d] > 0 and q[2, x] == 0 and torch.equal(q[2], q[3])


def test_trees_are_chains_without_tree_support():
    from lmprog.runtime.speculative.speculator import Speculator

    class Fixed(Proposer):
        def propose(self, inputs):
            return [Proposal((4, 5, 6, 7), parents=(-1, 0, -1, 1))]

    spec = Speculator(Fixed(), SpeculativeConfig(adaptive=False), vocab_size=64, trees=False)
    req = Req(0, [1, 2], SP(max_tokens=20))
    req.engine_data = DecodeState(req.params, tokenizer=None, prompt_ids=[1, 2],
                                  eos_token_ids=(0,), vocab_size=64, token_text=str,
                                  outputs=ReqOutputs(req))  # fmt: skip
    spec.propose([(req, 8)])
    # the path of each node's first child: 4 -> 5 -> 7 (6 is 4's sibling)
    assert req.draft_ids == [4, 5, 7] and req.draft_parents is None
