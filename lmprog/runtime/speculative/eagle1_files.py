"""EAGLE-1/2 draft heads on disk, in the layouts SGLang and vLLM read (llama_eagle.py).

SafeAILab/EAGLE's published heads (yuhuili/EAGLE-LLaMA3-Instruct-8B, EAGLE-Vicuna-7B-v1.3,
...; EAGLE-2 drafts with the same weights): a folder with config.json, a Llama config of
one layer (architectures ["LlamaForCausalLM"] as published; SGLang's "LlamaForCausalLMEagle",
vLLM's "EagleLlamaForCausalLM", or vLLM's older "EAGLEModel" with the Llama config under
"model"), and pytorch_model.bin or *.safetensors, names with or without a `model.` prefix:

    fc.weight [hidden, 2 x hidden] (over [token embedding, feature])   fc.bias (optional)
    layers.0.self_attn.{q,k,v,o}_proj.weight   layers.0.post_attention_layernorm.weight
    layers.0.mlp.{gate,up,down}_proj.weight
    layers.0.input_layernorm.weight   saved by the original, unused on layer 0: ignored
    embed_tokens.weight, lm_head.weight   optional: the target's are used (as SGLang and vLLM
                                          do), these only checked for their shape
    embedding_layernorm.weight, hidden_states_layernorm.weight   HASS (add_para_norm)

A folder is detected as EAGLE-1 by its architectures, or, for the generic
"LlamaForCausalLM", by its tensors (fc.weight and layers.0.*). Design:
docs/design/speculative.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..models.config import ModelConfig, config_from_hf
from .head_files import EAGLE1_ARCHITECTURES, _names, _weights, copy_head_weights
from .heads import Eagle1Config, Eagle1Head

if TYPE_CHECKING:
    from ..models.llama import LlamaForCausalLM

_SHARED = ("embed_tokens.weight", "lm_head.weight")  # the target's are used
_UNUSED = ("layers.0.input_layernorm.weight",)  # the original skips it on layer 0


def is_eagle1(folder: str | Path) -> bool:
    """Whether `folder` holds an EAGLE-1/2 head (config.json's architectures, or a generic
    LlamaForCausalLM of EAGLE-1's tensors)."""
    path = Path(folder)
    if not (path / "config.json").is_file():
        return False
    archs = json.loads((path / "config.json").read_text()).get("architectures") or []
    if any(a in EAGLE1_ARCHITECTURES for a in archs):
        return True
    if archs != ["LlamaForCausalLM"]:
        return False
    names = {n.removeprefix("model.") for n in _names(path)}
    return "fc.weight" in names and any(n.startswith("layers.0.") for n in names)


def read_eagle1_config(folder: str | Path) -> Eagle1Config:
    """The head's shape from its config.json and tensor names (ValueError naming what is
    wrong)."""
    path = Path(folder)
    cfg: dict[str, Any] = json.loads((path / "config.json").read_text())
    if isinstance(cfg.get("model"), dict):  # vLLM's EAGLEConfig: the Llama config inside
        cfg = {**cfg["model"], **{k: v for k, v in cfg.items() if k != "model"}}
    if cfg.get("num_hidden_layers", 1) != 1:
        raise ValueError(
            f"{folder}: EAGLE heads of {cfg['num_hidden_layers']} layers are not supported (1)"
        )
    truncated = cfg.get("truncated_vocab_size")
    if truncated is not None and truncated != cfg.get("vocab_size"):
        raise ValueError(f"{folder}: EAGLE-1 heads over a truncated vocabulary are not supported")
    layer = config_from_hf({**cfg, "model_type": "llama", "num_hidden_layers": 1})
    names = {n.removeprefix("model.") for n in _names(path)}
    return Eagle1Config(
        layer,
        fc_bias="fc.bias" in names,
        para_norm=bool(cfg.get("add_para_norm")) or "embedding_layernorm.weight" in names,
    )


def load_eagle1(
    folder: str | Path,
    target: LlamaForCausalLM,
    *,
    dtype: torch.dtype | None = None,
    embedding: torch.Tensor | None = None,
) -> Eagle1Head:
    """An EAGLE-1 head for `target` (its device, dtype, attention backend, embedding, lm_head
    and final norm), checked against it: hidden size, vocabulary. embedding: as
    build_eagle3's."""
    config = read_eagle1_config(folder)
    check_eagle1_target(config, target.config, str(folder))
    head = build_eagle1(config, target, dtype=dtype, embedding=embedding)
    load_eagle1_weights(head, _weights(Path(folder)), str(folder))
    return head


def check_eagle1_target(config: Eagle1Config, target: ModelConfig, what: str) -> None:
    c = config.layer
    if c.hidden_size != target.hidden_size:
        raise ValueError(
            f"the EAGLE-1 head {what} reads hidden states of {c.hidden_size} features but the "
            f"target model's are {target.hidden_size}: it was trained for another model"
        )
    if c.vocab_size != target.vocab_size:
        raise ValueError(
            f"the EAGLE-1 head {what} has a vocabulary of {c.vocab_size} tokens, the target "
            f"model {target.vocab_size}: it was trained for another tokenizer"
        )


def build_eagle1(
    config: Eagle1Config,
    target: LlamaForCausalLM,
    *,
    dtype: torch.dtype | None = None,
    embedding: torch.Tensor | None = None,
) -> Eagle1Head:
    """A head of `config` on target's device (random weights) sharing the target's token
    embedding (`embedding` where target holds a shard of it), lm_head and final norm."""
    param = next(target.parameters())
    c = config.layer
    attention = type(target.attention)(c.num_heads, c.num_kv_heads, c.head_dim, param.device)
    head = Eagle1Head(config, attention).to(device=param.device, dtype=dtype or param.dtype)
    table = target.model.embed_tokens.weight if embedding is None else embedding
    head.share_embedding(table)
    head.share_target(_lm_head_table(target, table), target.model.norm)
    return head.eval()


def load_eagle1_weights(
    head: Eagle1Head, weights: Iterable[tuple[str, torch.Tensor]], what: str = "checkpoint"
) -> None:
    """Copy checkpoint tensors (the published names) into `head`; raise on missing/unknown
    ones; the shared tensors a checkpoint carries must have the target's shape."""
    c = head.config.layer
    want = (c.vocab_size, c.hidden_size)

    def own(items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in items:
            short = name.removeprefix("model.")
            if short in _SHARED and tuple(tensor.shape) != want:
                raise ValueError(
                    f"{what}: {name} is {tuple(tensor.shape)}, the target's is {want}: the "
                    "head was trained for another model"
                )
            if short not in _SHARED and short not in _UNUSED:
                yield name, tensor

    copy_head_weights(head, own(weights), what, "an EAGLE-1 head")


def _lm_head_table(target: LlamaForCausalLM, embedding: torch.Tensor) -> torch.Tensor:
    """The target's lm_head as a [vocab, hidden] table (tied: the embedding)."""
    if target.lm_head is None:
        return embedding
    weight = getattr(target.lm_head, "weight", None)
    c = target.config
    shape = (c.vocab_size, c.hidden_size)
    if (
        not isinstance(weight, torch.Tensor)
        or not weight.is_floating_point()
        or (tuple(weight.shape) != shape)
    ):
        raise ValueError(
            f"an EAGLE-1 head reads the target's lm_head as a {shape} table; this target's is {type(target.lm_head).__name__} "
            "(quantized, packed or a tensor-parallel shard): not supported"
        )
    return weight
