"""A LoRA adapter read from PEFT's folder layout, checked against the model it will serve.

    adapter = read_adapter(folder, model_config, name="sql")

The seven Llama-family projections are supported; anything else is a LoraError saying
what and why. A and B are kept in fp32, B scaled. Design: docs/design/lora.md.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load_file

from lmprog.core.errors import LoraError

SUPPORTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")

# module -> (the fused projection it is part of in lmprog's models, its slice there)
FUSED_SLICE = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "o_proj": ("o_proj", 0),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
    "down_proj": ("down_proj", 0),
}

_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?:model\.)?layers\.(?P<layer>\d+)\."
    r"(?P<block>self_attn|mlp)\.(?P<module>\w+)\.lora_(?P<ab>[AB])(?:\.[\w-]+)?\.weight$"
)
_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


@dataclass
class LoraAdapter:
    """One adapter's weights, checked against a model config.

    weights: (layer, module) -> (A [r, in] fp32, B * scale [out, r] fp32), CPU tensors.
    rank: the largest r of its modules. targets: the modules it adapts (HF names).
    uid: set by the engine when it registers the adapter (0 = not registered); a prefix
    cached under one uid is never served to another (the radix cache keys by it)."""

    name: str
    path: str
    rank: int
    targets: frozenset[str]
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    config: dict[str, Any] = field(default_factory=dict)
    uid: int = 0

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size()
                   for a, b in self.weights.values())  # fmt: skip


def module_shapes(config: Any) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each adaptable projection of `config`'s layers."""
    h, q, kv, inter = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }


def check_model_supports_lora(model: Any) -> None:
    """LoraError unless `model` is a Llama-family decoder lmprog can adapt (its layers'
    self_attn.qkv_proj / o_proj; MLP modules only on dense layers)."""
    config = model.config
    if getattr(config, "kv_lora_rank", 0):
        raise LoraError(
            f"LoRA adapters are not supported on {config.architecture} (multi-head latent "
            "attention) yet; the Llama family (Llama, Mistral, Qwen2/3, SmolLM2, Gemma 3) is"
        )
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not all(
        hasattr(layer, "self_attn") and hasattr(layer.self_attn, "qkv_proj") for layer in layers
    ):
        raise LoraError(f"LoRA adapters are not supported on {type(model).__name__}")


def read_adapter(
    path: str | os.PathLike[str], config: Any, *, name: str | None = None
) -> LoraAdapter:
    """Read and check the PEFT adapter folder `path` against model config `config` (the
    whole model's ModelConfig). Raises LoraError saying what is wrong."""
    path = os.fspath(path)
    label = name or path
    if not os.path.isdir(path):
        what = "does not exist" if not os.path.exists(path) else "is not a folder"
        raise LoraError(
            f"LoRA adapter {label!r}: {path} {what}; give a PEFT adapter folder "
            "(adapter_config.json + adapter_model.safetensors)",
            adapter=name,
        )
    cfg = _read_config(path, label, name)
    tensors = _read_tensors(path, label, name)
    weights, targets, rank = _check_tensors(tensors, cfg, config, label, name)
    return LoraAdapter(name or path, path, rank, frozenset(targets), weights, cfg)


def _fail(label: str, name: str | None, message: str) -> LoraError:
    return LoraError(f"LoRA adapter {label!r}: {message}", adapter=name)


def _read_config(path: str, label: str, name: str | None) -> dict[str, Any]:
    file = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(file):
        raise _fail(label, name, f"{path} has no adapter_config.json (not a PEFT adapter folder)")
    try:
        with open(file, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as exc:
        raise _fail(label, name, f"cannot read adapter_config.json: {exc}") from exc
    if not isinstance(cfg, dict):
        raise _fail(label, name, "adapter_config.json is not a JSON object")
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise _fail(label, name, f"peft_type {peft_type!r}: only LoRA adapters are served")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise _fail(label, name, f"adapter_config.json's r must be a positive int, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise _fail(
            label, name, f"adapter_config.json's lora_alpha must be a number, got {alpha!r}"
        )
    unsupported = [
        (cfg.get("use_dora"), "use_dora (DoRA)"),
        (cfg.get("bias", "none") not in (None, "none"), f"bias={cfg.get('bias')!r} (trained biases)"),
        (cfg.get("modules_to_save"), "modules_to_save (whole trained modules)"),
        (cfg.get("fan_in_fan_out"), "fan_in_fan_out (transposed weights)"),
        (cfg.get("layer_replication"), "layer_replication"),
    ]  # fmt: skip
    for flagged, what in unsupported:
        if flagged:
            raise _fail(label, name, f"{what} is not supported; plain LoRA adapters are")
    for key in ("rank_pattern", "alpha_pattern"):
        if not isinstance(cfg.get(key) or {}, dict):
            raise _fail(label, name, f"adapter_config.json's {key} must be an object")
    return cfg


def _read_tensors(path: str, label: str, name: str | None) -> dict[str, torch.Tensor]:
    for file_name in _WEIGHT_FILES:
        file = os.path.join(path, file_name)
        if not os.path.isfile(file):
            continue
        try:
            if file_name.endswith(".safetensors"):
                return load_file(file, device="cpu")
            loaded = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise _fail(label, name, f"cannot read {file_name}: {exc}") from exc
        if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
        ):
            raise _fail(label, name, f"{file_name} is not a dict of named tensors")
        return loaded
    raise _fail(label, name, f"{path} has no {' or '.join(_WEIGHT_FILES)}")


def _check_tensors(
    tensors: dict[str, torch.Tensor], cfg: dict[str, Any], config: Any, label: str, name: str | None
) -> tuple[dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]], set[str], int]:
    if not tensors:
        raise _fail(label, name, "the weights file holds no tensors")
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    unknown: list[str] = []
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        module = m["module"] if m else None
        if m is None or module not in SUPPORTED_MODULES:
            unknown.append(key)
            continue
        block = "self_attn" if module in ATTENTION_MODULES else "mlp"
        if m["block"] != block:
            unknown.append(key)
            continue
        pairs.setdefault((int(m["layer"]), module), {})[m["ab"]] = tensor
    if unknown:
        raise _fail(
            label,
            name,
            f"{len(unknown)} tensors are not LoRA weights of a projection lmprog adapts, e.g. "
            f"{', '.join(sorted(unknown)[:3])} (supported: {', '.join(SUPPORTED_MODULES)} of "
            "a Llama-family model's decoder layers; embeddings and lm_head are not)",
        )
    shapes = module_shapes(config)
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    rank = 0
    for (layer, module), ab in sorted(pairs.items()):
        where = f"layer {layer} {module}"
        if set(ab) != {"A", "B"}:
            missing = "lora_B" if "A" in ab else "lora_A"
            raise _fail(label, name, f"{where} has no {missing} weight")
        if layer >= config.num_layers:
            raise _fail(
                label,
                name,
                f"{where}: the model has {config.num_layers} layers; the adapter was trained "
                "for another base model",
            )
        if module in MLP_MODULES and config.is_moe_layer(layer):
            raise _fail(label, name, f"{where}: layer {layer} is a mixture-of-experts layer")
        a, b = ab["A"], ab["B"]
        fan_in, fan_out = shapes[module]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or a.shape[0] == 0:
            raise _fail(
                label,
                name,
                f"{where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} are not [r, in] "
                "and [out, r] of one rank r",
            )
        if a.shape[1] != fan_in or b.shape[0] != fan_out:
            raise _fail(
                label,
                name,
                f"{where}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} need in={fan_in}, "
                f"out={fan_out} for this model ({config.architecture}); the adapter was "
                "trained for another base model",
            )
        if not (a.is_floating_point() and b.is_floating_point()):
            raise _fail(label, name, f"{where}: the weights are not floating point")
        a32, b32 = a.float(), b.float()
        if not (torch.isfinite(a32).all() and torch.isfinite(b32).all()):
            raise _fail(label, name, f"{where}: the weights hold NaN or infinity")
        r = a.shape[0]
        scale = _scale(
            cfg,
            f"model.layers.{layer}.{'self_attn' if module in ATTENTION_MODULES else 'mlp'}.{module}",
            r,
        )
        weights[(layer, module)] = (a32.contiguous(), (b32 * scale).contiguous())
        rank = max(rank, r)
    return weights, {module for _, module in weights}, rank


def _scale(cfg: dict[str, Any], module_name: str, r: int) -> float:
    """alpha / r (alpha / sqrt(r) with use_rslora), alpha from `alpha_pattern` when one of
    its keys matches the module (as PEFT matches them: the key ends the module's name)."""
    alpha = cfg.get("lora_alpha", cfg["r"])  # PEFT's default alpha: r (which every config has)
    for key, value in (cfg.get("alpha_pattern") or {}).items():
        if re.fullmatch(rf"(.*\.)?(?:{key})", module_name):
            alpha = value
            break
    return float(alpha) / (math.sqrt(r) if cfg.get("use_rslora") else r)
