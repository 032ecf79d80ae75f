"""Build a model from a GGUF file, a Hugging Face folder, or a named/any config with random weights.

load_model()                                        # the bundled default GGUF, fp32, CPU
load_model("/m/Qwen2.5-0.5B", device="cuda", dtype="bfloat16")
load_model("llama-3.1-8b", load_format="dummy", device="cuda")
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from lmprog.core.models import ModelSource, resolve_model

from ...layers.attention import AttentionBackend, create_attention_backend
from ..config import ModelConfig, config_from_hf
from ..presets import PRESETS
from ..registry import model_class
from .dummy import init_dummy_weights
from .fp8 import fp8_scheme, load_fp8_checkpoint
from .gguf import read_gguf
from .hf import safetensors_weights
from .mmproj import read_mmproj
from .vlm_gguf import vision_language_config, vision_language_weights
from .weight_cache import cached_gguf_weights

if TYPE_CHECKING:
    from ..llama import LlamaForCausalLM

LoadFormat = Literal["auto", "gguf", "safetensors", "dummy"]
ModelRef = str | os.PathLike[str] | ModelSource | ModelConfig | None

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype, device: torch.device | str) -> torch.dtype:
    """ "auto" is bf16 on a GPU, fp32 elsewhere; names and torch dtypes pass through."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; use float32, bfloat16 or float16")
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def load_config(model: ModelRef = None) -> ModelConfig:
    """The ModelConfig of a preset name, a GGUF file, an HF folder, or a ModelConfig."""
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, str) and model.lower() in PRESETS:
        return PRESETS[model.lower()]
    source = model if isinstance(model, ModelSource) else resolve_model(model)
    if source.kind == "gguf":
        return read_gguf(source.path).config
    return config_from_hf(source.path)


def build_model(
    config: ModelConfig,
    *,
    device: torch.device | str = "cpu",
    dtype: str | torch.dtype = "auto",
    attention: str = "torch",
) -> LlamaForCausalLM:
    """The model with uninitialised weights (allocated, not zeroed) on `device`."""
    device = torch.device(device)
    attn = _attention_backend(attention, config, device)
    target = resolve_dtype(dtype, device)
    if config.kv_lora_rank and attention == "triton" and device.type == "cuda":
        _check_fp32_latent(config, attn, target)
    with torch.device("meta"), _no_init():
        model = model_class(config.architecture)(config, attn)

    def allocate(t: torch.Tensor) -> torch.Tensor:  # .to(dtype).to_empty(device) in one pass
        kind = target if t.is_floating_point() else t.dtype
        return torch.empty(t.shape, dtype=kind, device=device)  # empty_like on meta is slow

    return model._apply(allocate).eval()


def _check_fp32_latent(config: ModelConfig, attn: Any, dtype: torch.dtype) -> None:
    """Latent attention's Triton kernels on CUDA take fp32 only in tiles of a few query heads
    (kernels.attention.FP32_LATENT_MAX_GROUP): refuse the model here, not at its first step."""
    from ...kernels.attention import FP32_LATENT_MAX_GROUP

    group = config.num_heads // attn.num_kv_heads
    if dtype == torch.float32 and group > FP32_LATENT_MAX_GROUP:
        raise ValueError(
            f"latent attention in float32 on CUDA takes at most {FP32_LATENT_MAX_GROUP} query "
            f"heads a tile, this model {group}: use dtype='bfloat16' or 'float16' on the GPU"
        )


def _attention_backend(name: str, config: ModelConfig, device: torch.device) -> AttentionBackend:
    """The config's attention: per-head K/V, or latent attention (one KV head of
    kv_lora_rank, keys longer by the RoPE key, DeepSeek-V2's softmax scale)."""
    if config.kv_lora_rank:
        return create_attention_backend(
            name,
            config.num_heads,
            1,
            config.kv_lora_rank,
            device,
            rope_dim=config.qk_rope_head_dim,
            scale=config.mla_softmax_scale,
        )
    return create_attention_backend(
        name, config.num_heads, config.num_kv_heads, config.head_dim, device
    )


_INIT_FUNCTIONS = ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_", "xavier_uniform_")
_init_lock = threading.Lock()


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """Modules built without drawing initial values (as transformers' `no_init_weights`):
    the memory is allocated afresh anyway, and on the meta device the first draw alone
    imports torch's reference decompositions (seconds of start-up)."""
    with _init_lock:
        saved = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS}
        try:
            for name in _INIT_FUNCTIONS:
                setattr(nn.init, name, _keep)
            yield
        finally:
            for name, fn in saved.items():
                setattr(nn.init, name, fn)


def _keep(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return tensor


def load_model(
    model: ModelRef = None,
    *,
    device: torch.device | str = "cpu",
    dtype: str | torch.dtype = "auto",
    load_format: LoadFormat = "auto",
    attention: str = "torch",
    seed: int = 0,
    mmproj: str | os.PathLike[str] | None = None,
) -> LlamaForCausalLM:
    """Load weights into a fresh model; `load_format="dummy"` draws random ones (`seed`).
    mmproj: llama.cpp's projector GGUF of a vision-language model whose decoder `model` (a
    GGUF) holds."""
    source = weights_source(model, load_format)
    if mmproj is not None:
        if source is None or source.kind != "gguf":
            raise ValueError(
                f"mmproj= goes with the GGUF of a vision-language model's decoder; {model!r} is "
                "not one (a Hugging Face folder holds its vision tower itself)"
            )
        index = read_gguf(source.path)
        projector = read_mmproj(mmproj)
        config = vision_language_config(index, projector)
        net = build_model(config, device=device, dtype=dtype, attention=attention)
        net.load_weights(vision_language_weights(index, projector, resolve_dtype(dtype, device)))
        return net
    if source is None:
        config = load_config(model)
        net = build_model(config, device=device, dtype=dtype, attention=attention)
        init_dummy_weights(net, config.num_layers, seed)
        return net
    if source.kind == "gguf":
        index = read_gguf(source.path)
        # cached in the dtype the model computes in (fp32 on a CPU by default, bf16 on a GPU)
        config, weights = index.config, cached_gguf_weights(index, resolve_dtype(dtype, device))
    else:
        config = config_from_hf(source.path)
        weights = safetensors_weights(source.path)
    net = build_model(config, device=device, dtype=dtype, attention=attention)
    fp8 = fp8_scheme(source.path) if source.kind != "gguf" else None
    if fp8 is not None:  # an FP8 checkpoint: its FP8 linears load as layers.fp8_linear's
        load_fp8_checkpoint(net, source.path, fp8)
    else:
        net.load_weights(weights)
    return net


def weights_source(model: ModelRef, load_format: str) -> ModelSource | None:
    """Where load_model (and a tensor-parallel rank's load_shard) reads `model`'s weights:
    its files, checked against load_format, or None for load_format="dummy" (random
    weights). ValueError for an unknown load_format, for an architecture named without
    weights, and for files of the other format."""
    if load_format not in ("auto", "gguf", "safetensors", "dummy"):
        raise ValueError(
            f"unknown load_format {load_format!r}; use auto, gguf, safetensors or dummy"
        )
    if load_format == "dummy":
        return None
    if isinstance(model, ModelConfig) or (isinstance(model, str) and model.lower() in PRESETS):
        raise ValueError(
            f"{model!r} names an architecture without weights; pass "
            "load_format='dummy' for random weights, or a GGUF file / HF folder"
        )
    source = model if isinstance(model, ModelSource) else resolve_model(model)
    expected = "gguf" if source.kind == "gguf" else "safetensors"
    if load_format not in ("auto", expected):
        raise ValueError(f"{source.path} is a {source.kind} model; use load_format='auto'")
    return source


__all__ = ["build_model", "load_config", "load_model", "resolve_dtype", "weights_source"]
