"""ModelConfig: the shape of a Llama-family decoder, read from HF config.json or GGUF metadata.

One frozen dataclass covers Llama 2/3/3.1/3.2, SmolLM2, Mistral, Qwen2/2.5 (qkv bias),
Qwen3 (per-head q/k RMSNorm) and Gemma 3 (sliding-window layers, GELU, query scalar); the
differences are fields, not subclasses.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from torch import nn

    from .vision_config import VisionLanguageConfig

RopeType = Literal["default", "linear", "llama3", "freq_factors", "yarn"]

# HF model_type / GGUF general.architecture -> our architecture name (registry key)
_ARCH_ALIASES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "mixtral": "mixtral",  # a GGUF's Mixtral is general.architecture "llama" with experts
    "qwen2_moe": "qwen2_moe",
    "qwen2moe": "qwen2_moe",  # llama.cpp's names
    "qwen3_moe": "qwen3_moe",
    "qwen3moe": "qwen3_moe",
    "deepseek_v2": "deepseek_v2",
    "deepseek2": "deepseek_v2",  # llama.cpp's name
    "llava": "llava",  # vision-language: their language model's shape, plus `vision`
    "llava_next": "llava_next",
    "idefics3": "idefics3",
}
# Gemma 3 as llama.cpp and transformers run it when the checkpoint does not say otherwise.
GEMMA3_SLIDING_WINDOW_PATTERN = 6  # every 6th layer attends globally, the others slide
GEMMA3_LOCAL_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are rescaled for long context.

    linear:       inv_freq / factor
    llama3:       Llama 3.1's wavelength-dependent blend (factor, low/high_freq_factor,
                  original_max_position)
    freq_factors: inv_freq / factors[i], as llama.cpp stores it (GGUF `rope_freqs.weight`)
    yarn:         YaRN (DeepSeek-V2): frequencies between beta_fast and beta_slow rotations
                  over original_max_position blended from extrapolated to interpolated
                  (/ factor); cos and sin scaled by `cos_sin_scale`
    """

    rope_type: RopeType
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    factors: tuple[float, ...] = ()
    beta_fast: float = 32.0  # yarn's fields, named as in transformers' rope_parameters
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3", "freq_factors", "yarn"):
            raise ValueError(
                f"unsupported RoPE scaling {self.rope_type!r}; "
                "supported: linear, llama3, yarn (and freq_factors from GGUF)"
            )
        if self.rope_type == "freq_factors" and not self.factors:
            raise ValueError("freq_factors RoPE scaling needs the per-frequency factors")

    def yarn_mscale(self, m: float = 1.0) -> float:
        """YaRN's temperature 0.1 * m * ln(factor) + 1 (1 when factor <= 1)."""
        return 1.0 if self.factor <= 1 else 0.1 * m * math.log(self.factor) + 1.0

    @property
    def cos_sin_scale(self) -> float:
        """What cos and sin are multiplied by (transformers' attention_factor): YaRN's
        mscale(mscale) / mscale(mscale_all_dim) when both are set, else mscale(1); 1 for
        the other types."""
        if self.rope_type != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return self.yarn_mscale(self.mscale) / self.yarn_mscale(self.mscale_all_dim)
        return self.yarn_mscale()


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one Llama-family model. `head_dim` may differ from hidden/heads (Qwen3)."""

    architecture: str  # registry key: "llama" | "qwen2" | "qwen3" | "gemma3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position: int  # longest context the model supports
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2)
    qk_norm: bool = False  # RMSNorm over each q/k head before RoPE (Qwen3)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default=())
    hidden_act: str = "silu"  # the gated MLP's activation: "silu" or "gelu_pytorch_tanh"
    # Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2); 0 experts: dense. The
    # MoE layers (`is_moe_layer`) route each token to num_experts_per_tok experts of
    # moe_intermediate_size features (layers/moe.py); the others keep the dense gated MLP.
    num_experts: int = 0
    num_experts_per_tok: int = 0  # top-k
    moe_intermediate_size: int = 0  # each routed expert's
    shared_expert_intermediate_size: int = 0  # the always-on shared experts' together; 0: none
    shared_expert_gate: bool = False  # Qwen2-MoE: shared output scaled by sigmoid(x . w)
    norm_topk_prob: bool = True  # the top-k routing weights renormalized to sum 1
    n_group: int = 1  # DeepSeek-V2's group-limited routing: the top-k chosen among the
    topk_group: int = 1  # experts of the topk_group best of n_group groups
    routed_scaling_factor: float = 1.0  # multiplies the routing weights (DeepSeek-V2)
    decoder_sparse_step: int = 1  # layer i is MoE when (i + 1) % step == 0 (Qwen-MoE)
    mlp_only_layers: tuple[int, ...] = ()  # ... and i is not listed here
    # Sliding-window layers (Gemma 3): layer i slides unless (i + 1) % pattern == 0; a sliding
    # layer's query sees the last `sliding_window` positions, its own included.
    sliding_window: int | None = None
    sliding_window_pattern: int = 0  # 0: no sliding layers
    rope_local_theta: float | None = None  # RoPE base of sliding layers (unscaled)
    query_pre_attn_scalar: float | None = None  # attention scale scalar**-0.5; None: head_dim
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    # Multi-head latent attention (DeepSeek-V2) when kv_lora_rank > 0: the pool keeps, per
    # token and layer, the latent c_kv (kv_lora_rank) and the RoPE key (qk_rope_head_dim);
    # head_dim is then the query/key head size qk_nope_head_dim + qk_rope_head_dim.
    q_lora_rank: int | None = None  # None: one q_proj; else q_a_proj, q_a_layernorm, q_b_proj
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # A vision-language model's image encoder, projector and image token (vision_config.py);
    # None: text only. The fields above are then its language model's.
    vision: VisionLanguageConfig | None = None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.hidden_act not in ("silu", "gelu_pytorch_tanh"):
            raise ValueError(
                f"unsupported hidden_act {self.hidden_act!r}; supported: silu, gelu_pytorch_tanh"
            )
        if self.num_experts:
            self._check_experts()
        if self.sliding_window_pattern and not (self.sliding_window and self.sliding_window > 0):
            raise ValueError("sliding_window_pattern needs a positive sliding_window")
        if self.kv_lora_rank:
            self._check_latent_attention()

    def _check_latent_attention(self) -> None:
        dims = (self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim)
        if min(dims) <= 0 or self.qk_rope_head_dim % 2:
            raise ValueError(
                "latent attention needs positive qk_nope_head_dim, v_head_dim and an even "
                f"qk_rope_head_dim, got {dims}"
            )
        if self.head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim:
            raise ValueError(
                f"with latent attention head_dim ({self.head_dim}) is qk_nope_head_dim + "
                f"qk_rope_head_dim ({self.qk_nope_head_dim + self.qk_rope_head_dim})"
            )
        if self.q_lora_rank is not None and self.q_lora_rank <= 0:
            raise ValueError(f"q_lora_rank must be None or positive, got {self.q_lora_rank}")

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer` attends over a sliding window (else over the whole context)."""
        p = self.sliding_window_pattern
        return bool(p) and (layer + 1) % p != 0

    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer`'s MLP is the sparse mixture of experts (else the dense MLP)."""
        return (
            self.num_experts > 0
            and (layer + 1) % self.decoder_sparse_step == 0
            and layer not in self.mlp_only_layers
        )

    def _check_experts(self) -> None:
        e, k, g = self.num_experts, self.num_experts_per_tok, self.n_group
        if not 1 <= k <= e or self.moe_intermediate_size <= 0 or self.decoder_sparse_step < 1:
            raise ValueError(
                f"a mixture of experts needs 1 <= num_experts_per_tok ({k}) <= num_experts "
                f"({e}), a positive moe_intermediate_size ({self.moe_intermediate_size}) and "
                f"decoder_sparse_step >= 1 ({self.decoder_sparse_step})"
            )
        if e % g or not 1 <= self.topk_group <= g or k > self.topk_group * (e // g):
            raise ValueError(
                f"group-limited routing needs n_group ({g}) dividing num_experts ({e}), "
                f"1 <= topk_group ({self.topk_group}) <= n_group and num_experts_per_tok "
                f"({k}) <= the experts of topk_group groups"
            )
        if self.shared_expert_gate and not self.shared_expert_intermediate_size:
            raise ValueError("shared_expert_gate needs shared_expert_intermediate_size > 0")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def mla_softmax_scale(self) -> float:
        """DeepSeek-V2's attention scale: head_dim**-0.5, times YaRN's
        mscale(mscale_all_dim)**2 when the RoPE is YaRN-scaled (as transformers computes it)."""
        scale = self.head_dim**-0.5
        s = self.rope_scaling
        if s is not None and s.rope_type == "yarn" and s.mscale_all_dim:
            scale *= s.yarn_mscale(s.mscale_all_dim) ** 2
        return scale


class ConfiguredModel(Protocol):
    """A loaded model as far as its shapes go (every runtime model: models.llama)."""

    @property
    def config(self) -> ModelConfig: ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...


def local_config(model: ConfiguredModel) -> ModelConfig:
    """The shapes this process's module holds: its shard's under tensor parallelism (the
    `shard_config` parallel.sharding sets), else the model's own config."""
    return getattr(model, "shard_config", None) or model.config


# ---------------------------------------------------------------- Hugging Face config.json


def config_from_hf(hf: dict[str, Any] | str | os.PathLike[str]) -> ModelConfig:
    """Build a ModelConfig from a config.json dict, file, or the folder holding it."""
    if isinstance(hf, dict):
        cfg = hf
    else:
        path = Path(hf)
        cfg = json.loads((path / "config.json" if path.is_dir() else path).read_text())
    model_type = cfg.get("model_type", "")
    if model_type not in _ARCH_ALIASES:
        raise ValueError(
            f"unsupported model_type {model_type!r}; supported: {sorted(_ARCH_ALIASES)}"
        )
    if model_type == "gemma3":
        raise ValueError(
            "model_type 'gemma3' is Gemma 3's image-text model; only its text model "
            "(model_type 'gemma3_text', e.g. gemma-3-270m, gemma-3-1b) or a GGUF is supported"
        )
    if model_type in ("llava", "llava_next", "idefics3"):
        return _vision_language_from_hf(cfg, model_type)
    if model_type == "gemma3_text":
        return _gemma3_from_hf(cfg)
    if model_type == "deepseek_v2":
        return _deepseek_v2_from_hf(cfg)
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {cfg['hidden_act']!r}; only silu")
    if cfg.get("mlp_bias"):
        raise ValueError("mlp_bias=True is not supported")
    heads = cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or rope
    max_pos = cfg.get("max_position_embeddings", 4096)
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if window:  # within the window, sliding-window attention is plain causal attention
        max_pos = min(max_pos, window)
    return ModelConfig(
        architecture=_ARCH_ALIASES[model_type],
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        max_position=max_pos,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rope_scaling=_hf_rope_scaling(scaling, cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(
            cfg.get("attention_bias", cfg.get("qkv_bias", model_type in ("qwen2", "qwen2_moe")))
        ),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
        **_hf_moe_fields(cfg, model_type),
    )


def _vision_language_from_hf(cfg: dict[str, Any], model_type: str) -> ModelConfig:
    """A LLaVA or Idefics3 (SmolVLM) config: its text model's ModelConfig, with `vision`."""
    from dataclasses import replace

    from .vision_config import idefics3_from_hf, llava_from_hf

    text, vision = (idefics3_from_hf if model_type == "idefics3" else llava_from_hf)(cfg)
    if text["model_type"] not in ("llama", "mistral", "qwen2"):
        raise ValueError(
            f"a {model_type} model with a {text['model_type']!r} language model is not "
            "supported (llama, mistral, qwen2)"
        )
    decoder = config_from_hf(text)
    if not 0 <= vision.image_token_id < decoder.vocab_size:
        raise ValueError(
            f"image_token_id {vision.image_token_id} outside the vocabulary ({decoder.vocab_size})"
        )
    return replace(decoder, architecture=_ARCH_ALIASES[model_type], vision=vision)


def _hf_moe_fields(hf: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Mixtral's, Qwen2-MoE's and Qwen3-MoE's expert fields (transformers' defaults where a
    key is absent); {} for a dense model."""
    if model_type == "mixtral":
        return {
            "num_experts": hf.get("num_local_experts", 8),
            "num_experts_per_tok": hf.get("num_experts_per_tok", 2),
            "moe_intermediate_size": hf["intermediate_size"],
        }
    if model_type not in ("qwen2_moe", "qwen3_moe"):
        return {}
    qwen2 = model_type == "qwen2_moe"
    experts = hf.get("num_experts") or hf.get("num_local_experts")  # (transformers v5 saves
    fields = {  # Qwen3-MoE's under the latter name)
        "num_experts": experts or (60 if qwen2 else 128),
        "num_experts_per_tok": hf.get("num_experts_per_tok", 4 if qwen2 else 8),
        "moe_intermediate_size": hf.get("moe_intermediate_size", 1408 if qwen2 else 768),
        "norm_topk_prob": bool(hf.get("norm_topk_prob", False)),
        "decoder_sparse_step": hf.get("decoder_sparse_step", 1),
        "mlp_only_layers": tuple(hf.get("mlp_only_layers") or ()),
    }
    if qwen2:  # one shared expert, gated by sigmoid(x . w)
        fields["shared_expert_intermediate_size"] = hf.get("shared_expert_intermediate_size", 5632)
        fields["shared_expert_gate"] = True
    return fields


def _gemma3_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """Gemma 3's text config (transformers' Gemma3TextConfig, its defaults where a key is
    absent): rope_parameters per layer type (or the older rope_theta / rope_local_base_freq /
    rope_scaling), layer_types (or sliding_window_pattern)."""
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if hf.get("attn_logit_softcapping") is not None:
        raise ValueError("attn_logit_softcapping is not supported (Gemma 2); Gemma 3 has none")
    if hf.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention=True (an embedding model) is not supported")
    layers = hf.get("num_hidden_layers", 26)
    pattern = hf.get("sliding_window_pattern", GEMMA3_SLIDING_WINDOW_PATTERN)
    types = hf.get("layer_types")
    if types is not None:
        sliding = [t == "sliding_attention" for t in types]
        pattern = next((i + 1 for i, s in enumerate(sliding) if not s), 0)
        if len(sliding) != layers or sliding != [
            bool(pattern) and (i + 1) % pattern != 0 for i in range(layers)
        ]:
            raise ValueError(
                "layer_types must repeat (pattern - 1) sliding layers and one global layer"
            )
    rope = hf.get("rope_parameters") or {}
    full = dict(rope.get("full_attention") or {})
    local = dict(rope.get("sliding_attention") or {})
    if not rope and hf.get("rope_scaling"):
        full.update(hf["rope_scaling"])
    if _hf_rope_scaling(local) is not None:
        raise ValueError("RoPE scaling on Gemma 3's sliding layers is not supported")
    heads = hf.get("num_attention_heads", 8)
    return ModelConfig(
        architecture="gemma3",
        vocab_size=hf.get("vocab_size", 262_208),
        hidden_size=hf.get("hidden_size", 2304),
        intermediate_size=hf.get("intermediate_size", 9216),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads", 4),
        head_dim=hf.get("head_dim", 256),
        max_position=hf.get("max_position_embeddings", 131_072),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=float(full.get("rope_theta", hf.get("rope_theta", 1_000_000.0))),
        rope_scaling=_hf_rope_scaling(full),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        attention_bias=bool(hf.get("attention_bias", False)),
        qk_norm=True,
        bos_token_id=hf.get("bos_token_id", 2),
        eos_token_ids=_eos_ids(hf.get("eos_token_id", 1)),
        hidden_act=act,
        sliding_window=hf.get("sliding_window", 4096) if pattern else None,
        sliding_window_pattern=pattern,
        rope_local_theta=float(
            local.get("rope_theta", hf.get("rope_local_base_freq", GEMMA3_LOCAL_ROPE_THETA))
        ),
        query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
        final_logit_softcapping=hf.get("final_logit_softcapping"),
    )


def _eos_ids(eos: int | list[int] | None) -> tuple[int, ...]:
    """config.json's eos_token_id (one id, a list of them, or none) as a tuple."""
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))


def _deepseek_v2_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """DeepSeek-V2 (and V2-Lite): latent attention; a dense MLP in the first
    first_k_dense_replace layers (mlp_only_layers), experts after (transformers'
    DeepseekV2Config defaults where a key is absent)."""
    if hf.get("moe_layer_freq", 1) != 1:
        raise ValueError(f"moe_layer_freq={hf['moe_layer_freq']} is not supported (only 1)")
    if hf.get("hidden_act", "silu") != "silu" or hf.get("mlp_bias"):
        raise ValueError("DeepSeek-V2 with a non-SiLU or biased MLP is not supported")
    if hf.get("scoring_func", "softmax") != "softmax":
        raise ValueError(f"scoring_func {hf['scoring_func']!r} is not supported (DeepSeek-V3?)")
    heads = hf.get("num_attention_heads", 32)
    nope, rope_dim = hf.get("qk_nope_head_dim", 128), hf.get("qk_rope_head_dim", 64)
    max_pos = hf.get("max_position_embeddings", 2048)
    rope = hf.get("rope_parameters") or {}
    return ModelConfig(
        architecture="deepseek_v2",
        vocab_size=hf.get("vocab_size", 102400),
        hidden_size=hf.get("hidden_size", 4096),
        intermediate_size=hf.get("intermediate_size", 11008),
        num_layers=hf.get("num_hidden_layers", 32),
        num_heads=heads,
        num_kv_heads=heads,  # every head has its own k/v, decompressed from one latent
        head_dim=nope + rope_dim,
        max_position=max_pos,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=float(hf.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rope_scaling=_hf_rope_scaling(hf.get("rope_scaling") or rope, max_pos),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", False)),
        bos_token_id=hf.get("bos_token_id", 1),
        eos_token_ids=_eos_ids(hf.get("eos_token_id", 2)),
        q_lora_rank=hf.get("q_lora_rank", 1536),
        kv_lora_rank=hf.get("kv_lora_rank", 512),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope_dim,
        v_head_dim=hf.get("v_head_dim", 128),
        **_deepseek_v2_moe_fields(hf),
    )


def _deepseek_v2_moe_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """Routed experts after the first first_k_dense_replace layers, shared experts beside
    them; topk_method "greedy" (V2-Lite) or "group_limited_greedy" (V2)."""
    top_k, method = hf.get("num_experts_per_tok"), hf.get("topk_method", "greedy")
    if not top_k:
        return {}
    if method not in ("greedy", "group_limited_greedy"):
        raise ValueError(f"topk_method {method!r} is not supported (greedy, group_limited_greedy)")
    grouped = method == "group_limited_greedy"
    inter = hf.get("moe_intermediate_size", 1407)
    return {
        "num_experts": hf.get("n_routed_experts", 64),
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": inter,
        "shared_expert_intermediate_size": (hf.get("n_shared_experts") or 0) * inter,
        "norm_topk_prob": bool(hf.get("norm_topk_prob", False)),
        "n_group": (hf.get("n_group") or 1) if grouped else 1,
        "topk_group": (hf.get("topk_group") or 1) if grouped else 1,
        "routed_scaling_factor": float(hf.get("routed_scaling_factor", 1.0)),
        "mlp_only_layers": tuple(range(hf.get("first_k_dense_replace", 0))),
    }


def _hf_rope_scaling(scaling: dict[str, Any], max_position: int = 8192) -> RopeScaling | None:
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind == "linear":
        return RopeScaling("linear", factor=float(scaling["factor"]))
    if kind == "yarn":  # transformers' keys and defaults (modeling_rope_utils)
        factor = scaling.get("attention_factor")
        return RopeScaling(
            "yarn",
            factor=float(scaling["factor"]),
            original_max_position=int(
                scaling.get("original_max_position_embeddings", max_position)
            ),
            beta_fast=float(scaling.get("beta_fast") or 32),
            beta_slow=float(scaling.get("beta_slow") or 1),
            mscale=float(scaling.get("mscale") or 0),
            mscale_all_dim=float(scaling.get("mscale_all_dim") or 0),
            attention_factor=None if factor is None else float(factor),
            truncate=bool(scaling.get("truncate", True)),
        )
    if kind == "llama3":
        return RopeScaling(
            "llama3",
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position=int(scaling["original_max_position_embeddings"]),
        )
    raise ValueError(f"unsupported RoPE scaling {kind!r}; supported: default, linear, llama3, yarn")


# ---------------------------------------------------------------- GGUF metadata


def config_from_gguf(reader: Any) -> ModelConfig:
    """Build a ModelConfig from a `gguf.GGUFReader` (metadata plus `rope_freqs` if present)."""
    meta = {key: _field_value(f) for key, f in reader.fields.items()}
    arch = meta["general.architecture"]
    if arch == "clip":
        raise ValueError(
            "this GGUF is a vision projector (an mmproj file, architecture 'clip'): give the "
            "model's GGUF as model= and this file as mmproj="
        )
    if arch not in _ARCH_ALIASES:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}; supported: {sorted(_ARCH_ALIASES)}"
        )
    tensors = {t.name: t for t in reader.tensors}

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    heads = get("attention.head_count")
    hidden = get("embedding_length")
    vocab = get("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    eos = meta.get("tokenizer.ggml.eos_token_id")
    head_dim = get("attention.key_length") or hidden // heads
    extra: dict[str, Any] = {}
    if arch == "gemma3":  # what llama.cpp's gemma3 graph hard-codes beside the metadata
        extra = {
            "hidden_act": "gelu_pytorch_tanh",
            "sliding_window": get("attention.sliding_window"),
            "sliding_window_pattern": GEMMA3_SLIDING_WINDOW_PATTERN,
            "rope_local_theta": GEMMA3_LOCAL_ROPE_THETA,
            # 27B (62 layers) scales by hidden / heads, the others by head_dim (llama.cpp)
            "query_pre_attn_scalar": float(
                hidden // heads if get("block_count") == 62 else head_dim
            ),
            "final_logit_softcapping": get("final_logit_softcapping"),
        }
    if arch == "deepseek2":  # latent attention: its head sizes are not key_length's
        extra = _gguf_deepseek2_fields(get)
        head_dim = extra["qk_nope_head_dim"] + extra["qk_rope_head_dim"]
    if get("expert_count"):
        moe = _gguf_moe_fields(arch, get, tensors, get("block_count"))
        extra = {**moe, **extra}
    return ModelConfig(
        architecture="mixtral" if arch == "llama" and extra else _ARCH_ALIASES[arch],
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_layers=get("block_count"),
        num_heads=heads,
        num_kv_heads=get("attention.head_count_kv") or heads,
        head_dim=head_dim,
        max_position=get("context_length", 4096),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=_gguf_rope_scaling(get, tensors),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
        **extra,
    )


def _gguf_moe_fields(arch: str, get: Any, tensors: dict[str, Any], layers: int) -> dict[str, Any]:
    """The expert fields of a MoE GGUF (Mixtral as "llama", qwen2moe, qwen3moe): the dense
    layers are those without a router (ffn_gate_inp); llama.cpp renormalizes the top-k
    weights of llama and qwen3moe, not of qwen2moe, unless expert_weights_norm says."""
    shared = get("expert_shared_feed_forward_length") or 0
    return {
        "num_experts": get("expert_count"),
        "num_experts_per_tok": get("expert_used_count"),
        "moe_intermediate_size": get("expert_feed_forward_length") or get("feed_forward_length"),
        "shared_expert_intermediate_size": shared,
        "shared_expert_gate": any(n.endswith(".ffn_gate_inp_shexp.weight") for n in tensors),
        "norm_topk_prob": bool(get("expert_weights_norm", arch != "qwen2moe")),
        "mlp_only_layers": tuple(
            i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in tensors
        ),
    }


def _gguf_deepseek2_fields(get: Any) -> dict[str, Any]:
    """llama.cpp's deepseek2 metadata: MLA sizes (key/value_length_mla in GGUFs converted
    for its MLA path, whose key_length is then kv_lora_rank + rope; key/value_length in
    older ones), shared experts, routing scale and groups."""
    rope = get("rope.dimension_count")
    qk = get("attention.key_length_mla") or get("attention.key_length")
    if get("expert_gating_func", 1) != 1:  # llama.cpp: 1 softmax, 2 sigmoid (DeepSeek-V3)
        raise ValueError("only softmax expert gating (DeepSeek-V2) is supported")
    return {
        "q_lora_rank": get("attention.q_lora_rank") or None,
        "kv_lora_rank": get("attention.kv_lora_rank"),
        "qk_nope_head_dim": qk - rope,
        "qk_rope_head_dim": rope,
        "v_head_dim": get("attention.value_length_mla") or get("attention.value_length"),
        "shared_expert_intermediate_size": (get("expert_shared_count") or 0)
        * (get("expert_feed_forward_length") or 0),
        "norm_topk_prob": bool(get("expert_weights_norm", False)),
        "routed_scaling_factor": float(get("expert_weights_scale", 1.0)),
        "n_group": get("expert_group_count") or 1,
        "topk_group": get("expert_group_used_count") or 1,
    }


def _gguf_rope_scaling(get: Any, tensors: dict[str, Any]) -> RopeScaling | None:
    if "rope_freqs.weight" in tensors:  # llama.cpp bakes Llama-3 scaling into this tensor
        factors = tensors["rope_freqs.weight"].data
        return RopeScaling("freq_factors", factors=tuple(float(x) for x in factors))
    kind = get("rope.scaling.type", "none")
    if kind in ("none", None):
        return None
    if kind == "linear":
        return RopeScaling("linear", factor=float(get("rope.scaling.factor")))
    if kind == "yarn":  # llama.cpp stores DeepSeek's 0.1 * mscale_all_dim (and takes mscale
        m = (get("rope.scaling.yarn_log_multiplier") or 0.0) / 0.1  # equal to it)
        return RopeScaling(
            "yarn",
            factor=float(get("rope.scaling.factor")),
            original_max_position=int(get("rope.scaling.original_context_length")),
            mscale=m,
            mscale_all_dim=m,
        )
    raise ValueError(f"unsupported GGUF RoPE scaling {kind!r}")


def _field_value(f: Any) -> Any:
    try:
        return f.contents()
    except Exception:  # noqa: BLE001 - exotic field types are metadata we never read
        return None
