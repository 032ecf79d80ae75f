"""Megatron-style sharding of a plain Llama-family module, applied from outside the model.

Rank r holds a smaller model of the same architecture (`ShardPlan.local`); `shard_model_`
wraps the layers whose outputs are partial (vocab-parallel embedding, column-parallel
qkv/gate_up, row-parallel o/down with an all-reduce, lm_head with an all-gather).
Per-layer table, KV heads and vocabulary padding: docs/design/tensor-parallel.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ..models.config import ModelConfig

if TYPE_CHECKING:
    from ..models.llama import LlamaForCausalLM


class Collectives(Protocol):
    """What the sharded layers need from their group (lmprog.runtime.parallel.group)."""

    rank: int
    world: int

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor: ...
    def all_gather(self, t: torch.Tensor) -> torch.Tensor: ...


def check_shardable(config: ModelConfig, tp_size: int) -> None:
    """Raise ValueError naming the sizes when `config` cannot be split over tp_size ranks."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tp_size must be an int >= 1, got {tp_size!r}")
    if config.kv_lora_rank and tp_size > 1:
        raise ValueError(
            f"tp_size={tp_size}: tensor parallelism does not shard latent attention "
            f"({config.architecture}: one KV latent per token, not per head) yet; use tp_size=1"
        )
    if config.num_experts and tp_size > 1:
        raise ValueError(
            f"tp_size={tp_size}: tensor parallelism does not shard mixture-of-experts models "
            f"({config.architecture}: {config.num_experts} experts) yet; use tp_size=1"
        )
    hq, kv, inter = config.num_heads, config.num_kv_heads, config.intermediate_size
    if hq % tp_size:
        raise ValueError(
            f"tp_size={tp_size} does not divide the model's {hq} query heads; use a tp_size "
            f"that divides {hq}"
        )
    if kv >= tp_size and kv % tp_size:
        raise ValueError(
            f"tp_size={tp_size} does not divide the model's {kv} KV heads; use a tp_size "
            f"that divides {kv}, or a multiple of it"
        )
    if kv < tp_size and tp_size % kv:
        raise ValueError(
            f"the model's {kv} KV heads cannot be replicated over tp_size={tp_size} ranks "
            f"(tp_size must be a multiple of {kv} when it exceeds the KV head count)"
        )
    if inter % tp_size:
        raise ValueError(f"tp_size={tp_size} does not divide the model's intermediate size {inter}")


@dataclass(frozen=True)
class ShardPlan:
    """Which part of the whole model `config` rank `rank` of `world` holds."""

    config: ModelConfig
    rank: int
    world: int

    def __post_init__(self) -> None:
        check_shardable(self.config, self.world)
        assert 0 <= self.rank < self.world

    @property
    def heads(self) -> int:
        return self.config.num_heads // self.world

    @property
    def kv_heads(self) -> int:
        return max(1, self.config.num_kv_heads // self.world)

    @property
    def first_kv_head(self) -> int:
        """kv >= W: rank r holds heads r*kv/W ..; kv < W: the one its query heads use."""
        return self.rank * self.config.num_kv_heads // self.world

    @property
    def intermediate(self) -> int:
        return self.config.intermediate_size // self.world

    @property
    def vocab(self) -> int:
        """Rows of the vocabulary each rank holds (the last one padded with zero rows)."""
        return -(-self.config.vocab_size // self.world)

    @cached_property
    def local(self) -> ModelConfig:
        """The model this rank holds, as a config of the same architecture."""
        return replace(
            self.config,
            num_heads=self.heads,
            num_kv_heads=self.kv_heads,
            intermediate_size=self.intermediate,
            vocab_size=self.vocab,
        )

    def select(self, name: str) -> tuple[int, int, int] | None:
        """(dim, start, stop) of checkpoint tensor `name` (HF naming) this rank holds, or
        None when every rank holds all of it. stop may exceed the tensor (vocab padding)."""
        d, r = self.config.head_dim, self.rank
        if name.endswith(("embed_tokens.weight", "lm_head.weight")):
            return 0, r * self.vocab, (r + 1) * self.vocab
        parts = name.rsplit(".", 2)
        if len(parts) < 3:
            return None
        kind = parts[-2]
        if kind == "q_proj":
            return 0, r * self.heads * d, (r + 1) * self.heads * d
        if kind in ("k_proj", "v_proj"):
            first = self.first_kv_head
            return 0, first * d, (first + self.kv_heads) * d
        if kind in ("gate_proj", "up_proj"):
            return 0, r * self.intermediate, (r + 1) * self.intermediate
        if kind == "o_proj" and parts[-1] == "weight":
            return 1, r * self.heads * d, (r + 1) * self.heads * d
        if kind == "down_proj" and parts[-1] == "weight":
            return 1, r * self.intermediate, (r + 1) * self.intermediate
        return None

    def narrow(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of a whole checkpoint tensor (zero rows past the vocabulary)."""
        sel = self.select(name)
        return tensor if sel is None else narrow_padded(tensor, *sel)


def narrow_padded(tensor: Any, dim: int, start: int, stop: int) -> torch.Tensor:
    """tensor[start:stop] along dim, zero-padded where stop runs past its end. `tensor` may
    be a lazy slice (safetensors' get_slice) that reads only the rows asked for."""
    size = tensor.shape[dim] if isinstance(tensor, torch.Tensor) else tensor.get_shape()[dim]
    lo, hi = min(start, size), min(stop, size)
    index = (slice(lo, hi),) if dim == 0 else (slice(None), slice(lo, hi))
    part = tensor[index]
    if hi - lo == stop - start:
        return part
    shape = list(part.shape)
    shape[dim] = stop - start - (hi - lo)
    return torch.cat([part, part.new_zeros(shape)], dim=dim)


# ---------------------------------------------------------------- the parallel layers


class RowParallel(nn.Module):
    """A linear over this rank's slice of the input features; the partial outputs of all
    ranks summed (one all-reduce). `inner` stays a plain module (int4 may replace it)."""

    def __init__(self, inner: nn.Module, group: Collectives) -> None:
        super().__init__()
        self.inner = inner
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.inner(x))


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + n) of the embedding table; ids elsewhere look up zeros; the
    ranks' rows summed (one all-reduce). `weight` is the local table (a tied lm_head's)."""

    def __init__(self, inner: nn.Embedding, start: int, group: Collectives) -> None:
        super().__init__()
        self.inner = inner
        self.start = start
        self.group = group

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.inner.num_embeddings)
        h = self.inner(torch.where(inside, local, 0))
        return self.group.all_reduce(h * inside.unsqueeze(-1).to(h.dtype))


class ParallelLMHead(nn.Module):
    """Logits of this rank's vocabulary rows, gathered from every rank: [R, vocab_size]."""

    def __init__(self, weight: torch.Tensor, vocab_size: int, group: Collectives) -> None:
        super().__init__()
        self.weight = weight  # shared with the embedding when tied
        self.vocab_size = vocab_size
        self.group = group

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        local = F.linear(h, self.weight).contiguous()  # [R, Vl]
        full = self.group.all_gather(local)  # [W, R, Vl]
        rows, padded = h.shape[0], full.shape[0] * full.shape[2]
        return full.permute(1, 0, 2).reshape(rows, padded)[:, : self.vocab_size]


def shard_model_(net: LlamaForCausalLM, plan: ShardPlan, group: Collectives) -> LlamaForCausalLM:
    """Wrap the loaded local model `net` (built from plan.local) in place: row-parallel
    o_proj/down_proj, vocab-parallel embedding and lm_head; its `config` becomes the whole
    model's again. Returns net."""
    layer: Any  # a decoder layer, its projections replaced by name
    for layer in net.model.layers:
        layer.self_attn.o_proj = RowParallel(layer.self_attn.o_proj, group)
        layer.mlp.down_proj = RowParallel(layer.mlp.down_proj, group)
    embed = net.model.embed_tokens
    assert isinstance(embed, nn.Embedding), "the model is sharded already"
    net.model.embed_tokens = VocabParallelEmbedding(embed, plan.rank * plan.vocab, group)
    head = embed.weight if net.lm_head is None else net.lm_head.weight
    assert isinstance(head, torch.Tensor)  # a head module's weight
    net.lm_head = ParallelLMHead(head, plan.config.vocab_size, group)
    net.shard_config = plan.local
    net.config = plan.config
    return net


def gather_embedding(net: LlamaForCausalLM, group: Collectives) -> torch.Tensor:
    """The whole token embedding [vocab_size, hidden] of a sharded `net`, its rows gathered
    from every rank (a collective: every rank calls it; rank 0 keeps the result)."""
    embed = net.model.embed_tokens
    assert isinstance(embed, VocabParallelEmbedding), "the model is not sharded"
    rows = group.all_gather(embed.weight.detach().contiguous())  # [W, V/W padded, H]
    return rows.reshape(-1, rows.shape[-1])[: net.config.vocab_size]
