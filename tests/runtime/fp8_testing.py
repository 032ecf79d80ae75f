"""FP8 checkpoints for the tests, written the way vLLM / SGLang / DeepSeek store them:
`to_fp8_folder(src, dst, mode)` converts a tiny HF folder (tp_testing.write_tiny) into one.

    mode "tensor"   per-tensor weight_scale [] and a static input_scale [] (llm-compressor's
                    FP8 "static" layout, as in Meta-Llama-3-8B-Instruct-FP8)
    mode "channel"  per-channel weight_scale [N, 1], dynamic activations
    mode "block"    weight_scale_inv [ceil(N / 32), ceil(K / 32)], weight_block_size [32, 32]
                    (DeepSeek-V3's layout at the tiny model's size)
"""

from __future__ import annotations

import json
import shutil

import torch
from safetensors.torch import load_file, save_file

from lmprog.runtime.models import ModelConfig

FP8 = torch.float8_e4m3fn
# a small Llama for the FP8 tests: dummy weights as benchmarks draw them (std 0.02)
TINY = ModelConfig("llama", vocab_size=256, hidden_size=128, intermediate_size=256,
                   num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32,
                   max_position=512)  # fmt: skip
BLOCK = 32
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_blocks(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's weight quantization: one scale per block x block tile."""
    n, k = w.shape
    rows, cols = -(-n // block), -(-k // block)
    scale = torch.empty(rows, cols)
    q = torch.empty(n, k, dtype=FP8)
    for i in range(rows):
        for j in range(cols):
            tile = w[i * block : (i + 1) * block, j * block : (j + 1) * block]
            s = tile.abs().max().clamp(min=1e-10) / 448
            scale[i, j] = s
            q[i * block : (i + 1) * block, j * block : (j + 1) * block] = (tile / s).to(FP8)
    return q, scale


def dequantized(tensors: dict, prefix: str, mode: str) -> torch.Tensor:
    """The fp32 weight an FP8 checkpoint's linear `prefix` stands for."""
    q = tensors[prefix + ".weight"].float()
    if mode == "block":
        s = tensors[prefix + ".weight_scale_inv"]
        s = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        return q * s[: q.shape[0], : q.shape[1]]
    return q * tensors[prefix + ".weight_scale"].reshape(-1, 1)


def to_fp8_folder(src, dst, mode: str, *, kv_scales: bool = False) -> dict:
    """Write `dst`, an FP8 copy of the HF folder `src`; returns its tensors."""
    tensors = load_file(str(src / "model.safetensors"))
    out = {}
    for name, t in tensors.items():
        prefix = name.removesuffix(".weight")
        if not (name.endswith(".weight") and prefix.rsplit(".", 1)[-1] in LINEARS):
            out[name] = t
            continue
        if mode == "block":
            out[name], out[prefix + ".weight_scale_inv"] = quantize_blocks(t)
            continue
        amax = t.abs().amax() if mode == "tensor" else t.abs().amax(-1, keepdim=True)
        scale = amax.clamp(min=1e-10) / 448
        out[name] = (t / scale).to(FP8)
        out[prefix + ".weight_scale"] = scale.reshape(()) if mode == "tensor" else scale
        if mode == "tensor":
            layer = int(name.split(".")[2])
            out[prefix + ".input_scale"] = torch.tensor(0.1 + 0.01 * layer)
    if kv_scales:
        layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
        for i in range(layers):
            out[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(0.5 + i)
            out[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(0.25)
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "static" if mode == "tensor" else "dynamic",
    }
    if mode == "block":
        config["quantization_config"]["weight_block_size"] = [BLOCK, BLOCK]
    (dst / "config.json").write_text(json.dumps(config))
    save_file(out, str(dst / "model.safetensors"))
    for extra in src.iterdir():
        if extra.name not in ("config.json", "model.safetensors"):
            shutil.copy(extra, dst / extra.name)
    return out
