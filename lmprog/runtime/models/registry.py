"""Architecture name (ModelConfig.architecture) -> model class, imported lazily."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .llama import LlamaForCausalLM

_ARCHITECTURES: dict[str, str] = {
    "llama": "lmprog.runtime.models.llama:LlamaForCausalLM",  # also Mistral, SmolLM2
    "qwen2": "lmprog.runtime.models.llama:LlamaForCausalLM",  # qkv bias via the config
    "qwen3": "lmprog.runtime.models.llama:LlamaForCausalLM",  # q/k norm via the config
    "gemma3": "lmprog.runtime.models.gemma3:Gemma3ForCausalLM",  # sliding-window layers
    "deepseek_v2": "lmprog.runtime.models.deepseek_v2:DeepseekV2ForCausalLM",  # latent attn
    "mixtral": "lmprog.runtime.models.moe:MoeForCausalLM",  # Llama + sparse MoE MLPs
    "qwen2_moe": "lmprog.runtime.models.moe:MoeForCausalLM",  # + shared expert, qkv bias
    "qwen3_moe": "lmprog.runtime.models.moe:MoeForCausalLM",  # q/k norm via the config
    "llava": "lmprog.runtime.models.llava:LlavaForConditionalGeneration",  # CLIP + MLP + Llama
    "llava_next": "lmprog.runtime.models.llava:LlavaNextForConditionalGeneration",  # any-res
    "idefics3": "lmprog.runtime.models.idefics3:Idefics3ForConditionalGeneration",  # SmolVLM
}


def supported_architectures() -> list[str]:
    return sorted(_ARCHITECTURES)


def model_class(architecture: str) -> type[LlamaForCausalLM]:
    if architecture not in _ARCHITECTURES:
        raise ValueError(
            f"unsupported architecture {architecture!r}; supported: {supported_architectures()}"
        )
    module, name = _ARCHITECTURES[architecture].split(":")
    return getattr(importlib.import_module(module), name)
