"""Named architectures for `load_format="dummy"`: real shapes, random weights, no checkpoint."""

from __future__ import annotations

from .config import ModelConfig, RopeScaling

_LLAMA31_ROPE = RopeScaling(
    "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192
)
_LLAMA32_ROPE = RopeScaling(
    "llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192
)

PRESETS: dict[str, ModelConfig] = {
    "llama-2-7b": ModelConfig(
        "llama",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        max_position=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "llama-3.1-8b": ModelConfig(
        "llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_LLAMA31_ROPE,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
    ),
    "llama-3.2-1b": ModelConfig(
        "llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        max_position=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_LLAMA32_ROPE,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
    ),
    "mistral-7b": ModelConfig(  # v0.3
        "llama",
        vocab_size=32768,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position=32768,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "smollm2-135m": ModelConfig(
        "llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        max_position=8192,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "qwen2.5-0.5b": ModelConfig(
        "qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        max_position=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        attention_bias=True,
        eos_token_ids=(151645, 151643),
    ),
    "qwen2.5-7b": ModelConfig(
        "qwen2",
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        max_position=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        attention_bias=True,
        eos_token_ids=(151645, 151643),
    ),
    "qwen3-0.6b": ModelConfig(
        "qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        max_position=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        qk_norm=True,
        eos_token_ids=(151645, 151643),
    ),
    "qwen3-8b": ModelConfig(
        "qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        qk_norm=True,
        eos_token_ids=(151645, 151643),
    ),
}


def preset(name: str) -> ModelConfig:
    """The named architecture; raise ValueError listing the names when it is unknown."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown architecture preset {name!r}; presets: {sorted(PRESETS)}"
        ) from None
