"""Model definitions, configs and loaders (Llama family)."""

from .config import ModelConfig, RopeScaling, config_from_gguf, config_from_hf
from .loaders import build_model, load_config, load_model, resolve_dtype
from .presets import PRESETS, preset
from .registry import model_class, supported_architectures

__all__ = [
    "PRESETS",
    "ModelConfig",
    "RopeScaling",
    "build_model",
    "config_from_gguf",
    "config_from_hf",
    "load_config",
    "load_model",
    "model_class",
    "preset",
    "resolve_dtype",
    "supported_architectures",
]
