"""Mixtral, Qwen2-MoE and Qwen3-MoE against transformers' own models of the same weights.

Tiny random configs saved by transformers (per-expert checkpoint names), loaded through our
loaders: logits through the paged pool (prefill, chunked prefill over a cached prefix,
decodes, a hybrid batch; test_parity's check), the transformers v5 stacked names, a GGUF
written as llama.cpp writes MoE models (stacked ffn_*_exps tensors, Q8_0), random weights in
the published shapes, and greedy generations through the engine (chunked prefill, overlap,
n-gram speculation) equal to transformers' `generate`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_testing import tok  # noqa: F401
from test_parity import FP32_ATOL, _seqs, check_paged_parity, randomize_hf

from lmprog.runtime.models import build_model, load_model, preset

torch.set_num_threads(1)
VOCAB = 120


def _hf_tiny(kind: str, vocab: int = VOCAB, std: float = 0.3):
    import transformers as tf

    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
    )
    if kind == "mixtral":
        cfg = tf.MixtralConfig(intermediate_size=96, num_local_experts=4, **common)
        return randomize_hf(tf.MixtralForCausalLM(cfg), std)
    moe = dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=32, intermediate_size=96)
    if kind == "qwen2_moe":  # shared expert; layer 1 dense; weights not renormalized
        cfg = tf.Qwen2MoeConfig(
            shared_expert_intermediate_size=40, mlp_only_layers=[1], **moe, **common
        )
        return randomize_hf(tf.Qwen2MoeForCausalLM(cfg), std)
    cfg = tf.Qwen3MoeConfig(  # q/k norms; MoE on layer 1 only (decoder_sparse_step 2)
        head_dim=16, norm_topk_prob=True, decoder_sparse_step=2, **moe, **common
    )
    return randomize_hf(tf.Qwen3MoeForCausalLM(cfg), std)


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_tiny_moe_models_match_transformers(kind, tmp_path):
    hf = _hf_tiny(kind)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    c = ours.config
    assert c.architecture == kind and c.num_experts == (4 if kind == "mixtral" else 6)
    moe_layers = [c.is_moe_layer(i) for i in range(3)]
    assert moe_layers == {"mixtral": [True] * 3, "qwen2_moe": [True, False, True]}.get(
        kind, [False, True, False]
    )
    assert c.shared_expert_gate == (kind == "qwen2_moe")
    assert c.norm_topk_prob == (kind != "qwen2_moe")
    check_paged_parity(ours, hf, _seqs(VOCAB), FP32_ATOL)


def test_stacked_expert_names_load_too(tmp_path):
    from safetensors.torch import save_file

    hf = _hf_tiny("qwen2_moe")
    hf.save_pretrained(tmp_path)  # for config.json; its weights are replaced below
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state  # transformers v5's modules
    (tmp_path / "model.safetensors").unlink()
    save_file(state, tmp_path / "model.safetensors")
    ours = load_model(tmp_path)
    torch.testing.assert_close(
        ours.model.layers[2].mlp.experts.gate_up_proj, hf.model.layers[2].mlp.experts.gate_up_proj
    )
    check_paged_parity(ours, hf, _seqs(VOCAB)[:4], FP32_ATOL)


def test_a_missing_expert_is_reported(tmp_path):
    from safetensors.torch import load_file, save_file

    _hf_tiny("mixtral").save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.1.block_sparse_moe.experts.3.w3.weight"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"lacks 1 tensors.*experts\.gate_up_proj', \(3, 1\)"):
        load_model(tmp_path)


# llama.cpp's tensor names for these models (convert_hf_to_gguf.py)
_GGUF = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate": "ffn_gate_inp",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}


def _write_moe_gguf(hf, path, per_expert: bool = False) -> None:
    """A GGUF as llama.cpp writes Qwen2-MoE ("qwen2moe") or Mixtral ("llama" with experts,
    Q/K rows permuted for pair-wise RoPE): each projection of all experts one stacked
    [E, out, in] tensor (per_expert: one per expert, as early Mixtral GGUFs have them),
    Qwen2-MoE's shared-expert gate a vector, no router on dense layers."""
    import gguf

    cfg = hf.config
    mixtral = cfg.model_type == "mixtral"
    w = gguf.GGUFWriter(str(path), "llama" if mixtral else "qwen2moe")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    if not mixtral:
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_expert_count(cfg.num_local_experts if mixtral else cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    inter = cfg.intermediate_size if mixtral else cfg.moe_intermediate_size
    heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}
    for name, p in hf.state_dict().items():
        array = p.float().numpy()
        if ".mlp.experts." in name:  # transformers' gate_up_proj: llama.cpp keeps gate, up
            layer = name.split(".")[2]
            if name.endswith("gate_up_proj"):
                parts = {"ffn_gate_exps": array[:, :inter], "ffn_up_exps": array[:, inter:]}
            else:
                parts = {"ffn_down_exps": array}
            for kind, part in parts.items():
                if per_expert:
                    for e in range(len(part)):
                        name = f"blk.{layer}.{kind[:-5]}.{e}.weight"  # ffn_gate_exps -> ffn_gate
                        _add(w, name, np.ascontiguousarray(part[e]), quantize=True)
                else:
                    _add(w, f"blk.{layer}.{kind}.weight", np.ascontiguousarray(part))
            continue
        stem, suffix = name.rsplit(".", 1)
        if stem in top:
            _add(w, f"{top[stem]}.{suffix}", array)
            continue
        _, _, layer, *rest = stem.split(".")
        if stem.endswith("shared_expert_gate"):
            array = array.reshape(-1)
        if mixtral and rest[-1] in heads:  # llama.cpp's convert_hf_to_gguf permute
            n = heads[rest[-1]]
            array = array.reshape(n, 2, array.shape[0] // n // 2, -1).swapaxes(1, 2)
            array = np.ascontiguousarray(array.reshape(-1, cfg.hidden_size))
        _add(w, f"blk.{layer}.{_GGUF['.'.join(rest)]}.{suffix}", array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add(writer, name: str, array: np.ndarray, quantize: bool = False) -> None:
    """The experts Q8_0 (3-D quantized blocks), everything else F32 (exact)."""
    import gguf

    if quantize or "_exps." in name:
        q8 = gguf.GGMLQuantizationType.Q8_0
        writer.add_tensor(name, gguf.quants.quantize(array, q8), raw_dtype=q8)
    else:
        writer.add_tensor(name, np.ascontiguousarray(array))


@pytest.mark.parametrize(
    "kind,per_expert", [("qwen2_moe", False), ("mixtral", False), ("mixtral", True)]
)
def test_tiny_moe_gguf_loads_as_llama_cpp_writes_it(kind, per_expert, tmp_path, monkeypatch):
    monkeypatch.setenv("LMPROG_CACHE_DIR", str(tmp_path / "cache"))
    hf = _hf_tiny(kind)
    path = tmp_path / f"tiny-{kind}.gguf"
    _write_moe_gguf(hf, path, per_expert)
    ours = load_model(path)
    c = ours.config
    qwen = kind == "qwen2_moe"
    assert (c.architecture, c.num_experts, c.num_experts_per_tok) == (
        (kind, 6, 3) if qwen else (kind, 4, 2)
    )
    assert c.mlp_only_layers == ((1,) if qwen else ())
    assert (c.shared_expert_gate, c.norm_topk_prob) == (qwen, not qwen)
    assert (c.moe_intermediate_size, c.shared_expert_intermediate_size) == (
        (32, 40) if qwen else (96, 0)
    )
    with torch.no_grad():  # the stacked experts: the originals up to Q8_0 rounding
        for i in [i for i in range(3) if c.is_moe_layer(i)]:
            want, got = hf.model.layers[i].mlp.experts, ours.model.layers[i].mlp.experts
            for proj in ("gate_up_proj", "down_proj"):
                torch.testing.assert_close(
                    getattr(got, proj), getattr(want, proj), atol=0.02, rtol=0.02
                )
                getattr(want, proj).copy_(getattr(got, proj))  # the rest of the GGUF is F32
    check_paged_parity(ours, hf, _seqs(VOCAB), FP32_ATOL)


def test_presets_have_the_published_shapes():
    counts = {  # total parameters as published
        "mixtral-8x7b": 46_702_792_704,
        "qwen3-30b-a3b": 30_532_122_624,
        "qwen1.5-moe-a2.7b": 14_315_784_192,
    }
    for name, total in counts.items():
        model = build_model(preset(name), device="meta", dtype="bfloat16")
        assert sum(p.numel() for p in model.parameters()) == total, name


def test_tensor_parallelism_refuses_experts():
    from lmprog.runtime.parallel import check_shardable

    check_shardable(preset("mixtral-8x7b"), 1)
    with pytest.raises(ValueError, match="does not shard mixture-of-experts.*tp_size=1"):
        check_shardable(preset("mixtral-8x7b"), 2)


def test_dummy_weights_give_finite_logits_and_routing_everywhere():
    from test_models import _prefill_logits

    cfg = preset("qwen1.5-moe-a2.7b")
    from dataclasses import replace

    small = replace(cfg, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                    num_kv_heads=4, head_dim=16, vocab_size=300, moe_intermediate_size=32,
                    shared_expert_intermediate_size=48)  # fmt: skip
    model = load_model(small, load_format="dummy", seed=1)
    logits, _ = _prefill_logits(model, list(range(5, 25)))
    assert torch.isfinite(logits).all() and logits.std() > 0


# ------------------------------------------------------------------ through the engine


def test_engine_greedy_generation_equals_transformers(tmp_path, tok):
    from engine_testing import EOS, greedy, run_all

    from lmprog.runtime.config import SchedulerConfig
    from lmprog.runtime.engine.engine import EngineConfig
    from lmprog.runtime.engine.launch import launch_engine
    from lmprog.runtime.speculative import SpeculativeConfig

    hf = _hf_tiny("mixtral", vocab=len(tok), std=0.1)  # repeats: n-gram drafts
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    prompts = [list(range(1000, 1019)), [5, 9, 11] * 5]
    new = 12
    with torch.inference_mode():
        want = [
            hf.generate(torch.tensor([p]), max_new_tokens=new, min_new_tokens=new, do_sample=False)[
                0, len(p) :
            ].tolist()
            for p in prompts
        ]
    chunked = SchedulerConfig(max_num_batched_tokens=8, max_running_requests=4)  # in chunks
    spec = SpeculativeConfig(method="ngram", num_tokens=3, adaptive=False)
    for kwargs in (
        {"scheduler_config": chunked},
        {"scheduler_config": chunked, "engine_config": EngineConfig(overlap=True)},
        {"speculative": spec},
    ):
        engine = launch_engine(ours, tok, eos_token_ids=EOS, max_total_tokens=512, **kwargs)
        try:
            got = [list(r.token_ids) for r in run_all(engine, prompts, greedy(new))]
            verified = engine.stats().get("spec_verified_tokens", 0)
        finally:
            engine.shutdown()
        assert got == want, kwargs
        assert (verified > 0) == ("speculative" in kwargs)  # drafts were verified
