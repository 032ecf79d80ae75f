"""The Llama family as plain modules: Llama 2/3/3.x, SmolLM2, Mistral, Qwen2/2.5, Qwen3.
With sparse MoE MLPs on the config's MoE layers also Mixtral, Qwen2-MoE and Qwen3-MoE
(moe.py).

Parameter names follow Hugging Face, except that q/k/v and gate/up are fused into one matmul
each (`qkv_proj`, `gate_up_proj`); `load_weights` takes HF names and fills the shards.

    model(batch, kv) -> logits [len(batch.logits_indices), vocab] in fp32
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ..executor.forward_batch import ForwardBatch
from ..executor.kv_pool import KVPool
from ..layers.attention import AttentionBackend
from ..layers.mlp import GatedMLP
from ..layers.moe import SparseMoE
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from .config import ModelConfig

# (q, k, v) of a layer's projections; k and v None when the pool holds them already (latent
# attention writes one latent row per token)
QKV = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]


@dataclass(frozen=True)
class HiddenCapture:
    """Which hidden states a step hands to a draft head (LlamaForCausalLM.forward_capture):
    layers: the residual stream entering these layers (index num_layers: leaving the last
    one), concatenated, at every fed token (EAGLE-3); () for the final norm's output at the
    logits rows (Medusa)."""

    layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Step:
    """What every layer of one forward shares."""

    cos: torch.Tensor
    sin: torch.Tensor
    kv: KVPool
    out_cache_loc: torch.Tensor
    attention: AttentionBackend
    plan: Any


class LlamaAttention(nn.Module):
    """The attention's projections; the decoder layer calls the attention backend between
    `project` and `output` (the seam where piecewise CUDA graphs split a step)."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.qkv_proj = nn.Linear(
            config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def project(self, x: torch.Tensor, step: _Step) -> QKV:
        """(q, k, v) of x, q and k rotated, k and v written to the pool."""
        hq, hkv = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(x.shape[0], hq + 2 * hkv, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:  # Qwen3: per-head norms first
            qkv = torch.cat(
                [self.q_norm(qkv[:, :hq]), self.k_norm(qkv[:, hq : hq + hkv]), qkv[:, hq + hkv :]],
                dim=1,
            )
        return step.attention.rotate_and_store(
            qkv, step.cos, step.sin, self.layer, step.kv, step.out_cache_loc
        )

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """The output projection of the attention result o [T, heads, head_dim]."""
        return self.o_proj(o.reshape(o.shape[0], self.num_heads * self.head_dim))


class LlamaMLP(GatedMLP):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config.hidden_size, config.intermediate_size)


def sparse_moe(config: ModelConfig) -> SparseMoE:
    """The config's mixture-of-experts MLP block: its experts, routing and shared experts."""
    return SparseMoE(
        config.hidden_size,
        config.moe_intermediate_size,
        config.num_experts,
        config.num_experts_per_tok,
        norm_topk_prob=config.norm_topk_prob,
        n_group=config.n_group,
        topk_group=config.topk_group,
        routed_scaling_factor=config.routed_scaling_factor,
        shared_intermediate_size=config.shared_expert_intermediate_size,
        shared_expert_gate=config.shared_expert_gate,
    )


class AttentionProjections(Protocol):
    """A decoder layer's attention around the attention kernel: Llama's (and Gemma 3's)
    q/k/v projections, DeepSeek-V2's latent ones."""

    @property
    def layer(self) -> int: ...

    def project(self, x: torch.Tensor, step: _Step) -> QKV: ...

    def output(self, o: torch.Tensor) -> torch.Tensor: ...


class LlamaDecoderLayer(nn.Module):
    self_attn: AttentionProjections  # LlamaAttention, DeepseekV2Attention

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = sparse_moe(config) if config.is_moe_layer(layer) else LlamaMLP(config)

    def forward(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: _Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, residual) -> (h', residual'): the residual stream is residual + h; each add is
        done by the norm that follows it (see RMSNorm). residual None: h is the embedding."""
        (q, k, v), residual = self.attention_input(h, residual, step)
        o = step.attention.forward(q, k, v, self.self_attn.layer, step.kv, step.plan)
        return self.attention_output(o, residual)

    # The halves around the attention kernel (piecewise CUDA graphs capture everything else).
    def attention_input(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: _Step
    ) -> tuple[QKV, torch.Tensor]:
        """((q, k, v), residual): the input norm and the attention's projections."""
        if residual is None:
            x, residual = self.input_layernorm(h), h
        else:
            x, residual = self.input_layernorm(h, residual)
        return self.self_attn.project(x, step), residual

    def attention_output(
        self, o: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h', residual'): the output projection, the post-attention norm and the MLP."""
        x, residual = self.post_attention_layernorm(self.self_attn.output(o), residual)
        return self.mlp(x), residual


class TokenEmbedding(Protocol):
    """A model's token embedding: nn.Embedding, or its tensor-parallel shard
    (parallel.sharding.VocabParallelEmbedding); `weight` is the [vocab, hidden] table."""

    @property
    def weight(self) -> torch.Tensor: ...

    def __call__(self, ids: torch.Tensor) -> torch.Tensor: ...


class DecoderLayerPart(Protocol):
    """What the executor calls of one decoder layer (Llama's, Gemma 3's, DeepSeek-V2's):
    the halves around its attention kernel (piecewise CUDA graphs)."""

    @property
    def self_attn(self) -> AttentionProjections: ...

    def attention_input(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: _Step
    ) -> tuple[QKV, torch.Tensor]: ...

    def attention_output(
        self, o: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class DecoderStack(nn.Module):
    """The embedding, decoder layers and final norm under a causal LM's head: the type of
    `LlamaForCausalLM.model` for every model (annotations only)."""

    embed_tokens: TokenEmbedding
    layers: nn.ModuleList  # of decoder layers (DecoderLayerPart)
    norm: nn.Module


class LlamaModel(DecoderStack):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


# HF shard name -> (our fused parameter, which shard)
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaForCausalLM(nn.Module):
    """A decoder over the paged KV pool. With tied embeddings there is no lm_head module (a
    from-outside transform such as layers.cpu_packing may add one)."""

    # the base class of every runtime model; its modules as other models and the
    # load-time transforms (quantization, tensor parallelism) set them
    config: ModelConfig
    attention: AttentionBackend
    model: DecoderStack
    lm_head: nn.Module | None  # nn.Linear, or a quantized, packed or tensor-parallel head
    # set only by some loaders (else absent: read with getattr): an FP8 checkpoint's per-layer
    # (k, v) scales (loaders.fp8), this rank's shapes under tensor parallelism (sharding),
    # the LoRA layers wrapped around its projections (lora.layers.LoraLayers, attach_lora_)
    kv_cache_scales: tuple[tuple[float, ...], ...]
    shard_config: ModelConfig
    lora_layers: Any

    def __init__(self, config: ModelConfig, attention: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.attention = attention
        self.model = LlamaModel(config)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    def forward(self, batch: ForwardBatch, kv: KVPool, plan: Any = None) -> torch.Tensor:
        """Write the step's K/V into `kv`, return fp32 logits for batch.logits_indices.

        `plan`: this batch's attention plan when the caller built it (a CUDA graph plans once
        on its static buffers); default `self.attention.plan(batch)`."""
        if plan is None:
            plan = self.attention.plan(batch)
        h, step = self.embed(batch, kv, plan)
        residual = None
        for layer in self.model.layers:
            h, residual = layer(h, residual, step)
        assert residual is not None, "a model without layers"
        return self.logits(h, residual, batch.logits_indices)

    def forward_capture(
        self, batch: ForwardBatch, kv: KVPool, capture: HiddenCapture, plan: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s logits, and the hidden states `capture` asks for (draft heads read
        them): the residual stream entering each of capture.layers (len(layers) * hidden
        features) at every fed token, or, capture.layers empty, the final norm's output at
        batch.logits_indices. A separate method: steps without heads run `forward` as it was.
        plan: as forward's."""
        if plan is None:
            plan = self.attention.plan(batch)
        h, step = self.embed(batch, kv, plan)
        residual: torch.Tensor | None = None
        taken: dict[int, torch.Tensor] = {}
        wanted = set(capture.layers)
        for i, layer in enumerate(self.model.layers):
            if i in wanted:  # the residual stream entering layer i
                taken[i] = h if residual is None else h + residual
            h, residual = layer(h, residual, step)
        assert residual is not None, "a model without layers"
        rows = batch.logits_indices
        logits = self.logits(h, residual, rows)
        if not capture.layers:
            normed, _ = self.model.norm(h.index_select(0, rows), residual.index_select(0, rows))
            return logits, normed
        n = len(self.model.layers)
        if n in wanted:  # the stream leaving the last layer, before the final norm
            taken[n] = h + residual
        return logits, torch.cat([taken[i] for i in capture.layers], dim=-1)

    def embed(self, batch: ForwardBatch, kv: KVPool, plan: Any) -> tuple[torch.Tensor, _Step]:
        """The token embeddings and what every layer of this step shares."""
        h = self.model.embed_tokens(batch.input_ids)
        cos, sin = self.rotary.cos_sin(batch.positions, h.dtype)
        return h, _Step(cos, sin, kv, batch.out_cache_loc, self.attention, plan)

    def logits(self, h: torch.Tensor, residual: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """fp32 logits of the last layer's output at token rows `rows`."""
        h, _ = self.model.norm(h.index_select(0, rows), residual.index_select(0, rows))
        if self.lm_head is None:
            return F.linear(h, self.model.embed_tokens.weight).float()
        return self.lm_head(h).float()

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors in (cast to the parameter dtype); raise if any is missing."""
        params = dict(self.named_parameters())
        missing = {(name, s) for name, p in params.items() for s in self._shard_keys(name, p)}
        for name, tensor in weights:
            if "rotary_emb" in name or (name == "lm_head.weight" and self.lm_head is None):
                continue
            for target, shard, part in self._pieces(name, tensor):
                if target not in params:
                    raise ValueError(
                        f"checkpoint tensor {name!r} has no place in a "
                        f"{self.config.architecture} model of this config"
                    )
                dst = self._shard_view(params[target], target, shard)
                if dst.shape != part.shape:
                    raise ValueError(
                        f"{name}: checkpoint shape {tuple(part.shape)}, model "
                        f"expects {tuple(dst.shape)}; does the config match the weights?"
                    )
                with torch.no_grad():
                    dst.copy_(part)
                missing.discard((target, shard))
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:4]}")

    # How checkpoint tensors map onto parameters (subclasses extend these three hooks):
    # `_pieces` splits a tensor into (parameter, shard, part), `_shard_view` is the part of
    # the parameter a shard fills, `_shard_keys` every shard a parameter must receive.
    def _pieces(self, name: str, tensor: torch.Tensor) -> Iterable[tuple[str, Any, torch.Tensor]]:
        target, shard = self._target(name)
        return ((target, shard, tensor),)

    @staticmethod
    def _target(name: str) -> tuple[str, int]:
        parts = name.split(".")
        for i, part in enumerate(parts):
            if part in _FUSED:
                fused, shard = _FUSED[part]
                return ".".join(parts[:i] + [fused] + parts[i + 1 :]), shard
        return name, 0

    def _shard_view(self, param: torch.Tensor, name: str, shard: Any) -> torch.Tensor:
        c = self.config
        if ".qkv_proj." in name:
            bounds = [0, c.q_size, c.q_size + c.kv_size, c.q_size + 2 * c.kv_size]
        elif ".gate_up_proj." in name:  # a dense MLP's or the shared experts' halves
            half = param.shape[0] // 2
            bounds = [0, half, 2 * half]
        else:
            return param.data
        return param.data[bounds[shard] : bounds[shard + 1]]

    def _shard_keys(self, name: str, param: torch.Tensor) -> Iterable[Any]:
        return range(3 if ".qkv_proj." in name else 2 if ".gate_up_proj." in name else 1)
