"""EAGLE-1/2 draft heads: a checkpoint written here in the published layout (SafeAILab/EAGLE's
yuhuili/* heads and the variants SGLang and vLLM read) loads through method "eagle", its
forward equals a plain-PyTorch EAGLE-1 layer, its drafts equal that reference's greedy
chain, greedy engine outputs equal plain decoding's (chains and trees), and a head for
another model is refused."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from engine_testing import engine_for, random_llama, run_all
from spec_testing import HEAD_PROMPTS, HEAD_TARGET, published_state, write_head

from lmprog.core.sampling import SamplingParams as SP
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.models.llama import HiddenCapture
from lmprog.runtime.speculative import SpeculativeConfig, build_proposer
from lmprog.runtime.speculative.eagle import EagleProposer
from lmprog.runtime.speculative.eagle1_files import is_eagle1, load_eagle1
from lmprog.runtime.speculative.head_build import dummy_eagle3_config, load_eagle
from lmprog.runtime.speculative.head_files import build_eagle3, save_eagle3
from lmprog.runtime.speculative.heads import Eagle1Head, Eagle3Head
from lmprog.runtime.speculative.proposer import ProposalInput as PI

torch.set_num_threads(1)
TINY, PROMPTS = HEAD_TARGET, HEAD_PROMPTS
H, V = TINY.hidden_size, TINY.vocab_size


@pytest.fixture(scope="module")
def model():
    """A random target whose final norm is not all ones (the head must apply it)."""
    net = random_llama(TINY, 0.3)
    with torch.no_grad():
        net.model.norm.weight.copy_(
            1.0 + 0.5 * torch.randn(H, generator=torch.Generator().manual_seed(9))
        )
    return net


# ---- the plain-PyTorch EAGLE-1 reference --------------------------------------------------------
def rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta=10000.0):  # x [T, heads, d], Llama's rotate-half convention
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos[:, None].float() * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference(state, target, ids, feats, own):
    """EAGLE-1's layer (SafeAILab/EAGLE cnets.py) over a whole sequence, causal: position i
    fed token ids[i] and feats[i] (own[i]: the head's output, else the target's stream
    leaving its last layer, which the target's final norm turns into its feature).
    Returns (logits through the target's lm_head, the layer's output)."""
    s, t = state, target
    feats = torch.stack([f if o else rms(f, t.model.norm.weight) for f, o in zip(feats, own)])
    x = F.linear(
        torch.cat([t.model.embed_tokens.weight[ids], feats], -1), s["fc.weight"], s["fc.bias"]
    )
    n, d = len(ids), TINY.head_dim
    pos = torch.arange(n)
    q = rope(F.linear(x, s["layers.0.self_attn.q_proj.weight"]).view(n, -1, d), pos)
    k = rope(F.linear(x, s["layers.0.self_attn.k_proj.weight"]).view(n, -1, d), pos)
    v = F.linear(x, s["layers.0.self_attn.v_proj.weight"]).view(n, -1, d)
    rep = TINY.num_heads // TINY.num_kv_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
    o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1)
    h = x + F.linear(o, s["layers.0.self_attn.o_proj.weight"])
    m = rms(h, s["layers.0.post_attention_layernorm.weight"])
    up = F.silu(F.linear(m, s["layers.0.mlp.gate_proj.weight"])) * F.linear(
        m, s["layers.0.mlp.up_proj.weight"]
    )
    out = h + F.linear(up, s["layers.0.mlp.down_proj.weight"])
    return F.linear(out, t.lm_head.weight), out


def streams(model, tokens):
    """The target's stream leaving its last layer at every token (a fresh pool)."""
    n = len(tokens)
    kv = KVPool.for_model(model.config, n, torch.float32, "cpu")
    batch = ForwardBatch.build(
        input_ids=tokens, out_cache_loc=range(1, n + 1), req_pool_indices=[0], seq_lens=[n],
        extend_lens=[n], req_to_token=torch.arange(1, n + 1, dtype=torch.int32)[None, :],
        logits_indices=range(n),
    )  # fmt: skip
    with torch.inference_mode():
        return model.forward_capture(batch, kv, HiddenCapture((model.config.num_layers,)))[1]


# ---- the layout -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "arch, fmt, prefix",
    [
        ("LlamaForCausalLM", "bin", ""),  # as published
        ("LlamaForCausalLMEagle", "safetensors", "model."),  # SGLang's name for it
        ("EagleLlamaForCausalLM", "safetensors", ""),  # vLLM's
        ("EAGLEModel", "bin", "model."),  # vLLM's older converted config
    ],
)
def test_a_published_checkpoint_loads_and_its_forward_is_eagle1s(
    model, tmp_path, arch, fmt, prefix
):
    state = published_state()
    folder = write_head(tmp_path / "h", state, arch=arch, fmt=fmt, prefix=prefix)
    assert is_eagle1(folder)
    head = load_eagle(folder, model)
    assert isinstance(head, Eagle1Head) and head.config.fc_bias
    assert head.config.capture_layers(TINY.num_layers) == (3,)
    assert not any(
        "embed" in n or "lm_head" in n or "input_layernorm" in n for n, _ in head.named_parameters()
    )
    tokens = PROMPTS[2]
    feats = streams(model, tokens)
    n = len(tokens) - 1  # position i: token i + 1 and the target's state at token i
    kv = KVPool.for_model(head.config.layer, n, torch.float32, "cpu")
    batch = ForwardBatch.build(
        input_ids=tokens[1:], out_cache_loc=range(1, n + 1), req_pool_indices=[0], seq_lens=[n],
        extend_lens=[n], req_to_token=torch.arange(1, n + 1, dtype=torch.int32)[None, :],
        logits_indices=range(n),
    )  # fmt: skip
    with torch.inference_mode():
        logits, out = head(batch, kv, feats[:n], project=True)
        want_logits, want_out = reference(
            state, model, torch.tensor(tokens[1:]), feats[:n], [False] * n
        )
    assert torch.allclose(out, want_out, atol=1e-4, rtol=1e-4)
    assert torch.allclose(logits, want_logits, atol=1e-4, rtol=1e-4)


def test_no_fc_bias_and_hass_norms(model, tmp_path):
    state = published_state()
    del state["fc.bias"], state["embed_tokens.weight"]
    g = torch.Generator().manual_seed(4)
    norms = {
        n: 1.0 + 0.3 * torch.randn(H, generator=g)
        for n in ("embedding_layernorm.weight", "hidden_states_layernorm.weight")
    }
    head = load_eagle(write_head(tmp_path / "a", state), model)
    assert not head.config.fc_bias and head.fc.bias is None
    hass = load_eagle(write_head(tmp_path / "b", {**state, **norms}, add_para_norm=True), model)
    assert hass.config.para_norm
    assert torch.equal(hass.embedding_layernorm.weight, norms["embedding_layernorm.weight"])


# ---- drafting ---------------------------------------------------------------------------------------
def test_drafts_are_the_references_greedy_chain_and_trees_branch_from_it(model, tmp_path):
    state = published_state()
    config = SpeculativeConfig(method="eagle", draft_model=str(write_head(tmp_path / "h", state)))
    prop = build_proposer(config, vocab_size=V, target=model)
    assert isinstance(prop, EagleProposer) and isinstance(prop.head, Eagle1Head)
    assert prop.capture == HiddenCapture((3,))
    chains = []
    for rid, tokens in enumerate(PROMPTS):
        feats = streams(model, tokens[:-1])
        prop.observe(rid, 0, feats)
        got = prop.propose([PI(rid, tokens, 4)])[0]
        ids, fed, own, want = list(tokens[1:]), list(feats), [False] * len(feats), []
        with torch.inference_mode():
            for _ in range(4):  # the reference recomputed over the whole sequence each depth
                logits, out = reference(state, model, torch.tensor(ids), fed, own)
                want.append(int(logits[-1].argmax()))
                ids.append(want[-1])
                fed.append(out[-1])
                own.append(True)
        assert list(got.token_ids) == want, rid
        chains.append(want)
    wide = build_proposer(replace(config, tree_width=3), vocab_size=V, target=model)
    tokens = PROMPTS[2]
    wide.observe("t", 0, streams(model, tokens[:-1]))
    tree = wide.propose([PI("t", tokens, 6)])[0]
    assert tree.parents == (-1, -1, -1, 0, 0, 0)
    assert list(tree.token_ids[0::3]) == chains[2][:2]  # the spine: the chain


@pytest.mark.parametrize(
    "tree_width, tree_depth, overlap", [(1, None, False), (3, None, True), (3, 3, True)]
)
def test_engine_greedy_outputs_are_unchanged(model, tmp_path, tree_width, tree_depth, overlap):
    """Chains, static trees and EAGLE-2's dynamic trees (tree_depth) of an EAGLE-1 head."""
    folder = write_head(tmp_path / "h", published_state())
    prompts = [[9, 9, 8, 7, *p] for p in PROMPTS]
    config = SpeculativeConfig(
        method="eagle",
        draft_model=str(folder),
        num_tokens=4,
        adaptive=False,
        tree_width=tree_width,
        tree_depth=tree_depth,
    )
    plain = engine_for(model, None, overlap=overlap)
    heads = engine_for(model, None, overlap=overlap, speculative=config)
    try:
        params = SP(max_tokens=16, temperature=0.0, ignore_eos=True)
        want = [r.token_ids for r in run_all(plain, prompts, params)]
        assert [r.token_ids for r in run_all(heads, prompts, params)] == want
        stats = heads.stats()
        assert stats["spec_verify_steps"] >= 20, stats
        assert isinstance(heads.speculator.proposer.head, Eagle1Head)
        heads.check_integrity()
    finally:
        plain.shutdown()
        heads.shutdown()


# ---- refusals ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, config, message",
    [
        ({"fc.weight": (48, 96)}, {"hidden_size": 48}, "hidden states of 48 features"),
        ({"embed_tokens.weight": (300, H)}, {"vocab_size": 300}, "vocabulary of 300"),
        ({"embed_tokens.weight": (300, H)}, {}, r"embed_tokens.weight is \(300, 32\)"),
        ({"fc.weight": (H, 3 * H)}, {}, r"fc.weight is \(32, 96\)"),
        ({}, {"num_hidden_layers": 2}, "2 layers are not supported"),
        ({"layers.0.extra.weight": (H,)}, {}, "layers.0.extra.weight"),
    ],
)
def test_a_head_that_does_not_fit_the_target_is_refused(model, tmp_path, change, config, message):
    state = published_state()
    state.update({n: torch.zeros(s) for n, s in change.items()})
    folder = write_head(tmp_path / "h", state, **config)
    with pytest.raises(ValueError, match=message):
        load_eagle1(folder, model)


def test_missing_tensors_and_other_folders(model, tmp_path):
    state = published_state()
    del state["layers.0.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match=r"lacks \['layers.0.self_attn.k_proj.weight'\]"):
        load_eagle(write_head(tmp_path / "a", state), model)
    plain = published_state()
    plain = {k: v for k, v in plain.items() if not k.startswith("fc.")}  # a plain Llama
    folder = write_head(tmp_path / "b", plain)
    assert not is_eagle1(folder)
    with pytest.raises(ValueError, match="nor an EAGLE-1/2 head"):
        load_eagle(folder, model)
    # an EAGLE-3 folder still loads as EAGLE-3
    save_eagle3(build_eagle3(dummy_eagle3_config(TINY), model), tmp_path / "e3")
    assert not is_eagle1(tmp_path / "e3")
    assert isinstance(load_eagle(tmp_path / "e3", model), Eagle3Head)
