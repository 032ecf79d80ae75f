"""Loading one rank's shard: the ordinary model code filled with this rank's slices of the
checkpoint. It reads no more than it must: safetensors slices, GGUF rows, dummy weights
drawn as for tp_size=1."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import safe_open

from ..models import ModelConfig, build_model, load_config, resolve_dtype
from ..models.loaders import weights_source
from ..models.registry import model_class
from .sharding import Collectives, ShardPlan, narrow_padded, shard_model_

if TYPE_CHECKING:
    from ..models.llama import LlamaForCausalLM

_FUSED_SPLITS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def load_shard(
    model: Any,
    group: Collectives,
    *,
    device: torch.device,
    dtype: str | torch.dtype = "auto",
    load_format: str = "auto",
    attention: str = "torch",
    seed: int = 0,
) -> LlamaForCausalLM:
    """This rank's sharded module of `model` (what load_model takes), on `device`."""
    source = weights_source(model, load_format)
    config = load_config(model if source is None else source)
    plan = ShardPlan(config, group.rank, group.world)
    net = build_model(plan.local, device=device, dtype=dtype, attention=attention)
    if source is None:
        weights = _dummy_weights(config, plan, seed, device, resolve_dtype(dtype, device))
    elif source.kind == "gguf":
        weights = _gguf_weights(source.path, plan)
    else:
        weights = _safetensors_weights(source.path, plan)
    net.load_weights(weights)
    return shard_model_(net, plan, group)


def _safetensors_weights(folder: Path, plan: ShardPlan) -> Iterator[tuple[str, torch.Tensor]]:

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {folder}")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                sel = plan.select(name)
                if sel is None:
                    yield name, f.get_tensor(name)
                else:
                    yield name, narrow_padded(f.get_slice(name), *sel)


def _gguf_weights(path: Path, plan: ShardPlan) -> Iterator[tuple[str, torch.Tensor]]:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from ..models.loaders.gguf import _SKIP, hf_name, read_gguf

    index = read_gguf(path)
    unpermute = index.config.architecture == "llama"
    with open(index.path, "rb") as f:
        mapped = np.memmap(f, dtype=np.uint8, mode="r")
        for t in index.tensors:
            if t.name in _SKIP:
                continue
            name = hf_name(t.name)
            raw = mapped[t.offset : t.offset + t.nbytes].view(np.dtype(t.raw_dtype))
            raw = raw.reshape(t.raw_shape)
            sel = plan.select(name)
            rows = sel is not None and sel[0] == 0
            if rows:  # column-parallel: dequantize only this rank's rows
                assert sel is not None
                lo, hi = min(sel[1], t.shape[0]), min(sel[2], t.shape[0])
                raw = raw[lo:hi]
                shape = (hi - lo, *t.shape[1:])
            else:
                shape = t.shape
            array = dequantize(raw, GGMLQuantizationType(t.qtype)).reshape(shape)
            heads = _permuted_heads(name, shape, index.config) if unpermute else 0
            if heads:
                array = _unpermute(array, heads)
            tensor = torch.from_numpy(np.require(array, np.float32, ["C", "W"]))
            if rows:
                assert sel is not None
                yield name, narrow_padded(tensor, 0, 0, sel[2] - sel[1])
            else:
                yield name, plan.narrow(name, tensor)


def _permuted_heads(name: str, shape: tuple[int, ...], config: ModelConfig) -> int:
    """How many heads' rows of llama-arch q/k a (row-sliced) GGUF tensor holds, else 0."""
    if name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
        return shape[0] // config.head_dim
    return 0


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp stored each head's rows as (half, pair) -> interleaved; swap back per head,
    # so a slice of whole heads unpermutes alone (as loaders/gguf.py does for all of them).
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@torch.no_grad()
def _dummy_weights(
    config: ModelConfig, plan: ShardPlan, seed: int, device: torch.device, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:

    with torch.device("meta"):
        # a shell on the meta device for its parameters' names and shapes: no attention
        whole = model_class(config.architecture)(config, None)  # type: ignore[arg-type]
    g = torch.Generator(device=device).manual_seed(seed)
    for name, p in whole.named_parameters():
        if name.endswith("norm.weight"):
            full = torch.ones(p.shape, dtype=dtype, device=device)
        else:
            residual_out = "o_proj" in name or "down_proj" in name
            std = 0.02 / math.sqrt(2 * config.num_layers) if residual_out else 0.02
            full = torch.empty(p.shape, dtype=dtype, device=device).normal_(0.0, std, generator=g)
        for piece_name, piece in _split_fused(name, full, config):
            yield piece_name, plan.narrow(piece_name, piece)


def _split_fused(name: str, t: torch.Tensor, c: ModelConfig) -> list[tuple[str, torch.Tensor]]:
    """Our fused qkv_proj / gate_up_proj tensors back into the HF pieces load_weights takes."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in _FUSED_SPLITS:
            sizes = (
                [c.q_size, c.kv_size, c.kv_size]
                if part == "qkv_proj"
                else [c.intermediate_size] * 2
            )
            names = [".".join([*parts[:i], hf, *parts[i + 1 :]]) for hf in _FUSED_SPLITS[part]]
            return list(zip(names, t.split(sizes, dim=0)))
    return [(name, t)]
