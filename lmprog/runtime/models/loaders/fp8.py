"""FP8 checkpoints in the layout vLLM and SGLang read (llm-compressor's FP8 models,
DeepSeek-V3's and Qwen3's block-wise FP8 releases).

Weight scales are turned into layers/fp8_linear.py's row form so `load_weights` slices them
with the weight; KV-cache scales land on `model.kv_cache_scales`.
Layout: docs/design/quantization.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from lmprog.core.models import ModelSource, resolve_model

from ...layers.fp8_linear import finalize_fp8_, fp8_shells_
from ..config import ModelConfig
from ..presets import PRESETS

if TYPE_CHECKING:
    from ..llama import LlamaForCausalLM

_KV_SCALE = re.compile(r"model\.layers\.(\d+)\.self_attn\.(?:attn\.)?(k_scale|v_scale|kv_scale)$")


@dataclass(frozen=True)
class Fp8Scheme:
    """What a checkpoint's quantization_config says."""

    static: bool  # activation_scheme "static": input_scale per layer
    block: tuple[int, int] | None = None  # weight_block_size [bn, bk]


def fp8_scheme(folder: str | Path) -> Fp8Scheme | None:
    """The FP8 scheme of an HF folder's config.json, None when it has no
    quantization_config; ValueError for one lmprog cannot run."""
    path = Path(folder)
    path = path / "config.json" if path.is_dir() else path
    q = json.loads(path.read_text()).get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method")
    if method != "fp8":
        raise ValueError(f"unsupported quantization_config quant_method {method!r}; supported: fp8")
    if q.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"FP8 format {q.get('fmt')!r} is not supported; only e4m3")
    scheme = q.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise ValueError(f"unknown FP8 activation_scheme {scheme!r}; use dynamic or static")
    block = q.get("weight_block_size")
    if block is not None:
        if len(block) != 2 or block[1] < 16 or block[1] & (block[1] - 1) or block[0] < 1:
            raise ValueError(
                f"weight_block_size must be [bn, bk], bk a power of two >= 16: {block}"
            )
        if scheme == "static":
            raise ValueError("block-wise FP8 weights take dynamic activation scales only")
        block = (int(block[0]), int(block[1]))
    return Fp8Scheme(static=scheme == "static", block=block)


def load_fp8_checkpoint(net: LlamaForCausalLM, folder: str | Path, scheme: Fp8Scheme) -> None:
    """Fill `net` (just built, plain) from an FP8 folder: its FP8 linears become Fp8Linear."""

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {folder}")
    shapes, fp8 = {}, {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                shapes[name] = tuple(sl.get_shape())
                fp8[name] = sl.get_dtype() == "F8_E4M3"
    if fp8.get("lm_head.weight"):
        raise ValueError("an FP8 lm_head is not supported (vLLM and SGLang keep it unquantized)")
    by_module: dict[str, set[bool]] = {}
    for name in shapes:
        if name.endswith(".weight") and name != "lm_head.weight":
            target, _ = net._target(name)  # HF shard name -> the fused module's parameter
            by_module.setdefault(target.removesuffix(".weight"), set()).add(fp8[name])
    mixed = [m for m, kinds in by_module.items() if len(kinds) > 1]
    if mixed:
        raise ValueError(f"{mixed[0]}: some of its fused shards are FP8, some are not")
    names = {m for m, kinds in by_module.items() if kinds == {True}}
    if not names:
        raise ValueError(f"{folder}: quantization_config says fp8 but no weight is float8_e4m3fn")
    group = None if scheme.block is None else scheme.block[1]
    fp8_shells_(net, names, group=group, static=scheme.static)
    kv: dict[tuple[str, int], float] = {}
    net.load_weights(_row_form(files, shapes, scheme, kv))
    finalize_fp8_(net)
    if kv:
        layers = net.config.num_layers
        net.kv_cache_scales = tuple(
            tuple(kv.get((which, i), kv.get(("kv_scale", i), 1.0)) for i in range(layers))
            for which in ("k_scale", "v_scale")
        )


def _row_form(
    files: list[Path],
    shapes: dict[str, tuple[int, ...]],
    scheme: Fp8Scheme,
    kv: dict[tuple[str, int], float],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with FP8 scales in row form (docs/design/quantization.md); KV-cache
    scales go to `kv` instead."""
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                match = _KV_SCALE.search(name)
                if match:
                    kv[(match.group(2), int(match.group(1)))] = float(tensor.float().max())
                    continue
                prefix, _, kind = name.rpartition(".")
                if kind not in ("weight_scale", "weight_scale_inv", "input_scale"):
                    yield name, tensor
                    continue
                rows = _weight_shape(shapes, prefix, name)[0]
                yield f"{prefix}.{kind.removesuffix('_inv')}", _rows(tensor, kind, rows, scheme)


def _weight_shape(shapes: dict[str, tuple[int, ...]], prefix: str, name: str) -> tuple[int, ...]:
    shape = shapes.get(f"{prefix}.weight")
    if shape is None or len(shape) != 2:
        raise ValueError(f"{name} has no 2-D {prefix}.weight beside it in the checkpoint")
    return shape


def _rows(t: torch.Tensor, kind: str, rows: int, scheme: Fp8Scheme) -> torch.Tensor:
    t = t.float()
    if kind == "weight_scale_inv":
        if scheme.block is None:
            raise ValueError("weight_scale_inv (block scales) without a weight_block_size")
        return t.repeat_interleave(scheme.block[0], dim=0)[:rows].contiguous()
    if scheme.block is not None and kind == "weight_scale":
        raise ValueError("a block-wise checkpoint (weight_block_size) stores weight_scale_inv")
    if t.numel() == 1:
        return t.reshape(1).expand(rows).contiguous()
    if kind == "weight_scale" and t.numel() == rows:
        return t.reshape(rows)
    raise ValueError(f"an FP8 {kind} of shape {tuple(t.shape)} for {rows} rows")


def fp8_checkpoint_scheme(model: Any) -> Fp8Scheme | None:
    """The FP8 scheme of a model reference (name, path, ModelSource) that is an HF folder,
    else None (GGUF files, presets and configs have none)."""

    if model is None or isinstance(model, ModelConfig):
        return None
    if isinstance(model, str) and model.lower() in PRESETS:
        return None
    source = model if isinstance(model, ModelSource) else resolve_model(model)
    return None if source.kind == "gguf" else fp8_scheme(source.path)


__all__ = ["Fp8Scheme", "fp8_checkpoint_scheme", "fp8_scheme", "load_fp8_checkpoint"]
