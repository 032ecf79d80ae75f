"""Trained draft heads as plain modules: EAGLE-3's draft layer and Medusa's heads.

    Eagle3Head(config, attention)   (ids, target features | own hidden) -> draft logits, hidden
    MedusaHeads(hidden, vocab, num_heads, num_layers)   last hidden -> [heads, rows, vocab]

Parameter names are the published checkpoints' (SGLang's and vLLM's readers; EAGLE-3 with
q/k/v and gate/up fused as the runtime's Llama layers are). Loading and saving those layouts:
head_files.py. Design: docs/design/speculative.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..executor.forward_batch import ForwardBatch
from ..executor.kv_pool import KVPool
from ..layers.attention import AttentionBackend
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from ..models.config import ModelConfig
from ..models.llama import LlamaAttention, LlamaMLP, _Step


@dataclass(frozen=True)
class Eagle3Config:
    """layer: the draft decoder layer's shape (vocab_size: the target's, for the token
    embedding); target_hidden_size: the target's (fc maps 3 of its hidden states to
    layer.hidden_size); draft_vocab_size: rows of lm_head (d2t maps them to target ids);
    aux_layer_ids: the target layers whose OUTPUT is read (None: SGLang's and vLLM's default,
    see capture_layers); has_embedding: the checkpoint brings its own token embedding
    (else the target's is shared)."""

    layer: ModelConfig
    target_hidden_size: int
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...] | None = None
    has_embedding: bool = False

    def capture_layers(self, target_layers: int) -> tuple[int, ...]:
        """The target layers whose INPUT (the residual stream entering them) the head reads,
        for a target of `target_layers` layers: aux_layer_ids + 1, default (2, n // 2, n - 3)
        as SGLang and vLLM choose (clamped into [0, n] for tiny models)."""
        n = target_layers
        if self.aux_layer_ids is None:
            return tuple(min(max(i, 0), n) for i in (2, n // 2, n - 3))
        layers = tuple(i + 1 for i in self.aux_layer_ids)
        if any(not 0 <= i <= n for i in layers):
            raise ValueError(
                f"the EAGLE-3 head reads target layers {list(self.aux_layer_ids)} "
                f"(eagle_aux_hidden_state_layer_ids) but the target has {n} layers"
            )
        return layers


class Eagle3Layer(nn.Module):
    """EAGLE-3's one decoder layer: attention over [norm(embedding), norm(hidden)] (2 x hidden
    features in), the residual stream being the hidden state."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, 0)
        self.self_attn.qkv_proj = nn.Linear(
            2 * h, config.q_size + 2 * config.kv_size, bias=config.attention_bias
        )
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, step: _Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        q, k, v = self.self_attn.project(x, step)
        o = step.attention.forward(q, k, v, 0, step.kv, step.plan)
        h, residual = self.post_attention_layernorm(self.self_attn.output(o), hidden)
        return self.mlp(h), residual


class Eagle3Head(nn.Module):
    """The EAGLE-3 draft model over its own one-layer paged KV pool.

    forward(batch, kv, hidden, project): token r of the batch is fed with hidden[r], either
    the target's features at the position before it (3 x target_hidden_size: `fc` projects
    them) or the head's own output for that position (hidden_size). Returns, at
    batch.logits_indices, fp32 logits over the draft vocabulary and the head's hidden
    state (the residual stream before the final norm: what the next draft step is fed)."""

    d2t: torch.Tensor  # buffers: draft id d is target id d + d2t[d]
    t2d: torch.Tensor  # target id t is in the draft vocabulary

    def __init__(self, config: Eagle3Config, attention: AttentionBackend) -> None:
        super().__init__()
        c = config.layer
        self.config = config
        self.attention = attention
        self.embed_tokens: nn.Module | None = (
            nn.Embedding(c.vocab_size, c.hidden_size) if config.has_embedding else None
        )
        self._shared_embedding: tuple[torch.Tensor, ...] = ()  # the target's (not a parameter)
        self.fc = nn.Linear(3 * config.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_theta, c.rope_scaling)
        # draft id d is target id d + d2t[d]; t2d[t]: target id t is in the draft vocabulary
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool))

    def share_embedding(self, weight: torch.Tensor) -> None:
        """Use the target's token embedding (checkpoints without embed_tokens)."""
        c = self.config.layer
        if tuple(weight.shape) != (c.vocab_size, c.hidden_size):
            raise ValueError(
                f"the target's token embedding is {tuple(weight.shape)} but the EAGLE-3 head "
                f"needs ({c.vocab_size}, {c.hidden_size}); it was trained for another model"
            )
        self._shared_embedding = (weight,)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            out: torch.Tensor = self.embed_tokens(ids)
            return out
        assert self._shared_embedding, "an EAGLE-3 head without embedding: share the target's"
        return F.embedding(ids, self._shared_embedding[0])

    def forward(
        self,
        batch: ForwardBatch,
        kv: KVPool,
        hidden: torch.Tensor,
        project: bool,
        plan: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """project: hidden holds the target's features (fc maps them), else the head's own.
        plan: the batch's attention plan when the caller built it (a CUDA graph's)."""
        if project:
            hidden = self.fc(hidden)
        embeds = self.embed(batch.input_ids).to(hidden.dtype)
        if plan is None:
            plan = self.attention.plan(batch)
        cos, sin = self.rotary.cos_sin(batch.positions, hidden.dtype)
        step = _Step(cos, sin, kv, batch.out_cache_loc, self.attention, plan)
        h, residual = self.midlayer(embeds, hidden, step)
        rows = batch.logits_indices
        normed, total = self.norm(h.index_select(0, rows), residual.index_select(0, rows))
        return self.lm_head(normed).float(), total

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> the target's ids."""
        return draft_ids + self.d2t[draft_ids]


class ResBlock(nn.Module):
    """Medusa's residual block: x + SiLU(linear(x))."""

    def __init__(self, hidden: int, bias: bool = True) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """Medusa heads over the target's last hidden state (after its final norm): head i,
    num_layers residual blocks then a linear map to the vocabulary, predicts the token
    i + 2 places after the one whose hidden state it reads (the target's own head
    predicts the next one). `medusa_head.{i}.{j}.linear.*` / `medusa_head.{i}.{L}.weight`
    as FasterDecoding/Medusa names them."""

    def __init__(
        self, hidden: int, vocab: int, num_heads: int, num_layers: int, bias: bool = True
    ) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 0:
            raise ValueError(
                f"Medusa needs >= 1 head and >= 0 layers, got {num_heads}, {num_layers}"
            )
        self.hidden_size, self.vocab_size = hidden, vocab
        self.num_layers = num_layers
        self.medusa_head = nn.ModuleList(
            nn.Sequential(
                *(ResBlock(hidden, bias) for _ in range(num_layers)),
                nn.Linear(hidden, vocab, bias=False),
            )
            for _ in range(num_heads)
        )

    @property
    def num_heads(self) -> int:
        return len(self.medusa_head)

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """fp32 logits [heads, rows, vocab] of the first num_heads heads (default all)."""
        heads = list(self.medusa_head)[: num_heads or self.num_heads]
        return torch.stack([head(hidden).float() for head in heads])
