"""Draft heads (EAGLE-3, Medusa): the published checkpoint layouts, the target's hidden states
captured in the forward pass, the EAGLE proposer's incremental state against a from-scratch
recomputation, and greedy / seeded outputs unchanged through the engine and lp.Runtime."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import pytest
import torch
from engine_testing import EOS, engine_for, random_llama, run_all
from safetensors.torch import load_file, save_file
from spec_testing import (
    HEAD_PROMPTS,
    HEAD_TARGET,
    published_state,
    requires_default_model,
    write_head,
)
from triton_testing import (  # noqa: F401 - one_thread is a fixture
    one_thread,
    requires_triton,
    run_captured,
    run_uncaptured,
    setup,
)

from lmprog.core.sampling import SamplingParams as SP
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.executor.cuda_graph import CudaGraphRunner
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.models.llama import HiddenCapture
from lmprog.runtime.speculative import SpeculativeConfig, build_proposer
from lmprog.runtime.speculative.eagle import EagleProposer
from lmprog.runtime.speculative.eagle1_files import build_eagle1
from lmprog.runtime.speculative.head_build import BUNDLED_EAGLE3, dummy_eagle3_config
from lmprog.runtime.speculative.head_files import (
    build_eagle3,
    load_eagle3,
    load_medusa,
    save_eagle3,
    save_medusa,
)
from lmprog.runtime.speculative.head_proposer import DynamicTree, spine, tree_depth, tree_nodes
from lmprog.runtime.speculative.heads import Eagle1Config, MedusaHeads
from lmprog.runtime.speculative.medusa import MedusaProposer
from lmprog.runtime.speculative.proposer import Proposal
from lmprog.runtime.speculative.proposer import ProposalInput as PI

torch.set_num_threads(1)
TINY, PROMPTS = HEAD_TARGET, HEAD_PROMPTS
EAGLE_NAMES = {
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
}  # fmt: skip


@pytest.fixture(scope="module")
def model():
    from engine_testing import random_llama

    return random_llama(TINY, 0.3)


def randomized(module, seed=1, std=0.3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, std, generator=g)
    return module


def eagle_head(model, draft_vocab=64, aux=(0, 1, 2)):
    config = dummy_eagle3_config(TINY, draft_vocab)
    config = type(config)(config.layer, TINY.hidden_size, draft_vocab, aux)
    head = randomized(build_eagle3(config, model))
    with torch.no_grad():  # draft id d is target id 3 d + 1
        head.d2t.copy_(torch.arange(draft_vocab) * 2 + 1)
    return head


def features(model, tokens, capture):
    """The target's captured states of `tokens`, from scratch (a fresh pool)."""
    n = len(tokens)
    kv = KVPool.for_model(model.config, n, torch.float32, "cpu")
    table = torch.arange(1, n + 1, dtype=torch.int32)[None, :]
    batch = ForwardBatch.build(
        input_ids=tokens,
        out_cache_loc=range(1, n + 1),
        req_pool_indices=[0],
        seq_lens=[n],
        extend_lens=[n],
        req_to_token=table,
        logits_indices=range(n),
    )
    with torch.inference_mode():
        logits, hidden = model.forward_capture(batch, kv, capture)
        plain = model(batch, KVPool.for_model(model.config, n, torch.float32, "cpu"))
    return logits, hidden, plain, batch


# ---- the checkpoint layouts --------------------------------------------------------------
def test_eagle3_layout_round_trip(model, tmp_path):
    head = eagle_head(model)
    save_eagle3(head, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == 64 and config["num_hidden_layers"] == 1
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    state = load_file(str(tmp_path / "model.safetensors"))
    assert set(state) == EAGLE_NAMES
    assert tuple(state["midlayer.self_attn.q_proj.weight"].shape) == (32, 64)  # 2 x hidden in
    assert tuple(state["fc.weight"].shape) == (32, 96)  # 3 x the target's hidden
    loaded = load_eagle3(tmp_path, model)
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert loaded.config.capture_layers(TINY.num_layers) == (1, 2, 3)
    ids = loaded.target_ids(torch.tensor([0, 5, 63]))
    assert ids.tolist() == [1, 16, 190]


def test_eagle3_from_pytorch_bin_with_model_prefix_and_its_own_embedding(model, tmp_path):
    head = eagle_head(model)
    save_eagle3(head, tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    state = {"model." + k: v for k, v in state.items() if k != "t2d"}  # t2d: training only
    state["model.embed_tokens.weight"] = torch.randn(TINY.vocab_size, TINY.hidden_size)
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = load_eagle3(tmp_path, model)
    assert loaded.embed_tokens is not None
    assert torch.equal(loaded.embed_tokens.weight, state["model.embed_tokens.weight"])
    assert torch.equal(loaded.fc.weight, head.fc.weight)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"target_hidden_size": 48}, "reads hidden states of 48"),
        ({"vocab_size": 300}, "vocabulary of 300"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 5]}}, "has 3 layers"),
        ({"architectures": ["LlamaForCausalLM"]}, "not an EAGLE-3 head"),
        ({"num_hidden_layers": 2}, "not supported"),
    ],
)
def test_a_head_for_another_target_is_refused(model, tmp_path, change, message):
    save_eagle3(eagle_head(model), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=message):
        load_eagle3(tmp_path, model)


def test_missing_and_unknown_eagle_tensors_are_named(model, tmp_path):
    save_eagle3(eagle_head(model), tmp_path)
    path = tmp_path / "model.safetensors"
    state = load_file(str(path))
    save_file({k: v for k, v in state.items() if k != "fc.weight"}, str(path))
    with pytest.raises(ValueError, match="lacks.*fc.weight"):
        load_eagle3(tmp_path, model)
    save_file({**state, "midlayer.extra.weight": state["norm.weight"].clone()}, str(path))
    with pytest.raises(ValueError, match="midlayer.extra.weight"):
        load_eagle3(tmp_path, model)


def test_medusa_layouts(model, tmp_path):
    heads = randomized(MedusaHeads(TINY.hidden_size, TINY.vocab_size, 3, 1))
    save_medusa(heads, tmp_path / "st")
    assert set(load_file(str(tmp_path / "st" / "medusa_lm_head.safetensors"))) == {
        f"medusa_head.{i}.{n}" for i in range(3)
        for n in ("0.linear.weight", "0.linear.bias", "1.weight")
    }  # fmt: skip
    x = torch.randn(5, TINY.hidden_size)
    want = heads(x)
    assert torch.equal(load_medusa(tmp_path / "st", model)(x), want)
    # FasterDecoding/Medusa's torch.save(medusa_head.state_dict()): no prefix
    (tmp_path / "pt").mkdir()
    raw = {k.removeprefix("medusa_head."): v for k, v in heads.state_dict().items()}
    torch.save(raw, tmp_path / "pt" / "medusa_lm_head.pt")
    assert torch.equal(load_medusa(tmp_path / "pt", model)(x), want)
    # vLLM's converted layout (no block bias there)
    nobias = randomized(MedusaHeads(TINY.hidden_size, TINY.vocab_size, 2, 2, bias=False))
    vllm = {f"blocks.{i}.layers.{j}.weight": nobias.medusa_head[i][j].linear.weight
            for i in range(2) for j in range(2)}  # fmt: skip
    vllm.update({f"lm_heads.{i}.weight": nobias.medusa_head[i][2].weight for i in range(2)})
    (tmp_path / "vllm").mkdir()
    save_file(
        {k: v.contiguous() for k, v in vllm.items()}, str(tmp_path / "vllm" / "m.safetensors")
    )
    assert torch.equal(load_medusa(tmp_path / "vllm", model)(x), nobias(x))
    wide = MedusaHeads(48, TINY.vocab_size, 2, 1)
    save_medusa(wide, tmp_path / "wide")
    with pytest.raises(ValueError, match="hidden states of 48 features"):
        load_medusa(tmp_path / "wide", model)


# ---- the hidden states ----------------------------------------------------------------------
def test_forward_capture_hands_over_the_residual_stream_and_the_final_norm(model):
    tokens = PROMPTS[2]
    logits, hidden, plain, batch = features(model, tokens, HiddenCapture((0, 3)))
    assert torch.allclose(logits, plain, atol=1e-5)
    with torch.inference_mode():
        emb = model.model.embed_tokens.weight[torch.tensor(tokens)]
        assert torch.equal(hidden[:, :32], emb)  # entering layer 0: the embeddings
        final = model.model.norm(hidden[:, 32:])  # leaving the last layer, through the norm
        assert torch.allclose(model.lm_head(final), logits, atol=1e-4)
        _, normed, _, _ = features(model, tokens, HiddenCapture(()))
        assert normed.shape == (len(tokens), 32)
        assert torch.allclose(model.lm_head(normed), logits, atol=1e-4)


# ---- the EAGLE proposer ---------------------------------------------------------------------
def from_scratch(model, head, tokens, k, width=1):
    """The drafts of a fresh proposer fed every feature at once."""
    prop = EagleProposer(head, capture_layers=(1, 2, 3), vocab_size=211, tree_width=width)
    _, feats, _, _ = features(model, tokens[:-1], prop.capture)
    prop.observe("r", 0, feats)
    return prop.propose([PI("r", tokens, k)])[0]


def test_eagle_drafts_do_not_depend_on_the_history_of_calls(model):
    """Verify steps with accepted and rejected drafts (rows of rejected drafts left behind),
    a prefix hit (features from token 2 on), and a jump-forward gap: each proposal equals a
    fresh proposer's over the same features."""
    head = eagle_head(model)
    prop = EagleProposer(head, capture_layers=(1, 2, 3), vocab_size=211)
    g = torch.Generator().manual_seed(3)
    for rid, prompt in enumerate(PROMPTS):
        first = 2 if rid == 0 else 0  # rid 0: the prefix cache held its first two tokens
        tokens = list(prompt) + [int(torch.randint(211, (1,), generator=g))]
        _, feats, _, _ = features(model, tokens[:-1], prop.capture)
        prop.observe(rid, first, feats[first:])
        for round_ in range(4):
            got = prop.propose([PI(rid, tokens, 3)])[0]
            want = from_scratch(model, head, tokens, 3) if first == 0 else None
            if want is not None:
                assert got == want, (rid, round_)
            assert len(got.token_ids) == 3 and got.parents is None
            fed = [tokens[-1], *got.token_ids]  # a verify entry: pending token + drafts
            _, all_feats, _, _ = features(model, tokens + list(got.token_ids), prop.capture)
            prop.observe(rid, len(tokens) - 1, all_feats[len(tokens) - 1 :])
            accepted = int(torch.randint(4, (1,), generator=g))
            tokens += list(got.token_ids[:accepted]) + [(fed[accepted] + 7) % 211]
        prop.release(rid)
    # a jump-forward: two tokens not fed yet, no features for the first: nothing proposed
    _, feats, _, _ = features(model, PROMPTS[0], prop.capture)
    prop.observe("j", 0, feats)
    assert prop.propose([PI("j", PROMPTS[0] + [3, 4], 2)])[0] == Proposal(())
    assert prop.propose([PI("unseen", [1, 2, 3], 2)])[0] == Proposal(())


def test_trees_and_their_first_path(model):
    head = eagle_head(model)
    chain = from_scratch(model, head, PROMPTS[2], 3)
    tree = from_scratch(model, head, PROMPTS[2], 9, width=3)  # 9 nodes: 3 depths of 3
    assert tree.parents == (-1, -1, -1, 0, 0, 0, 3, 3, 3)
    assert spine(tree) == chain and spine(chain) is chain
    assert len(set(tree.token_ids[:3])) == 3  # the top 3 of depth 1
    # a tree of at most 4 nodes uses 2 depths: the head runs no step whose drafts go unverified
    assert from_scratch(model, head, PROMPTS[2], 4, width=3) == Proposal(
        tree.token_ids[:6], parents=tree.parents[:6]
    )
    assert tree_depth(4, 3) == 2 and tree_depth(4, 1) == 4 and tree_depth(9, 3) == 3
    assert tree_nodes([[4, 5], [6, 7]], 1) == Proposal((4, 6))
    assert tree_nodes([[4, 5], [6, 7]], 2) == Proposal((4, 5, 6, 7), parents=(-1, -1, 0, 0))


def head_logps(model, head, tokens, path):
    """The head's log probabilities (draft vocabulary) after drafting `path` past `tokens`,
    from scratch: a fresh pool, the features' extend, then one causal step per path token."""
    c, n = head.config.layer, len(tokens)
    kv = KVPool(n + len(path) + 1, 1, c.num_kv_heads, c.head_dim, torch.float32, "cpu")
    table = torch.arange(1, n + len(path) + 1, dtype=torch.int32)[None, :]
    _, feats, _, _ = features(model, tokens[:-1], HiddenCapture((1, 2, 3)))
    batch = ForwardBatch.build(
        input_ids=tokens[1:], out_cache_loc=range(1, n), req_pool_indices=[0],
        seq_lens=[n - 1], extend_lens=[n - 1], req_to_token=table, positions=range(n - 1),
    )  # fmt: skip
    with torch.inference_mode():
        logits, hidden = head(batch, kv, feats, project=True)
        for d, t in enumerate(path):
            batch = ForwardBatch.build(
                input_ids=[t], out_cache_loc=[n + d], req_pool_indices=[0], seq_lens=[n + d],
                extend_lens=[1], req_to_token=table, positions=[n - 1 + d],
            )  # fmt: skip
            logits, hidden = head(batch, kv, hidden, project=False)
    return torch.log_softmax(logits[0].float(), -1)


def eagle2_reference(logps, to_target, width, depth, budget):
    """EAGLE-2's tree in plain PyTorch, as paths of target ids: the root's top w; per depth,
    the top w (by summed log probability) of the last depth's w x w children of the nodes
    expanded; then the best `budget` of all drafted nodes."""
    top = logps(()).topk(width)
    paths = [(to_target(i),) for i in top.indices.tolist()]
    scores = top.values.tolist()
    expanded = list(range(width))
    for _ in range(1, depth):
        tops = [logps(paths[f]).topk(width) for f in expanded]
        cand = torch.stack([scores[f] + t.values for f, t in zip(expanded, tops)])
        best = set(cand.flatten().topk(width).indices.tolist())
        new = []
        for k in range(cand.numel()):
            f, i = divmod(k, width)
            paths.append(paths[expanded[f]] + (to_target(int(tops[f].indices[i])),))
            scores.append(float(cand[f, i]))
            if k in best:
                new.append(len(paths) - 1)
        expanded = new
    kept = torch.tensor(scores).topk(budget).indices.tolist()
    return {paths[i] for i in kept}


@pytest.mark.parametrize("width, depth, budget", [(2, 3, 5), (3, 4, 9), (4, 3, 20)])
def test_the_dynamic_tree_is_eagle2s(model, width, depth, budget):
    """The drafts of a dynamic tree (several branches per depth, the head's attention masked
    by the tree) are the best `budget` nodes of EAGLE-2's expansion computed from the head's
    distributions along each path from scratch; a width-1 dynamic tree is the chain."""
    head = eagle_head(model)
    tokens = PROMPTS[2]

    def path_of(tree, i):
        path = ()
        while i != -1:
            path, i = (tree.token_ids[i], *path), tree.parents[i]
        return path

    prop = EagleProposer(
        head, capture_layers=(1, 2, 3), vocab_size=211, tree_width=width, tree_depth=depth
    )
    _, feats, _, _ = features(model, tokens[:-1], prop.capture)
    prop.observe("r", 0, feats)
    tree = prop.propose([PI("r", tokens, budget)])[0]
    assert len(tree.token_ids) == min(budget, width + (depth - 1) * width * width)
    to_target = head.target_ids(torch.arange(64)).tolist()
    want = eagle2_reference(
        lambda path: head_logps(model, head, tokens, list(path)),
        to_target.__getitem__, width, depth, budget,
    )  # fmt: skip
    assert {path_of(tree, i) for i in range(len(tree.token_ids))} == want
    chain = EagleProposer(head, capture_layers=(1, 2, 3), vocab_size=211, tree_depth=3)
    chain.observe("r", 0, feats)
    got = chain.propose([PI("r", tokens, 3)])[0]
    assert got == Proposal(from_scratch(model, head, tokens, 3).token_ids, parents=(-1, 0, 1))


def test_a_dynamic_trees_ties_keep_ancestors_first():
    """Equal scores (probability 1 along a path) rank the node drafted first: a parent before
    its children, so any budget keeps a tree; the frontier is the best w of the last depth."""
    tree = DynamicTree(2)
    tree.add(-1, [5, 6], [0.0, -1.0])
    assert tree.frontier == [0, 1]
    tree.add(0, [7, 8], [0.0, -3.0])  # node 2 scores 0 as its parent does
    tree.add(1, [9, 10], [-0.5, -0.1])
    tree.advance()
    assert tree.frontier == [2, 5]  # scores 0 and -1.1 of 0, -3, -1.5, -1.1
    for budget, want in [(1, ((5,), (-1,))), (2, ((5, 7), (-1, 0))), (3, ((5, 6, 7), (-1, -1, 0)))]:
        p = tree.proposal(budget)
        assert (p.token_ids, p.parents) == want
    assert tree.proposal(9).token_ids == (5, 6, 7, 8, 9, 10)


def test_medusa_proposer_reads_the_row_before_the_pending_token(model):
    heads = randomized(MedusaHeads(TINY.hidden_size, TINY.vocab_size, 3, 1))
    prop = MedusaProposer(heads, vocab_size=211)
    tokens = PROMPTS[2]
    _, normed, _, _ = features(model, tokens, HiddenCapture(()))
    prop.observe("r", 0, normed)
    got = prop.propose([PI("r", tokens + [9], 5), PI("x", [1, 2], 2)])
    with torch.inference_mode():
        want = heads(normed[-1:]).argmax(-1)[:, 0].tolist()
    assert got[0] == Proposal(tuple(want)) and got[1] == Proposal(())  # 3 heads: 3 drafts
    wide = MedusaProposer(heads, vocab_size=211, tree_width=2)
    wide.observe("r", 0, normed)
    tree = wide.propose([PI("r", tokens + [9], 3)])[0]  # at most 3 nodes: 2 heads' top 2
    assert tree.parents == (-1, -1, 0, 0) and tree.token_ids[::2] == tuple(want[:2])


# ---- through the engine ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, overlap",
    [
        ({"method": "eagle", "draft_load_format": "dummy"}, False),
        ({"method": "eagle", "draft_load_format": "dummy", "tree_width": 2}, True),
        (
            {"method": "eagle", "draft_load_format": "dummy", "tree_width": 2, "tree_depth": 3},
            False,
        ),
        ({"method": "eagle", "draft_load_format": "dummy", "tree_width": 3, "tree_depth": 2}, True),
        ({"method": "medusa", "draft_load_format": "dummy"}, False),
        ({"method": "medusa", "draft_load_format": "dummy", "tree_width": 3}, True),
    ],
)
def test_engine_outputs_are_unchanged(model, spec, overlap):
    """Greedy and seeded sampled outputs with a random head equal plain decoding's (deterministic
    drafts are verified as n-gram drafts are), radix hits included (a shared prompt head)."""
    prompts = [[9, 9, 8, 7, *p] for p in PROMPTS]
    config = SpeculativeConfig(**spec, num_tokens=3, adaptive=False)
    plain = engine_for(model, None, overlap=overlap)
    heads = engine_for(model, None, overlap=overlap, speculative=config)
    try:
        for params in (
            SP(max_tokens=14, temperature=0.0, ignore_eos=True),
            SP(max_tokens=10, temperature=1.0, seed=5, ignore_eos=True),
        ):
            want = [r.token_ids for r in run_all(plain, prompts, params)]
            assert [r.token_ids for r in run_all(heads, prompts, params)] == want
        stats = heads.stats()
        assert stats["spec_verify_steps"] >= 20, stats
        assert stats["speculative"] == spec["method"]
        heads.check_integrity()
        assert heads.call(lambda: holds_nothing(heads.speculator.proposer))
    finally:
        plain.shutdown()
        heads.shutdown()


def holds_nothing(prop) -> bool:
    """Every finished request's head state released."""
    if isinstance(prop, EagleProposer):
        prop.cache.check_integrity()
        return not prop._states and len(prop.cache) == 0
    return not prop._rows


def test_retraction_and_abort_with_a_head(model):
    """A pool too small for every request: retracted requests prefill again (their head
    state starts over at what is fed) and outputs still equal plain decoding's; an aborted
    request's state is released."""
    prompts = [[9, 9, 8, 7, *p] for p in PROMPTS] * 2
    params = SP(max_tokens=30, temperature=0.0, ignore_eos=True)
    config = SpeculativeConfig(method="eagle", draft_load_format="dummy", num_tokens=3)
    plain = engine_for(model, None)
    small = engine_for(
        model, None, slots=96, budget=24, max_reqs=16, speculative=config,
        init_new_token_ratio=0.02, min_new_token_ratio=0.02,
    )  # fmt: skip
    try:
        want = [r.token_ids for r in run_all(plain, prompts, params)]
        assert [r.token_ids for r in run_all(small, prompts, params)] == want
        assert small.stats()["num_retractions"] > 0
        handle = small.submit(EngineRequest((5, 6, 7), SP(max_tokens=120, ignore_eos=True)))
        small.abort(handle.rid)
        assert handle.result(timeout=60).finish_reason == "abort"
        assert small.call(lambda: holds_nothing(small.speculator.proposer))
    finally:
        plain.shutdown()
        small.shutdown()


def test_head_errors_at_launch(model, tmp_path):
    wide = MedusaHeads(48, TINY.vocab_size, 2, 1)
    save_medusa(wide, tmp_path)
    for spec, message in (
        ({"method": "medusa", "draft_model": str(tmp_path)}, "48 features"),
        ({"method": "eagle", "draft_model": str(tmp_path)}, "not an EAGLE-3 head"),
    ):
        with pytest.raises(ValueError, match=message):
            launch_engine(model, None, eos_token_ids=EOS, speculative=SpeculativeConfig(**spec))
    with pytest.raises(ValueError, match="needs draft_model"):
        SpeculativeConfig(method="medusa")
    with pytest.raises(ValueError, match="needs a draft head"):
        SpeculativeConfig(method="ngram", tree_width=2)
    with pytest.raises(ValueError, match="needs an EAGLE head"):
        SpeculativeConfig(method="medusa", draft_load_format="dummy", tree_depth=3)
    with pytest.raises(ValueError, match="tree_depth must be >= 1"):
        SpeculativeConfig(method="eagle", tree_depth=0)
    with pytest.raises(ValueError, match="needs the target model"):
        build_proposer(SpeculativeConfig(method="eagle"), vocab_size=211)


# ---- the bundled model -----------------------------------------------------------------------
@requires_default_model
@pytest.mark.parametrize("shipped", [False, True])
def test_runtime_with_a_head_on_the_bundled_model(shipped):
    """lp.Runtime(speculative="eagle") (the shipped head) and a random-weight head: greedy
    outputs equal plain decoding's; the shipped head gets drafts accepted."""
    import lmprog as lp

    if shipped and not (BUNDLED_EAGLE3 / "config.json").is_file():
        pytest.skip("no EAGLE-3 head shipped in this tree")
    spec = "eagle" if shipped else {"method": "eagle", "draft_load_format": "dummy"}
    rt = lp.Runtime(device="cpu", max_total_tokens=2048, speculative=spec)
    questions = ["What is the capital of France?", "Write a Python function that adds two numbers."]
    prompts = [  # the shipped head was trained on chat turns
        rt.chat_template.render([{"role": "user", "content": q}], add_generation_prompt=True)
        for q in questions
    ]
    greedy = SP(max_tokens=24 if shipped else 12, temperature=0.0, ignore_eos=True)
    try:
        with_head = [r.token_ids for r in rt.generate(prompts, greedy)]
        stats = rt.stats()
        rt.engine.set_speculation(False)
        assert [r.token_ids for r in rt.generate(prompts, greedy)] == with_head
        assert stats["speculative"] == "eagle" and stats["spec_verify_steps"] > 0
        if shipped:  # 11 of 46 drafts accepted when written (a random head: ~none)
            assert stats["spec_accepted_tokens"] >= 3, stats
        rt.engine.check_integrity()
    finally:
        rt.shutdown()


@requires_default_model
def test_the_shipped_head_accepts_more_per_verify_with_a_dynamic_tree():
    """The shipped EAGLE-3 head on the bundled model, greedy, a node budget of 8: EAGLE-2's
    dynamic tree (w 2, 4 depths) accepts at least as many drafts per verify as the static
    tree of the same width and budget, outputs unchanged (when written, on 3 chat prompts x
    32 tokens: see the numbers in docs/design/speculative.md)."""
    import lmprog as lp

    if not (BUNDLED_EAGLE3 / "config.json").is_file():
        pytest.skip("no EAGLE-3 head shipped in this tree")
    questions = [
        "What is the capital of France?",
        "Write a Python function that adds two numbers.",
        "Extract the name and age as JSON: Alice is 31 years old.",
    ]
    greedy = SP(max_tokens=32, temperature=0.0, ignore_eos=True)
    rates, outputs = {}, {}
    for name, tree in (("static", {}), ("dynamic", {"tree_depth": 4})):
        spec = {"method": "eagle", "num_tokens": 8, "tree_width": 2, "adaptive": False, **tree}
        rt = lp.Runtime(device="cpu", max_total_tokens=2048, speculative=spec)
        try:
            prompts = [
                rt.chat_template.render(
                    [{"role": "user", "content": q}], add_generation_prompt=True
                )
                for q in questions
            ]
            outputs[name] = [r.token_ids for r in rt.generate(prompts, greedy)]
            stats = rt.stats()
            rates[name] = stats["spec_accepted_tokens"] / stats["spec_verify_steps"]
            if name == "static":
                rt.engine.set_speculation(False)
                outputs["plain"] = [r.token_ids for r in rt.generate(prompts, greedy)]
        finally:
            rt.shutdown()
    assert outputs["static"] == outputs["plain"] == outputs["dynamic"]
    assert rates["dynamic"] >= rates["static"] > 0, rates  # 0.72 and 0.58 when written


def test_steps_without_a_head_or_with_speculation_off_run_the_plain_forward(model):
    def boom(*args, **kwargs):
        raise AssertionError("a step captured hidden states it did not need")

    config = SpeculativeConfig(method="eagle", draft_load_format="dummy", num_tokens=2)
    for spec, off in ((config, True), (SpeculativeConfig(method="ngram"), False)):
        eng = engine_for(model, None, speculative=spec)
        try:
            if off:
                eng.set_speculation(False)
            eng.runner.forward_capture = boom
            out = run_all(eng, PROMPTS[:2], SP(max_tokens=6, temperature=0.0, ignore_eos=True))
            assert all(len(r.token_ids) == 6 for r in out)
        finally:
            eng.shutdown()


# ---- CUDA graphs ---------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (graphs, Triton attention)")
@pytest.mark.parametrize("method", ["eagle", "eagle1", "medusa"])
@pytest.mark.parametrize("tree_width", [1, 3])
def test_head_steps_replay_the_cuda_graphs(method, tree_width, monkeypatch, tmp_path):
    """On the GPU a head's steps (decodes, chain and tree verifies, prefills) replay the CUDA
    graphs built for its capture (decode graphs, piecewise segments): no forward_capture runs
    eagerly, and greedy outputs equal those of the same engine without graphs and of plain
    decoding (fp32: only the kernels' order of sums differs). eagle1: an EAGLE-1 checkpoint
    (the stream leaving the target's last layer captured)."""
    # head_dim 16: the Triton attention kernels take head_dim in [16, 512]
    c = replace(TINY, hidden_size=64, head_dim=16)
    net = random_llama(c, 0.3, device="cuda", attention="triton")
    prompts = [[9, 9, 8, 7, *p] for p in PROMPTS] * 2
    params = SP(max_tokens=24, temperature=0.0, ignore_eos=True)
    head = {"draft_load_format": "dummy"}
    if method == "eagle1":
        folder = write_head(tmp_path, published_state(c=c), c=c)
        method, head = "eagle", {"draft_model": str(folder)}
    spec = SpeculativeConfig(
        method=method, num_tokens=4, adaptive=False, tree_width=tree_width, **head
    )
    eager_calls = []
    forward_capture = type(net).forward_capture

    def counted(self, *args, **kwargs):
        eager_calls.append(1)
        return forward_capture(self, *args, **kwargs)

    def run(speculative, graphs):
        e = launch_engine(
            net, None, eos_token_ids=EOS, max_total_tokens=4096, cuda_graphs=graphs,
            engine_config=EngineConfig(check_integrity=True), speculative=speculative,
        )  # fmt: skip
        try:
            eager_calls.clear()
            monkeypatch.setattr(type(net), "forward_capture", counted)  # after the capture
            out = [r.token_ids for r in run_all(e, prompts, params)]
            monkeypatch.setattr(type(net), "forward_capture", forward_capture)
            runner = e.runner
            replays = sum(g.replays for g in (runner.graphs, runner.piecewise) if g is not None)
            return out, e.stats(), replays, len(eager_calls)
        finally:
            e.shutdown()

    plain, _, _, _ = run(None, True)
    eager, eager_stats, _, eager_captures = run(spec, False)
    graphs, stats, replays, captures = run(spec, True)
    assert eager == plain and graphs == plain
    # the head got its states (it drafted: verify steps below), none of them eagerly
    assert eager_captures > 0 and captures == 0, (eager_captures, captures)
    assert replays > 0
    assert stats["spec_verify_steps"] >= 20 and eager_stats["spec_verify_steps"] >= 20
    if tree_width > 1:
        assert stats["spec_tree_verifies"] > 0, stats


def check_head_graphs(device, capture, dtype, tol, eagle1=False):
    """The EAGLE head's draft steps through decode graphs (padded buckets, the states in and
    out through HeadStep's buffers) propose what the eager steps propose: 4 requests asking
    4, 2, 3 and 1 drafts (draft steps of 3, 2 and 1 requests in buckets of 4, 2 and 1),
    over 4 calls of growing sequences. eagle1: an EAGLE-1 head (the target's lm_head)."""
    model, g, _, _ = setup(device, dtype, num_layers=2, rows=1, num_slots=64)
    if eagle1:
        layer = dummy_eagle3_config(model.config).layer
        head = build_eagle1(Eagle1Config(layer), model)
    else:
        head = build_eagle3(dummy_eagle3_config(model.config, 40), model)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:  # drawn on the CPU generator, then moved: the same head on either device
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def proposer(graphs):
        prop = EagleProposer(
            head,
            capture_layers=head.config.capture_layers(2),
            vocab_size=50,
            max_requests=8,
            cuda_graphs=False,
        )
        if graphs:
            prop.graphs = CudaGraphRunner(
                prop.step, prop.kv, prop.req_to_token, batch_sizes=(1, 2, 4), capture=capture
            )
        return prop

    eager, graphed = proposer(False), proposer(True)
    width = head.reads * model.config.hidden_size  # the target's features
    seqs = {rid: [3 + rid, 7, 11 + rid, 2 * rid + 1, 5] for rid in range(4)}
    for rid, tokens in seqs.items():
        feats = torch.randn(len(tokens) - 1, width, generator=g).to(device, eager.dtype)
        for prop in (eager, graphed):
            prop.observe(rid, 0, feats)
    asks = {0: 4, 1: 2, 2: 3, 3: 1}
    for _ in range(4):
        inputs = [PI(rid, list(tokens), asks[rid]) for rid, tokens in seqs.items()]
        want = eager.propose(inputs)
        assert graphed.propose(inputs) == want
        assert [len(p.token_ids) for p in want] == [4, 2, 3, 1]
        for rid, tokens in seqs.items():  # a verify step that accepted the first draft
            new = [want[rid].token_ids[0], int(torch.randint(50, (1,), generator=g))]
            feats = torch.randn(len(new), width, generator=g).to(device, eager.dtype)
            for prop in (eager, graphed):
                prop.observe(rid, len(tokens) - 1, feats)
            tokens += new
    assert graphed.graphs.replays == 4 * 3  # every draft step after the extend


@requires_triton
@pytest.mark.parametrize("eagle1", [False, True])
def test_eagle_draft_steps_through_the_decode_graphs_padded_path(one_thread, eagle1):
    run_uncaptured(partial(check_head_graphs, eagle1=eagle1))


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="CUDA graph capture needs a CUDA GPU (the padded static path is tested on the CPU "
    "by test_eagle_draft_steps_through_the_decode_graphs_padded_path)",
)
@pytest.mark.parametrize("eagle1", [False, True])
def test_eagle_draft_steps_replay_the_decode_graphs(one_thread, eagle1):
    run_captured(
        partial(check_head_graphs, eagle1=eagle1), "float32"
    )  # fp32: drafts (argmax) compared exactly


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (Triton attention)")
def test_dynamic_trees_through_triton_attention():
    """EAGLE-2's dynamic trees on the GPU: the head's tree-masked draft extends run Triton's
    custom-mask attention (eagerly, beside the graphs of its chain steps); greedy outputs
    equal plain decoding's."""
    c = replace(TINY, hidden_size=64, head_dim=16)
    net = random_llama(c, 0.3, device="cuda", attention="triton")
    prompts = [[9, 9, 8, 7, *p] for p in PROMPTS] * 2
    params = SP(max_tokens=24, temperature=0.0, ignore_eos=True)
    spec = SpeculativeConfig(
        method="eagle", draft_load_format="dummy", num_tokens=6, adaptive=False,
        tree_width=3, tree_depth=3,
    )  # fmt: skip
    outs, stats = [], {}
    for speculative in (None, spec):
        e = launch_engine(
            net, None, eos_token_ids=EOS, max_total_tokens=4096,
            engine_config=EngineConfig(check_integrity=True), speculative=speculative,
        )  # fmt: skip
        try:
            outs.append([r.token_ids for r in run_all(e, prompts, params)])
            stats = e.stats()
        finally:
            e.shutdown()
    assert outs[1] == outs[0]
    assert stats["spec_verify_steps"] > 0, stats
