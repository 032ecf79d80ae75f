"""The draft-model proposer on a tiny random Llama: with the draft == the target, greedy drafts
are the target's own greedy continuation; rollback, memory bounds and sampled drafts."""

from __future__ import annotations

import json

import pytest
import torch
from engine_testing import random_llama
from spec_testing import requires_default_model

from lmprog.core.sampling import SamplingParams as SP
from lmprog.runtime.config import SchedulerConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.models import ModelConfig
from lmprog.runtime.speculative import SpeculativeConfig, build_proposer
from lmprog.runtime.speculative.draft import DraftModelProposer, common_prefix_len
from lmprog.runtime.speculative.proposer import ProposalInput as PI

torch.set_num_threads(1)
TINY = ModelConfig(
    "llama",
    vocab_size=211,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    max_position=96,
)
PROMPTS = [[5, 17, 3, 99, 42, 7], [1, 2, 3], [200, 10, 10, 10, 4, 8, 15, 16, 23, 42], [77]]


@pytest.fixture(scope="module")
def model():
    """Random weights (std 0.3) so the continuation depends on the whole context."""
    return random_llama(TINY, 0.3)


def next_logits(model, tokens):
    """The target's logits after `tokens`, recomputed from scratch (no shared state)."""
    param = next(model.parameters())
    kv = KVPool.for_model(model.config, len(tokens), param.dtype, param.device)
    table = torch.arange(1, len(tokens) + 1, dtype=torch.int32, device=param.device)[None, :]
    batch = ForwardBatch.build(
        input_ids=tokens,
        out_cache_loc=range(1, len(tokens) + 1),
        req_pool_indices=[0],
        seq_lens=[len(tokens)],
        extend_lens=[len(tokens)],
        req_to_token=table,
    )
    with torch.inference_mode():
        return model(batch, kv)[0]


def greedy_continuation(model, tokens, k):
    tokens = list(tokens)
    for _ in range(k):
        tokens.append(int(next_logits(model, tokens).argmax()))
    return tokens[-k:]


def proposer(model, **kw):
    return DraftModelProposer(model, vocab_size=TINY.vocab_size, **kw)


def drafts(prop, seqs, k=4, params=None):
    out = prop.propose([PI(i, s, k, params) for i, s in enumerate(seqs)])
    return [list(p.token_ids) for p in out]


@pytest.fixture(scope="module")
def reference(model):
    return [greedy_continuation(model, p, 6) for p in PROMPTS]


def test_greedy_drafts_are_the_targets_greedy_continuation(model, reference):
    prop = proposer(model, max_total_tokens=512)
    out = prop.propose([PI(i, p, 4) for i, p in enumerate(PROMPTS)])
    assert [list(p.token_ids) for p in out] == [r[:4] for r in reference]
    assert all(p.probs is None for p in out)
    # the next round after full acceptance (draft tokens + the target's bonus) continues it
    accepted = [p + r[:5] for p, r in zip(PROMPTS, reference)]
    assert drafts(prop, accepted, k=1) == [greedy_continuation(model, a, 1) for a in accepted]
    prop.check_integrity()


def test_requests_with_different_k_in_one_batch(model, reference):
    prop = proposer(model, max_total_tokens=512)
    out = prop.propose([PI("a", PROMPTS[0], 1), PI("b", PROMPTS[1], 5), PI("c", PROMPTS[2], 3)])
    assert [list(p.token_ids) for p in out] == [
        reference[0][:1],
        reference[1][:5],
        reference[2][:3],
    ]
    prop.check_integrity()


@pytest.mark.parametrize("split", [0, 4])
@pytest.mark.parametrize("accepted", [0, 2, 4])
def test_rollback_after_a_rejection_equals_a_fresh_proposer(model, reference, accepted, split):
    prop = proposer(model, max_total_tokens=512)
    prop.split_extend_limit = split  # 4: short extends as one-token steps (the GPU's way)
    first = drafts(prop, PROMPTS)
    # the target accepted `accepted` drafts, then sampled its own (different) token
    bonus = [
        (d[accepted] + 1) % TINY.vocab_size if accepted < 4 else r[4]
        for d, r in zip(first, reference)
    ]
    seqs = [p + d[:accepted] + [b] for p, d, b in zip(PROMPTS, first, bonus)]
    again = drafts(prop, seqs)
    assert again == drafts(proposer(model, max_total_tokens=512), seqs)
    assert again[0] == greedy_continuation(model, seqs[0], 4)
    # every request holds exactly its sequence plus the 3 drafts fed back
    used = prop.cache.allocator.num_slots - prop.cache.num_free_slots
    assert used == sum(len(s) + 3 for s in seqs)
    prop.check_integrity()


def test_rewritten_prefix_and_repeated_calls(model):
    prop = proposer(model, max_total_tokens=512)
    seq = PROMPTS[2]
    drafts(prop, [seq])
    rewritten = seq[:4] + [9, 9]  # e.g. a boundary retokenization changed the tail
    assert drafts(prop, [rewritten]) == [greedy_continuation(model, rewritten, 4)]
    assert drafts(prop, [rewritten]) == drafts(prop, [rewritten])  # nothing new: refeeds one
    prop.check_integrity()


def test_short_extends_of_different_lengths_as_one_token_steps(model):
    prop = proposer(model, max_total_tokens=512)
    prop.split_extend_limit = 4
    first = drafts(prop, PROMPTS)
    seqs = [
        PROMPTS[0] + [(first[0][0] + 1) % 211],  # rejected at once: extend 1
        PROMPTS[1] + first[1] + [3],  # all accepted: extend 2
        PROMPTS[2][:-1] + [9, 9],  # tail rewritten: extend 3
        PROMPTS[3] + [5, 5, 5],
    ]  # extend 4
    assert drafts(prop, seqs) == [greedy_continuation(model, s, 4) for s in seqs]
    prop.check_integrity()


def test_release_frees_every_slot(model):
    prop = proposer(model, max_total_tokens=256)
    baseline = prop.cache.num_free_slots
    drafts(prop, PROMPTS)
    assert prop.cache.num_free_slots < baseline
    for i in range(len(PROMPTS)):
        prop.release(i)
    prop.release("never seen")
    assert prop.cache.num_free_slots == baseline and len(prop.cache) == 0
    prop.check_integrity()


def test_vocab_mismatch_is_refused(model):
    with pytest.raises(ValueError, match="tokenizer"):
        DraftModelProposer(model, vocab_size=TINY.vocab_size + 1)
    with pytest.raises(ValueError, match="tokenizer"):  # checked before any weight is loaded
        DraftModelProposer.load(TINY, vocab_size=49152, load_format="dummy", device="cpu")


def test_full_pool_gives_empty_proposals_and_recovers(model, reference):
    long = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    prop = proposer(model, max_total_tokens=20)  # room for one request of 10 + 3 drafts
    out = drafts(prop, [PROMPTS[2], long])
    assert out[0] == reference[2][:4] and out[1] == []
    assert prop.num_skipped == 1
    # the next call without request 0: its idle state is evicted to make room
    (p,) = prop.propose([PI(1, long, 4)])
    assert list(p.token_ids) == greedy_continuation(model, long, 4)
    assert prop.cache.num_evicted == 1
    prop.check_integrity()


def test_too_few_rows_and_too_long_requests_get_empty_proposals(model, reference):
    prop = proposer(model, max_total_tokens=512, max_requests=1, context_length=12)
    out = drafts(prop, [PROMPTS[0], PROMPTS[1]])
    assert out == [reference[0][:4], []]
    too_long = list(range(1, 14))
    assert prop.propose([PI("x", too_long, 4)])[0].token_ids == ()
    # k is capped so that the fed drafts fit the table: 10 tokens + 2 drafts end at 12
    assert prop.propose([PI("y", PROMPTS[2], 4)])[0].token_ids == tuple(reference[2][:3])
    prop.check_integrity()


def test_the_engines_limits_reach_the_draft_model(model, tmp_path):
    """build_proposer / launch_engine size the draft for the engine's max_running_requests and
    context length (DraftModelProposer alone: 64 rows, the draft's max_position)."""
    (tmp_path / "config.json").write_text(
        json.dumps(
            {  # a tiny draft "checkpoint"
                "model_type": "llama",
                "vocab_size": TINY.vocab_size,
                "hidden_size": 16,
                "intermediate_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "max_position_embeddings": 80,
            }
        )
    )
    cfg = SpeculativeConfig(
        method="draft",
        draft_model=str(tmp_path),
        draft_load_format="dummy",
        num_tokens=2,
        adaptive=False,
    )
    prop = build_proposer(cfg, vocab_size=TINY.vocab_size, max_requests=100, context_length=60)
    assert (prop.cache.num_rows, prop.context_length) == (100, 60)
    assert tuple(prop.req_to_token.shape) == (100, 60)
    prop = build_proposer(cfg, vocab_size=TINY.vocab_size, context_length=500)
    assert (prop.cache.num_rows, prop.context_length) == (64, 80)  # capped by the draft
    eng = launch_engine(
        model,
        None,
        eos_token_ids=(0,),
        max_total_tokens=2048,
        context_length=72,
        scheduler_config=SchedulerConfig(max_running_requests=80, max_num_batched_tokens=512),
        speculative=cfg,
    )
    try:
        prop = eng.speculator.proposer
        assert (prop.cache.num_rows, prop.context_length) == (80, 72)
        params = SP(max_tokens=4, temperature=0.0, ignore_eos=True)
        handles = [
            eng.submit(EngineRequest((1 + i % 50, 2, 3, 4 + i % 7), params), stream=False)
            for i in range(70)
        ]
        assert all(h.result(timeout=120).completion_tokens == 4 for h in handles)
        stats = eng.stats()  # up to 70 requests decoding together, every one drafted for
        assert stats["spec_verified_tokens"] >= 70 * 2 and prop.num_skipped == 0, stats
    finally:
        eng.shutdown()


def test_sampled_drafts_return_their_distribution(model):
    params = SP(temperature=0.7, top_k=20, seed=11)
    prop = proposer(model, max_total_tokens=512)
    (p,) = prop.propose([PI(0, PROMPTS[0], 3, params)])
    assert p.probs.shape == (3, TINY.vocab_size)
    assert torch.allclose(p.probs.sum(-1), torch.ones(3))
    assert ((p.probs > 0).sum(-1) <= 20).all()
    assert all(p.probs[i, t] > 0 for i, t in enumerate(p.token_ids))
    # with draft == target, row 0 is the target's tempered, top-20 distribution
    want = torch.softmax(next_logits(model, PROMPTS[0]) / 0.7, -1)
    want[want < want.topk(20).values[-1]] = 0
    torch.testing.assert_close(p.probs[0], want / want.sum(), rtol=1e-4, atol=1e-6)
    # seeded: a fresh proposer draws the same chain, also next to a greedy request
    (q, _) = proposer(model, max_total_tokens=512).propose(
        [PI(0, PROMPTS[0], 3, params), PI(1, PROMPTS[1], 3)]
    )
    assert q.token_ids == p.token_ids


def test_seeded_sampled_drafts_do_not_depend_on_the_batch(model):
    hot = SP(temperature=1.0, seed=5)
    cool = SP(temperature=0.5, top_p=0.9, seed=6)
    batch = proposer(model, max_total_tokens=512).propose(
        [PI("a", PROMPTS[0], 2, hot), PI("b", PROMPTS[2], 5, cool), PI("c", PROMPTS[1], 3)]
    )
    alone = [
        proposer(model, max_total_tokens=512).propose([PI(r, p, k, sp)])[0]
        for r, p, k, sp in (("a", PROMPTS[0], 2, hot), ("b", PROMPTS[2], 5, cool))
    ]
    for got, want in zip(batch, alone):
        assert got.token_ids == want.token_ids and len(got.token_ids) == got.probs.shape[0]
        torch.testing.assert_close(got.probs, want.probs)
    assert batch[2].probs is None and len(batch[2].token_ids) == 3


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2 and common_prefix_len([], [1]) == 0
    assert common_prefix_len(list(range(100)), list(range(37)) + [0]) == 37


def test_bad_token_ids_and_duplicate_rids(model):
    prop = proposer(model, max_total_tokens=64)
    with pytest.raises(ValueError, match="token ids"):
        prop.propose([PI(0, [1, TINY.vocab_size], 2)])
    with pytest.raises(ValueError, match="token ids"):  # the first one's reservation is undone
        prop.propose([PI(1, [1, 2, 3], 2), PI(2, [-1], 2)])
    assert prop.cache.num_free_slots == prop.cache.allocator.num_slots and len(prop.cache) == 0
    with pytest.raises(ValueError, match="at most once"):
        prop.propose([PI(0, [1], 2), PI(0, [1], 2)])
    with pytest.raises(ValueError, match="max_tokens"):
        prop.propose([PI(0, [1], 0)])
    prop.check_integrity()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_with_graphs_the_drafts_are_the_eager_targets_continuation():
    cfg = ModelConfig(
        "llama",
        vocab_size=211,
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        max_position=256,
    )
    prop = DraftModelProposer.load(
        cfg,
        vocab_size=211,
        device="cuda",
        dtype="float32",
        load_format="dummy",
        max_total_tokens=2048,
        max_requests=8,
    )
    assert prop.graphs is not None  # Triton attention: decode steps replay CUDA graphs
    with torch.no_grad():
        for p in prop.model.parameters():
            p.mul_(15)  # sharp distributions: a wrong key or position changes the argmax
    first = drafts(prop, PROMPTS)
    assert first == [greedy_continuation(prop.model, p, 4) for p in PROMPTS]
    seqs = [p + d[:1] + [(d[1] + 1) % 211] for p, d in zip(PROMPTS, first)]  # 1 accepted
    replays = prop.graphs.replays
    assert drafts(prop, seqs) == [greedy_continuation(prop.model, s, 4) for s in seqs]
    assert prop.graphs.replays - replays == 4  # the 1-token extend is a graph batch too
    seqs = [s + d + [7] for s, d in zip(seqs, drafts(prop, seqs))]  # all 4 accepted
    replays = prop.graphs.replays
    assert drafts(prop, seqs) == [greedy_continuation(prop.model, s, 4) for s in seqs]
    assert prop.graphs.replays - replays == 5  # the 2-token extend as 2 graph steps
    prop.check_integrity()


@pytest.mark.e2e
@requires_default_model
def test_runtime_with_the_default_model_as_its_own_draft():
    """lp.Runtime(speculative={"method": "draft", ...}) end to end (build_proposer loads the
    draft): with draft == target, greedy outputs equal plain decoding and ~every draft is
    accepted, sampled ones too (the draft's q is then the target's p)."""
    import lmprog as lp
    from lmprog.core.models import resolve_model

    # draft_cost 0.0: a draft as large as the target costs a whole step per draft, so the
    # measured cost (draft_cost=None) would rightly stop speculation; this tests the path
    rt = lp.Runtime(
        device="cpu",
        max_total_tokens=2048,
        speculative={
            "method": "draft",
            "draft_model": resolve_model().name,
            "num_tokens": 4,
            "draft_cost": 0.0,
        },
    )
    prompts = ["The capital of France is", "def fibonacci(n):"]
    greedy = SP(max_tokens=20, temperature=0.0, ignore_eos=True)
    try:
        with_drafts = [r.token_ids for r in rt.generate(prompts, greedy)]
        stats = rt.stats()
        rt.generate(
            prompts, SP(max_tokens=12, temperature=0.8, top_p=0.95, seed=3, ignore_eos=True)
        )
        sampled = rt.stats()
        rt.engine.set_speculation(False)
        assert [r.token_ids for r in rt.generate(prompts, greedy)] == with_drafts
        assert stats["spec_verified_tokens"] >= 20
        assert stats["spec_acceptance_rate"] >= 0.95
        verified = sampled["spec_verified_tokens"] - stats["spec_verified_tokens"]
        assert verified >= 8
        assert sampled["spec_accepted_tokens"] - stats["spec_accepted_tokens"] >= 0.9 * verified
        proposer = rt.engine.speculator.proposer
        assert isinstance(proposer, DraftModelProposer)
        assert len(proposer.cache) == 0  # released when the requests finished
        assert proposer.cache.num_free_slots == proposer.cache.allocator.num_slots
        rt.engine.check_integrity()
    finally:
        rt.shutdown()
