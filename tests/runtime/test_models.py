import pytest
import torch

from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.models import (
    PRESETS,
    ModelConfig,
    RopeScaling,
    build_model,
    config_from_hf,
    load_config,
    load_model,
    preset,
    resolve_dtype,
)

torch.set_num_threads(1)
TINY = ModelConfig(
    "qwen3",
    vocab_size=97,
    hidden_size=32,
    intermediate_size=48,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position=256,
    qk_norm=True,
)


# ------------------------------------------------------------------ configs


def test_hf_configs_map_to_model_flags():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    qwen2 = config_from_hf(
        Qwen2Config(
            hidden_size=64, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True
        ).to_dict()
    )
    assert (qwen2.architecture, qwen2.attention_bias, qwen2.qk_norm) == ("qwen2", True, False)
    assert qwen2.tie_word_embeddings and qwen2.head_dim == 16 and qwen2.num_kv_heads == 2

    qwen3 = config_from_hf(
        Qwen3Config(
            hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32
        ).to_dict()
    )
    assert (qwen3.architecture, qwen3.attention_bias, qwen3.qk_norm) == ("qwen3", False, True)
    assert qwen3.head_dim == 32  # not hidden / heads

    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_theta": 500000.0,
    }
    llama = config_from_hf(
        LlamaConfig(
            rope_parameters=rope, max_position_embeddings=131072, eos_token_id=[7, 9]
        ).to_dict()
    )
    assert llama.rope_theta == 500000.0 and llama.eos_token_ids == (7, 9)
    assert llama.rope_scaling == RopeScaling(
        "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192
    )

    mistral = config_from_hf(
        MistralConfig(sliding_window=4096, max_position_embeddings=32768).to_dict()
    )
    assert mistral.architecture == "llama" and mistral.max_position == 4096


def test_legacy_rope_scaling_key_and_bad_configs():
    base = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
    }
    cfg = config_from_hf(
        {**base, "rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2}}
    )
    assert cfg.rope_scaling == RopeScaling("linear", factor=2.0) and cfg.num_kv_heads == 2
    with pytest.raises(ValueError, match="unsupported RoPE scaling 'longrope'"):
        config_from_hf({**base, "rope_scaling": {"rope_type": "longrope", "factor": 2}})
    with pytest.raises(ValueError, match="model_type"):
        config_from_hf({**base, "model_type": "gpt2"})
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelConfig("llama", 10, 8, 16, 1, num_heads=3, num_kv_heads=2, head_dim=4, max_position=8)


# Parameter counts published for these models (embeddings included once when tied).
@pytest.mark.parametrize(
    "name,params",
    [
        ("smollm2-135m", 134_515_008),
        ("llama-3.1-8b", 8_030_261_248),
        ("llama-3.2-1b", 1_235_814_400),
        ("qwen2.5-0.5b", 494_032_768),
        ("qwen3-0.6b", 596_049_920),
    ],
)
def test_presets_have_the_published_shapes(name, params):
    model = build_model(preset(name), device="meta", dtype="float32")
    assert sum(p.numel() for p in model.parameters()) == params


def test_unknown_preset_and_format_errors():
    with pytest.raises(ValueError, match="presets"):
        preset("gpt-5")
    with pytest.raises(ValueError, match="load_format='dummy'"):
        load_model("llama-3.1-8b")
    with pytest.raises(ValueError, match="load_format"):
        load_model(TINY, load_format="pickle")
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("float8", "cpu")
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    assert load_config("Qwen3-0.6B") is PRESETS["qwen3-0.6b"]


# ------------------------------------------------------------------ dummy weights and forward


def _prefill_logits(model, ids):
    kv = KVPool.for_model(model.config, 64, next(model.parameters()).dtype, "cpu")
    r2t = torch.zeros(2, 64, dtype=torch.int32)
    r2t[1, : len(ids)] = torch.arange(1, len(ids) + 1)
    batch = ForwardBatch.build(
        input_ids=ids,
        out_cache_loc=range(1, len(ids) + 1),
        req_pool_indices=[1],
        seq_lens=[len(ids)],
        extend_lens=[len(ids)],
        req_to_token=r2t,
        logits_indices=range(len(ids)),
    )
    with torch.inference_mode():
        return model(batch, kv), kv


def test_dummy_weights_are_finite_seeded_and_fill_the_pool():
    a = load_model(TINY, load_format="dummy", seed=1)
    logits, kv = _prefill_logits(a, [3, 1, 4, 1, 5])
    assert logits.shape == (5, 97) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all() and logits.std() > 0
    assert kv.k[1][1:6].abs().sum(-1).gt(0).all() and not kv.k[1][6:].any()
    again, _ = _prefill_logits(load_model(TINY, load_format="dummy", seed=1), [3, 1, 4, 1, 5])
    other, _ = _prefill_logits(load_model(TINY, load_format="dummy", seed=2), [3, 1, 4, 1, 5])
    assert torch.equal(logits, again) and not torch.equal(logits, other)


def test_dummy_preset_in_bf16_keeps_activations_finite():
    model = load_model("smollm2-135m", load_format="dummy", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    logits, _ = _prefill_logits(model, list(range(1, 20)))
    assert torch.isfinite(logits).all() and logits.abs().max() < 100


def test_load_weights_reports_missing_and_misshaped_tensors():
    model = build_model(TINY)
    names = {n: p for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match="lacks"):
        model.load_weights([("model.norm.weight", torch.ones(32))])
    with pytest.raises(ValueError, match="expects"):
        model.load_weights([("model.layers.0.self_attn.k_proj.weight", torch.ones(16, 32))])
    with pytest.raises(ValueError, match="no place"):
        model.load_weights([("model.layers.0.self_attn.q_proj.bias", torch.ones(64))])
    assert "model.layers.0.self_attn.qkv_proj.weight" in names and "lm_head.weight" in names
