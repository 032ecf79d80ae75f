"""Shared by the LoRA tests: tiny PEFT adapter folders written by hand (the layout PEFT
saves: adapter_config.json + adapter_model.safetensors), and the reference a merged model
gives (W + scale * B @ A folded into lmprog's fused projections)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from lmprog.runtime.lora.adapter import ATTENTION_MODULES, module_shapes
from lmprog.runtime.models import ModelConfig

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(
    folder: Path,
    config: ModelConfig,
    *,
    rank: int = 4,
    alpha: float = 8.0,
    targets: tuple[str, ...] = ALL,
    seed: int = 0,
    std: float = 0.3,
    layers: tuple[int, ...] | None = None,
    rslora: bool = False,
    extra_config: dict | None = None,
) -> Path:
    """A random adapter of `rank` on `targets` (every layer, or `layers`), as PEFT saves it.
    Both A and B random (a freshly initialized PEFT adapter has B = 0: no effect)."""
    folder.mkdir(parents=True, exist_ok=True)
    shapes = module_shapes(config)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in layers if layers is not None else range(config.num_layers):
        for module in targets:
            fan_in, fan_out = shapes[module]
            block = "self_attn" if module in ATTENTION_MODULES else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) * std
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * std
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    cfg = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": list(targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": rslora,
        "task_type": "CAUSAL_LM",
        **(extra_config or {}),
    }
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


def merged(model, folder: Path):
    """A copy of lmprog module `model` with the adapter in `folder` merged into its weights
    (computed here from the files, independently of lmprog's loader)."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "adapter_config.json").read_text())
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    out = copy.deepcopy(model)
    c = model.config
    bounds = {
        "q_proj": ("self_attn.qkv_proj", 0, c.q_size),
        "k_proj": ("self_attn.qkv_proj", c.q_size, c.q_size + c.kv_size),
        "v_proj": ("self_attn.qkv_proj", c.q_size + c.kv_size, c.q_size + 2 * c.kv_size),
        "o_proj": ("self_attn.o_proj", 0, c.hidden_size),
        "gate_proj": ("mlp.gate_up_proj", 0, c.intermediate_size),
        "up_proj": ("mlp.gate_up_proj", c.intermediate_size, 2 * c.intermediate_size),
        "down_proj": ("mlp.down_proj", 0, c.hidden_size),
    }
    params = dict(out.named_parameters())
    with torch.no_grad():
        for key, a in tensors.items():
            if ".lora_A." not in key:
                continue
            b = tensors[key.replace(".lora_A.", ".lora_B.")]
            parts = key.split(".")
            layer, module = int(parts[4]), parts[6]
            r = a.shape[0]
            alpha = cfg.get("alpha_pattern", {}).get(module, cfg["lora_alpha"])
            scale = alpha / (math.sqrt(r) if cfg.get("use_rslora") else r)
            name, lo, hi = bounds[module]
            w = params[f"model.layers.{layer}.{name}.weight"]
            w[lo:hi] += (scale * b.double() @ a.double()).to(device=w.device, dtype=w.dtype)
    return out
