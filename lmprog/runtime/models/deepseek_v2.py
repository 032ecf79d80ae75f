"""DeepSeek-V2 and V2-Lite as plain modules. Multi-head latent attention (MLA) over the
latent KV pool, dense MLPs in the first layers and the sparse MoE (layers/moe.py) after.

The pool keeps [c | rot(kr)] only and attention runs with the up-projections absorbed, so
per-head k and v are never built. RoPE rows of the checkpoint are reordered at load
(pairs to halves). Derivation: docs/design/models.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..executor.kv_pool import LatentKVPool
from ..layers.attention import AttentionBackend
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from .config import ModelConfig
from .llama import (
    DecoderStack,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    _Step,
    sparse_moe,
)
from .moe import ExpertWeights

_LORA_NORM_EPS = 1e-6  # q_a_layernorm's and kv_a_layernorm's (transformers' default)


class DeepseekV2Attention(nn.Module):
    """MLA's projections around the attention backend (the seam piecewise graphs split at):
    `project` gives the absorbed query and writes the latent row, `output` maps the
    attention's latent output back to the hidden size."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        h, heads = config.hidden_size, config.num_heads
        self.num_heads = heads
        self.nope, self.rope = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.rank, self.v_dim = config.kv_lora_rank, config.v_head_dim
        q_out, bias = heads * config.head_dim, config.attention_bias
        q_rank = config.q_lora_rank
        self.q_lora = q_rank is not None
        if q_rank is None:
            self.q_proj = nn.Linear(h, q_out, bias=False)
        else:
            self.q_a_proj = nn.Linear(h, q_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(q_rank, _LORA_NORM_EPS)
            self.q_b_proj = nn.Linear(q_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.rank + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.rank, _LORA_NORM_EPS)
        # kv_b_proj, split per head and laid out for the two batched matmuls
        self.w_uk = nn.Parameter(torch.empty(heads, self.nope, self.rank))  # q_nope -> latent
        self.w_uv = nn.Parameter(torch.empty(heads, self.rank, self.v_dim))  # latent -> v
        self.o_proj = nn.Linear(heads * self.v_dim, h, bias=bias)

    def project(self, x: torch.Tensor, step: _Step) -> tuple[torch.Tensor, None, None]:
        """(q, None, None): the absorbed, rotated query [T, H, D + dr]; the latent row
        [c | rot(kr)] of every token written to the pool."""
        if self.q_lora:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = q.view(x.shape[0], self.num_heads, self.nope + self.rope)
        q_latent = torch.bmm(q[..., : self.nope].transpose(0, 1), self.w_uk).transpose(0, 1)
        query = torch.cat([q_latent, q[..., self.nope :]], dim=-1)
        c, k_rope = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope], dim=-1)
        latent = torch.cat([self.kv_a_layernorm(c), k_rope], dim=-1).unsqueeze(1)
        kv = step.kv
        assert isinstance(kv, LatentKVPool), "latent attention needs a latent KV pool"
        query = step.attention.rotate_and_store_latent(
            query, latent, step.cos, step.sin, self.layer, kv, step.out_cache_loc
        )
        return query, None, None

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """o_proj of the values W_uv o of the attention's latent output o [T, H, D]."""
        v = torch.bmm(o.transpose(0, 1), self.w_uv).transpose(0, 1)
        return self.o_proj(v.reshape(o.shape[0], self.num_heads * self.v_dim))


class DeepseekV2DecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm layer (same forward and piecewise halves) with MLA and, past the
    dense layers, the sparse MoE."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        nn.Module.__init__(self)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DeepseekV2Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = sparse_moe(config) if config.is_moe_layer(layer) else LlamaMLP(config)


class DeepseekV2Model(DecoderStack):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DeepseekV2DecoderLayer(config, i) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekV2ForCausalLM(ExpertWeights, LlamaForCausalLM):
    """DeepSeek-V2 over the latent KV pool; forward, logits and weight loading as Llama's,
    with HF's MLA names: q_proj (or q_a_proj, q_a_layernorm, q_b_proj), kv_a_proj_with_mqa,
    kv_a_layernorm, kv_b_proj (split into w_uk / w_uv; a GGUF's k_b_proj / v_b_proj),
    o_proj. The attention backend is built for latent attention (loaders.build_model does:
    one KV head of kv_lora_rank, rope_dim = qk_rope_head_dim, the config's
    mla_softmax_scale)."""

    def __init__(self, config: ModelConfig, attention: AttentionBackend) -> None:
        nn.Module.__init__(self)
        if not config.kv_lora_rank:
            raise ValueError("a DeepSeek-V2 config has latent attention (kv_lora_rank > 0)")
        if attention is not None and attention.rope_dim != config.qk_rope_head_dim:
            raise ValueError(
                "DeepSeek-V2 needs a latent-attention backend (rope_dim="
                f"{config.qk_rope_head_dim}); build the model with build_model/load_model"
            )
        self.config = config
        self.attention = attention
        self.model = DeepseekV2Model(config)
        self.rotary = RotaryEmbedding(
            config.qk_rope_head_dim, config.rope_theta, config.rope_scaling
        )
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    def _pieces(self, name: str, tensor: torch.Tensor) -> Iterable[tuple[str, Any, torch.Tensor]]:
        """HF's MLA tensors in our layout (docs/design/models.md); the rest as Llama / MoE."""
        c = self.config
        if name.endswith(".kv_b_proj.weight"):  # [H (dn + dv), D] -> w_uk, w_uv
            prefix = name[: -len("kv_b_proj.weight")]
            per_head = tensor.view(c.num_heads, c.qk_nope_head_dim + c.v_head_dim, -1)
            w_uk = per_head[:, : c.qk_nope_head_dim]
            w_uv = per_head[:, c.qk_nope_head_dim :].transpose(1, 2)
            return ((prefix + "w_uk", 0, w_uk), (prefix + "w_uv", 0, w_uv))
        if name.endswith(".k_b_proj.weight"):  # a GGUF's halves: [H, D, dn] and [H, dv, D]
            return ((name[: -len("k_b_proj.weight")] + "w_uk", 0, tensor.transpose(1, 2)),)
        if name.endswith(".v_b_proj.weight"):
            return ((name[: -len("v_b_proj.weight")] + "w_uv", 0, tensor.transpose(1, 2)),)
        if name.endswith((".q_proj.weight", ".q_b_proj.weight")):
            per_head = tensor.view(c.num_heads, c.head_dim, -1)
            tensor = _halves_layout(per_head, c.qk_rope_head_dim).reshape(tensor.shape)
        elif ".kv_a_proj_with_mqa." in name:
            tensor = _halves_layout(tensor, c.qk_rope_head_dim)
        return super()._pieces(name, tensor)

    @staticmethod
    def _target(name: str) -> tuple[str, int]:
        """Only gate/up are fused here (q_proj is MLA's own, not a q/k/v shard)."""
        for part, fused in (("gate_proj", 0), ("up_proj", 1)):
            if f".{part}." in name:
                return name.replace(f".{part}.", ".gate_up_proj."), fused
        return name, 0


def _halves_layout(rows: torch.Tensor, rope: int) -> torch.Tensor:
    """rows [..., n, *] whose last `rope` rows (dim -2) rotate as adjacent pairs -> the same
    with those rows reordered even-then-odd, so that rotate-half RoPE computes the same
    dot products (docs/design/models.md)."""
    if rows.dim() == 1:
        return _halves_layout(rows[:, None], rope)[:, 0]
    n = rows.shape[-2]
    order = torch.arange(n - rope, device=rows.device)
    pairs = torch.arange(n - rope, n, device=rows.device)
    order = torch.cat([order, pairs[0::2], pairs[1::2]])
    return rows.index_select(-2, order)
