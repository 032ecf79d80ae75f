"""Weights from a GGUF file: dequantized with the `gguf` package, renamed to HF names.

llama.cpp's q/k row permutation is undone for llama-arch files and Gemma 3's 1 + w norms
restored to w, as transformers does. The parsed index is cached as JSON under
`cache_dir()/gguf`. Details: docs/design/models.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from lmprog.core.cache_files import derived_path, write_json
from lmprog.core.logs import progress, slow_step

from ..config import ModelConfig, RopeScaling, config_from_gguf

_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # mixture of experts: the router, each projection of all experts stacked [E, out, in],
    # Qwen2-MoE's shared expert and its gate (models/moe.py takes these names)
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    # DeepSeek-V2's latent attention (llama.cpp's deepseek2; kv_b split in k_b / v_b by
    # converters since its MLA path, models/deepseek_v2.py takes both)
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "attn_k_b": "self_attn.k_b_proj",
    "attn_v_b": "self_attn.v_b_proj",
}
# Gemma 3's norms around attention and MLP (llama.cpp's ffn_norm is its pre-MLP norm there)
_GEMMA3_BLOCK = {
    **_BLOCK,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_SKIP = {"rope_freqs.weight"}  # read into ModelConfig.rope_scaling instead
_INDEX_VERSION = 1


@dataclass(frozen=True)
class GGUFTensor:
    """Where one tensor's raw bytes sit in the file, and how to read them."""

    name: str
    qtype: int  # GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order of the dequantized tensor ([out, in] for weights)
    raw_shape: tuple[int, ...]  # numpy shape of the stored data
    raw_dtype: str  # numpy dtype of the stored data (uint8 for quantized blocks)
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GGUFIndex:
    path: Path
    config: ModelConfig
    tensors: tuple[GGUFTensor, ...]


def read_gguf(path: str | os.PathLike[str]) -> GGUFIndex:
    """The file's config and tensor table, from the on-disk cache when it is current."""
    path = Path(path).resolve()
    cached = _cache_path(path)
    try:
        return _index_from_json(path, json.loads(cached.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no cache entry yet, or a stale/corrupt one: parse the file
    with slow_step(
        f"reading the metadata of {path.name} (once; cached in {cached})", logger=__name__
    ):
        return _index_from_file(path, cached)


def _index_from_file(path: Path, cached: Path) -> GGUFIndex:
    reader = open_gguf(path)
    try:
        config = config_from_gguf(reader)
    except KeyError as exc:  # metadata a converter should have written
        raise ValueError(
            f"{path} lacks the GGUF metadata {exc.args[0]!r} (an incomplete or non-standard "
            "conversion): convert the model again with llama.cpp's convert_hf_to_gguf.py"
        ) from None
    except ValueError as exc:  # an architecture or setting the runtime does not read
        raise ValueError(f"{path}: {exc}") from None
    index = GGUFIndex(path, config, tensor_table(reader))
    _save(cached, index)
    return index


def tensor_table(reader: GGUFReader) -> tuple[GGUFTensor, ...]:
    """Where each tensor of an open file lies (its data is not read)."""
    return tuple(
        GGUFTensor(
            t.name,
            int(t.tensor_type),
            tuple(int(d) for d in t.shape[::-1]),
            tuple(t.data.shape),
            t.data.dtype.str,
            int(t.data_offset),
            int(t.n_bytes),
        )
        for t in reader.tensors
    )


def tensor_array(mapped: np.ndarray, t: GGUFTensor) -> np.ndarray:
    """One tensor's values as float32 in numpy order ([out, in] for weights), from the
    file's bytes `mapped` (a uint8 memory map); a view of the map for an F32 tensor."""
    raw = mapped[t.offset : t.offset + t.nbytes].view(np.dtype(t.raw_dtype))
    return dequantize(raw.reshape(t.raw_shape), GGMLQuantizationType(t.qtype)).reshape(t.shape)


def open_gguf(path: Path) -> GGUFReader:
    """The file's GGUFReader; ValueError naming the file for one that is not a GGUF or is
    truncated or damaged (gguf says only "GGUF magic invalid", or fails reshaping a tensor)."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(
            f"{path} is not a GGUF file (it does not start with the GGUF magic bytes; starts "
            f"with {magic!r}): re-download it, or convert the model with llama.cpp's "
            "convert_hf_to_gguf.py"
        )
    try:
        return GGUFReader(path)
    except (ValueError, IndexError, KeyError, OverflowError) as exc:
        raise ValueError(
            f"{path} could not be read as a GGUF file ({type(exc).__name__}: {exc}): it is "
            "probably truncated or damaged; re-download it"
        ) from None


def gguf_weights(index: GGUFIndex) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, fp32 tensor) for every weight of the file."""
    config = index.config
    unpermute = config.architecture in ("llama", "mixtral")
    norm_shift = config.architecture == "gemma3"
    tensors = [t for t in index.tensors if t.name not in _SKIP]
    total = sum(t.nbytes for t in tensors)
    with (
        open(index.path, "rb") as f,
        progress(total, f"dequantizing {Path(index.path).name}", logger=__name__) as bar,
    ):
        mapped = np.memmap(f, dtype=np.uint8, mode="r")
        for t in tensors:
            array = tensor_array(mapped, t)
            if unpermute and ".attn_q." in t.name:
                array = _unpermute(array, config.num_heads)
            elif unpermute and ".attn_k." in t.name:
                array = _unpermute(array, config.num_kv_heads)
            elif norm_shift and t.name.endswith("norm.weight"):
                array = array - np.float32(1.0)
            bar.update(t.nbytes)
            # F32 tensors are views of the read-only map: copy those (torch wants writable)
            name = hf_name(t.name, config.architecture)
            yield name, torch.from_numpy(np.require(array, np.float32, ["C", "W"]))


def hf_name(gguf_name: str, architecture: str = "llama") -> str:
    """ "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"."""
    if gguf_name in _TOP:
        return _TOP[gguf_name]
    block = _GEMMA3_BLOCK if architecture == "gemma3" else _BLOCK
    parts = gguf_name.split(".")
    if len(parts) == 5 and parts[2] in ("ffn_gate", "ffn_up", "ffn_down") and parts[3].isdigit():
        # early Mixtral GGUFs: a tensor per expert, blk.N.ffn_gate.E.weight
        blk, layer, kind, expert, suffix = parts
        return f"model.layers.{layer}.mlp.experts.{expert}.{block[kind][4:]}.{suffix}"
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in block:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for a {architecture} model")
    _, layer, kind, suffix = parts
    return f"model.layers.{layer}.{block[kind]}.{suffix}"


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp stored each head's rows as (half, pair) -> interleaved; swap back.
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------- the index cache


def _cache_path(path: Path) -> Path:
    return derived_path("gguf", path, version=_INDEX_VERSION, suffix=".json")


def _save(cached: Path, index: GGUFIndex) -> None:
    data = {
        "config": dataclasses.asdict(index.config),
        "tensors": [dataclasses.asdict(t) for t in index.tensors],
    }
    try:
        write_json(cached, data)
    except OSError:  # a read-only cache dir only costs the next load its parse
        pass


def _index_from_json(path: Path, data: dict[str, Any]) -> GGUFIndex:
    cfg = dict(data["config"])
    if cfg["rope_scaling"] is not None:
        rope = dict(cfg["rope_scaling"], factors=tuple(cfg["rope_scaling"]["factors"]))
        cfg["rope_scaling"] = RopeScaling(**rope)
    cfg["eos_token_ids"] = tuple(cfg["eos_token_ids"])
    cfg["mlp_only_layers"] = tuple(cfg.get("mlp_only_layers", ()))
    tensors = tuple(
        GGUFTensor(**{**t, "shape": tuple(t["shape"]), "raw_shape": tuple(t["raw_shape"])})
        for t in data["tensors"]
    )
    return GGUFIndex(path, ModelConfig(**cfg), tensors)
