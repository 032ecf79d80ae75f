"""Mixtral, Qwen2-MoE and Qwen3-MoE: the Llama decoder (llama.py) whose MLP is the sparse
mixture of experts (layers/moe.py) on the config's MoE layers.

`ExpertWeights` stacks expert weights from every checkpoint layout (per expert, stacked,
shared experts). Layouts: docs/design/models.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch

from .llama import LlamaForCausalLM

_PER_EXPERT = re.compile(
    r"(?P<prefix>.*\.mlp\.experts)\.(?P<e>\d+)\."
    r"(?P<kind>w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$"
)
_STACKED = re.compile(
    r"(?P<prefix>.*\.mlp\.experts)\.(?P<kind>gate_up_proj|gate_proj|up_proj|down_proj)"
    r"(\.weight)?$"
)
# checkpoint projection -> (our stacked parameter, the half of gate_up it fills; None: all)
_KINDS = {
    "w1": ("gate_up_proj", 0),
    "gate_proj": ("gate_up_proj", 0),
    "w3": ("gate_up_proj", 1),
    "up_proj": ("gate_up_proj", 1),
    "w2": ("down_proj", None),
    "down_proj": ("down_proj", None),
}
_RENAMES = ((".block_sparse_moe.", ".mlp."), (".mlp.shared_expert.", ".mlp.shared_experts."))


class ExpertWeights:
    """Mixin for LlamaForCausalLM subclasses: the expert layouts of docs/design/models.md.
    A stacked parameter's shards are (expert, half): (e, 0) / (e, 1) the gate / up rows of
    expert e in gate_up_proj, (e, None) expert e of down_proj."""

    def _pieces(self, name: str, tensor: torch.Tensor) -> Iterable[tuple[str, Any, torch.Tensor]]:
        for old, new in _RENAMES:
            name = name.replace(old, new)
        if m := _PER_EXPERT.match(name):
            target, half = _KINDS[m["kind"]]
            return ((f"{m['prefix']}.{target}", (int(m["e"]), half), tensor),)
        if m := _STACKED.match(name):
            if m["kind"] == "gate_up_proj":  # both halves of each expert
                target = f"{m['prefix']}.gate_up_proj"
                halves = tensor.view(tensor.shape[0], 2, -1, *tensor.shape[2:])
                return ((target, (e, h), halves[e, h]) for e in range(len(halves)) for h in (0, 1))
            target, half = _KINDS[m["kind"]]
            return ((f"{m['prefix']}.{target}", (e, half), tensor[e]) for e in range(len(tensor)))
        if name.endswith(".shared_expert_gate.weight"):  # [1, H]; a GGUF stores [H]
            tensor = tensor.reshape(1, -1)
        return super()._pieces(name, tensor)  # type: ignore[misc]

    def _shard_view(self, param: torch.Tensor, name: str, shard: Any) -> torch.Tensor:
        if name.endswith(".experts.gate_up_proj"):
            expert, half = shard
            inter = param.shape[1] // 2
            return param.data[expert, half * inter : (half + 1) * inter]
        if name.endswith(".experts.down_proj"):
            return param.data[shard[0]]
        return super()._shard_view(param, name, shard)  # type: ignore[misc]

    def _shard_keys(self, name: str, param: torch.Tensor) -> Iterable[Any]:
        if name.endswith(".experts.gate_up_proj"):
            return [(e, h) for e in range(param.shape[0]) for h in (0, 1)]
        if name.endswith(".experts.down_proj"):
            return [(e, None) for e in range(param.shape[0])]
        return super()._shard_keys(name, param)  # type: ignore[misc]


class MoeForCausalLM(ExpertWeights, LlamaForCausalLM):
    """Mixtral / Qwen2-MoE / Qwen3-MoE over the paged KV pool (LlamaForCausalLM's forward:
    its decoder layers build their MoE blocks from the config)."""
