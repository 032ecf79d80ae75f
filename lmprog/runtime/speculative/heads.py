"""Trained draft heads as plain modules: EAGLE's draft layers and Medusa's heads.

    Eagle3Head(config, attention)   (ids, target features | own hidden) -> draft logits, hidden
    Eagle1Head(config, attention)   the same over the target's last hidden state (EAGLE-1/2)
    MedusaHeads(hidden, vocab, num_heads, num_layers)   last hidden -> [heads, rows, vocab]

Parameter names are the published checkpoints' (SGLang's and vLLM's readers; q/k/v and
gate/up fused as the runtime's Llama layers are). Loading and saving those layouts:
head_files.py, eagle1_files.py. Design: docs/design/speculative.md.
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
from ..models.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP, _Step


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


class EagleHead(nn.Module):
    """What the EAGLE proposer drives: one draft decoder layer over its own paged KV pool.

    forward(batch, kv, hidden, project): token r of the batch is fed with hidden[r], either
    the target's captured features of the position before it (project=True: the head maps
    them to its input) or the head's own output for that position. Returns, at
    batch.logits_indices, fp32 logits over the draft vocabulary and the head's hidden state
    there (what the next draft step is fed). `reads`: how many target layers it reads
    (capture_layers)."""

    reads: int
    config: Any  # Eagle3Config | Eagle1Config: `.layer` is the draft layer's ModelConfig

    def __init__(self, config: Any, attention: AttentionBackend) -> None:
        super().__init__()
        c = config.layer
        self.config = config
        self.attention = attention
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_theta, c.rope_scaling)
        self._shared_embedding: tuple[torch.Tensor, ...] = ()  # the target's (not a parameter)

    def share_embedding(self, weight: torch.Tensor) -> None:
        """Use the target's token embedding (checkpoints without embed_tokens)."""
        c = self.config.layer
        if tuple(weight.shape) != (c.vocab_size, c.hidden_size):
            raise ValueError(
                f"the target's token embedding is {tuple(weight.shape)} but the EAGLE head "
                f"needs ({c.vocab_size}, {c.hidden_size}); it was trained for another model"
            )
        self._shared_embedding = (weight,)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        embed_tokens = getattr(self, "embed_tokens", None)
        if embed_tokens is not None:
            out: torch.Tensor = embed_tokens(ids)
            return out
        assert self._shared_embedding, "an EAGLE head without embedding: share the target's"
        return F.embedding(ids, self._shared_embedding[0])

    def step(self, batch: ForwardBatch, kv: KVPool, dtype: torch.dtype, plan: Any) -> _Step:
        """What the draft layer of one forward shares (plan: None plans the batch)."""
        if plan is None:
            plan = self.attention.plan(batch)
        cos, sin = self.rotary.cos_sin(batch.positions, dtype)
        return _Step(cos, sin, kv, batch.out_cache_loc, self.attention, plan)

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> the target's ids (the same vocabulary: themselves)."""
        return draft_ids


class Eagle3Head(EagleHead):
    """The EAGLE-3 draft model: hidden is 3 x target_hidden_size target features (`fc`
    projects them) or the head's own output (hidden_size); logits over the draft
    vocabulary (d2t maps them), hidden state the residual stream before the final norm."""

    reads = 3
    d2t: torch.Tensor  # buffers: draft id d is target id d + d2t[d]
    t2d: torch.Tensor  # target id t is in the draft vocabulary

    def __init__(self, config: Eagle3Config, attention: AttentionBackend) -> None:
        super().__init__(config, attention)
        c = config.layer
        self.embed_tokens: nn.Module | None = (
            nn.Embedding(c.vocab_size, c.hidden_size) if config.has_embedding else None
        )
        self.fc = nn.Linear(3 * config.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, config.draft_vocab_size, bias=False)
        # draft id d is target id d + d2t[d]; t2d[t]: target id t is in the draft vocabulary
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool))

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
        h, residual = self.midlayer(embeds, hidden, self.step(batch, kv, hidden.dtype, plan))
        rows = batch.logits_indices
        normed, total = self.norm(h.index_select(0, rows), residual.index_select(0, rows))
        return self.lm_head(normed).float(), total

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


@dataclass(frozen=True)
class Eagle1Config:
    """An EAGLE-1 head (EAGLE-2 drafts with the same weights): layer, the draft decoder
    layer's shape (hidden_size and vocab_size: the target's, whose embedding and lm_head it
    shares); fc_bias: `fc` has a bias (SafeAILab/EAGLE's default); para_norm: HASS's
    norms of the embedding and the hidden state before `fc` (config add_para_norm)."""

    layer: ModelConfig
    fc_bias: bool = True
    para_norm: bool = False

    def capture_layers(self, target_layers: int) -> tuple[int, ...]:
        """The stream leaving the target's last layer (the head applies the target's final
        norm to it: the feature the target's lm_head reads, which EAGLE-1 is trained on)."""
        return (target_layers,)


class Eagle1Head(EagleHead):
    """The EAGLE-1 draft model (SafeAILab/EAGLE's cnets.py; SGLang's and vLLM's
    llama_eagle.py): x = fc([embedding, feature]), one Llama decoder layer without its input
    norm, no final norm; the output (the residual stream leaving the layer) goes through the
    target's lm_head for the draft logits and is the next depth's feature. The target's
    features arrive before its final norm (what its piecewise graphs capture too): project
    applies that norm, shared with the target as its embedding and lm_head are."""

    reads = 1

    def __init__(self, config: Eagle1Config, attention: AttentionBackend) -> None:
        super().__init__(config, attention)
        c = config.layer
        h = c.hidden_size
        if config.para_norm:
            self.embedding_layernorm = RMSNorm(h, c.rms_norm_eps)
            self.hidden_states_layernorm = RMSNorm(h, c.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h, bias=config.fc_bias)
        layer = LlamaDecoderLayer(c, 0)
        layer.add_module("input_layernorm", nn.Identity())  # the original skips it on layer 0
        self.layers = nn.ModuleList([layer])
        self._target: tuple[torch.Tensor, nn.Module] | None = None  # (lm_head weight, norm)

    def share_target(self, lm_head: torch.Tensor, norm: nn.Module) -> None:
        """Use the target's lm_head ([vocab, hidden]) and final norm (not parameters)."""
        c = self.config.layer
        if tuple(lm_head.shape) != (c.vocab_size, c.hidden_size):
            raise ValueError(
                f"the target's lm_head is {tuple(lm_head.shape)} but the EAGLE head needs "
                f"({c.vocab_size}, {c.hidden_size}); it was trained for another model"
            )
        self._target = (lm_head, norm)

    def forward(
        self,
        batch: ForwardBatch,
        kv: KVPool,
        hidden: torch.Tensor,
        project: bool,
        plan: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """project: hidden is the stream leaving the target's last layer, else the head's
        own output. plan: as Eagle3Head's."""
        assert self._target is not None, "an EAGLE-1 head: share_target first"
        lm_head, target_norm = self._target
        if project:
            hidden = target_norm(hidden)
        embeds = self.embed(batch.input_ids).to(hidden.dtype)
        if self.config.para_norm:
            embeds = self.embedding_layernorm(embeds)
            hidden = self.hidden_states_layernorm(hidden)
        x = self.fc(torch.cat([embeds, hidden], dim=-1))
        h, residual = self.layers[0](x, None, self.step(batch, kv, hidden.dtype, plan))
        rows = batch.logits_indices
        out = h.index_select(0, rows) + residual.index_select(0, rows)
        return F.linear(out, lm_head).float(), out


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
