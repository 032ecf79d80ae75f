"""DeepSeek-V2 from a GGUF written as llama.cpp's converter writes its deepseek2 arch, in both
layouts: the older one (attn_kv_b, key/value_length the head sizes) and the one of its MLA
path (kv_b split into attn_k_b [H, D, dn] and attn_v_b [H, dv, D], key_length =
kv_lora_rank + rope, the head sizes in key/value_length_mla, one KV head). RoPE rows stay
pairwise (llama.cpp rotates deepseek2 pairwise, like transformers), YaRN as
yarn_log_multiplier = 0.1 * mscale_all_dim, experts stacked. Paged parity with transformers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_deepseek_v2 import YARN, _hf_tiny
from test_parity import FP32_ATOL, _seqs, check_paged_parity

from lmprog.runtime.models import load_config, load_model

torch.set_num_threads(1)

_BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.experts.down_proj": "ffn_down_exps",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}


def _tensors(hf, split_kv_b: bool):
    """(GGUF name, array) of every weight, named and shaped as the converter writes them."""
    c = hf.config
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}  # fmt: skip
    for name, p in hf.state_dict().items():
        a = p.float().numpy()
        if name in top:
            yield top[name], a
            continue
        _, _, layer, *rest = name.split(".")
        suffix = rest.pop() if rest[-1] in ("weight", "bias") else "weight"  # experts: none
        module, blk = ".".join(rest), f"blk.{layer}"
        if module == "mlp.experts.gate_up_proj":  # [E, 2I, H] -> gate and up, stacked
            half = a.shape[1] // 2
            yield f"{blk}.ffn_gate_exps.weight", a[:, :half]
            yield f"{blk}.ffn_up_exps.weight", a[:, half:]
        elif module == "self_attn.kv_b_proj" and split_kv_b:
            kv_b = a.reshape(c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim, -1)
            yield f"{blk}.attn_k_b.weight", kv_b[:, : c.qk_nope_head_dim].transpose(0, 2, 1)
            yield f"{blk}.attn_v_b.weight", kv_b[:, c.qk_nope_head_dim :]
        else:
            yield f"{blk}.{_BLOCK[module]}.{suffix}", a


def _write_deepseek2_gguf(hf, path, split_kv_b: bool) -> None:
    import gguf

    c = hf.config
    rope, nope, rank = c.qk_rope_head_dim, c.qk_nope_head_dim, c.kv_lora_rank
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    if split_kv_b:  # MLA as MQA: one KV head of the latent and the RoPE key
        w.add_head_count_kv(1)
        w.add_key_length(rank + rope)
        w.add_value_length(rank)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(c.v_head_dim)
    else:
        w.add_head_count_kv(c.num_attention_heads)
        w.add_key_length(nope + rope)
        w.add_value_length(c.v_head_dim)
    if c.q_lora_rank:
        w.add_q_lora_rank(c.q_lora_rank)
    w.add_kv_lora_rank(rank)
    w.add_rope_dimension_count(rope)
    w.add_leading_dense_block_count(c.first_k_dense_replace)
    w.add_expert_count(c.n_routed_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_expert_shared_count(c.n_shared_experts)
    w.add_expert_weights_scale(c.routed_scaling_factor)
    w.add_expert_weights_norm(False)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
    if c.topk_method == "group_limited_greedy":
        w.add_expert_group_count(c.n_group)
        w.add_expert_group_used_count(c.topk_group)
    rp = c.rope_parameters
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rp["factor"])
    w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_log_mul(0.1 * rp["mscale_all_dim"])
    for name, array in _tensors(hf, split_kv_b):
        w.add_tensor(name, np.ascontiguousarray(array))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("split_kv_b,q_lora", [(True, None), (False, 24)])
def test_deepseek2_gguf_matches_transformers(split_kv_b, q_lora, tmp_path, monkeypatch):
    monkeypatch.setenv("LMPROG_CACHE_DIR", str(tmp_path / "cache"))
    # a GGUF's YaRN has mscale == mscale_all_dim (as DeepSeek-V2's checkpoints)
    rope = dict(YARN, mscale=0.707, mscale_all_dim=0.707)
    hf = _hf_tiny(q_lora=q_lora, grouped=True, rope=rope)
    path = tmp_path / "tiny-deepseek2.gguf"
    _write_deepseek2_gguf(hf, path, split_kv_b)
    ours = load_model(path)
    c = ours.config
    assert (c.architecture, c.q_lora_rank, c.kv_lora_rank, c.head_dim, c.v_head_dim) == (
        "deepseek_v2",
        q_lora,
        32,
        24,
        16,
    )
    assert (c.num_experts, c.shared_expert_intermediate_size, c.n_group, c.topk_group) == (
        8,
        24,
        4,
        2,
    )
    assert c.mlp_only_layers == (0,) and c.routed_scaling_factor == 1.5
    assert c.rope_scaling.mscale_all_dim == pytest.approx(0.707)
    assert load_config(path) == c  # again, from the parsed index's cache
    check_paged_parity(ours, hf, _seqs(120), FP32_ATOL)
