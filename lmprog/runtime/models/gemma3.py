"""Gemma 3's text decoder (gemma-3-270m, -1b, and the text part of larger ones) as plain
modules, sharing the Llama family's projections and loader.

Differences from Llama: scaled embeddings, (1 + w) RMSNorm, four norms per layer, q/k
norms, GELU-tanh MLP, sliding-window layers, logit soft-capping. Needs an attention backend
with `set_sliding_window` (the torch one). Details: docs/design/models.md.
"""

from __future__ import annotations

from collections.abc import Iterable
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
from .config import ModelConfig
from .llama import QKV, DecoderStack, LlamaAttention, LlamaForCausalLM, LlamaMLP, _Step


@dataclass(frozen=True)
class _GemmaStep(_Step):
    """A step's shared values, with the sliding layers' own rotation."""

    local_cos: torch.Tensor | None = None
    local_sin: torch.Tensor | None = None


class GeluTanhAndMul(nn.Module):
    """[..., 2 * d] (gate | up) -> gelu_tanh(gate) * up, shape [..., d]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


class Gemma3Attention(LlamaAttention):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__(config, layer)
        self.sliding = config.is_sliding(layer)
        scalar = config.query_pre_attn_scalar or config.head_dim
        # the backends scale by head_dim**-0.5; Gemma's scale is scalar**-0.5
        self.q_scale = (config.head_dim / scalar) ** 0.5

    def project(self, x: torch.Tensor, step: _Step) -> QKV:
        """(q, k, v) of x: per-head q/k norms, then the rotation of this layer's kind; k and v
        written to the pool; q carries the query scaling."""
        hq, hkv = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(x.shape[0], hq + 2 * hkv, self.head_dim)
        assert self.q_norm is not None and self.k_norm is not None  # Gemma 3 has both
        qkv = torch.cat(
            [self.q_norm(qkv[:, :hq]), self.k_norm(qkv[:, hq : hq + hkv]), qkv[:, hq + hkv :]],
            dim=1,
        )
        if self.sliding and isinstance(step, _GemmaStep) and step.local_cos is not None:
            cos, sin = step.local_cos, step.local_sin
            assert sin is not None  # set with local_cos
        else:
            cos, sin = step.cos, step.sin
        q, k, v = step.attention.rotate_and_store(
            qkv, cos, sin, self.layer, step.kv, step.out_cache_loc
        )
        if self.q_scale != 1.0:
            q = q * self.q_scale
        return q, k, v


class Gemma3MLP(LlamaMLP):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.act = GeluTanhAndMul()


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(dim, eps)
        self.self_attn = Gemma3Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.pre_feedforward_layernorm = RMSNorm(dim, eps)
        self.mlp = Gemma3MLP(config)
        self.post_feedforward_layernorm = RMSNorm(dim, eps)

    def forward(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: _Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, residual) -> (h', residual') as LlamaDecoderLayer: the stream is residual + h."""
        (q, k, v), residual = self.attention_input(h, residual, step)
        o = step.attention.forward(q, k, v, self.self_attn.layer, step.kv, step.plan)
        return self.attention_output(o, residual)

    def attention_input(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: _Step
    ) -> tuple[QKV, torch.Tensor]:
        if residual is None:
            x, residual = self.input_layernorm(h), h
        else:
            x, residual = self.input_layernorm(h, residual)
        return self.self_attn.project(x, step), residual

    def attention_output(
        self, o: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The post-attention norm on the attention output, the residual add with the
        pre-feedforward norm, the MLP, the post-feedforward norm (added by the next norm)."""
        a = self.post_attention_layernorm(self.self_attn.output(o))
        x, residual = self.pre_feedforward_layernorm(a, residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class Gemma3Model(DecoderStack):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 over the paged KV pool; weights by HF name (`load_weights`), norms as HF's w."""

    def __init__(self, config: ModelConfig, attention: AttentionBackend) -> None:
        nn.Module.__init__(self)
        if not config.qk_norm:
            raise ValueError("a Gemma 3 config has per-head q/k norms (qk_norm=True)")
        self.config = config
        self.attention = attention
        self.model = Gemma3Model(config)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        sliding = [i for i in range(config.num_layers) if config.is_sliding(i)]
        self.local_rotary = None
        if sliding:
            self.local_rotary = RotaryEmbedding(
                config.head_dim, config.rope_local_theta or config.rope_theta
            )
        if sliding and attention is not None:  # None: a shape-only model (tensor parallelism)
            if not hasattr(attention, "set_sliding_window"):
                raise ValueError(
                    f"the {type(attention).__name__} attention backend has no sliding-window "
                    "attention, which Gemma 3's local layers need; use attention='torch'"
                )
            attention.set_sliding_window(config.sliding_window, sliding)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self._embed_scale = config.hidden_size**0.5

    def embed(self, batch: ForwardBatch, kv: KVPool, plan: Any) -> tuple[torch.Tensor, _Step]:
        emb = self.model.embed_tokens(batch.input_ids)
        h = emb * torch.tensor(self._embed_scale, dtype=emb.dtype, device=emb.device)
        cos, sin = self.rotary.cos_sin(batch.positions, h.dtype)
        local_cos = local_sin = None
        if self.local_rotary is not None:
            local_cos, local_sin = self.local_rotary.cos_sin(batch.positions, h.dtype)
        step = _GemmaStep(
            cos, sin, kv, batch.out_cache_loc, self.attention, plan, local_cos, local_sin
        )
        return h, step

    def logits(self, h: torch.Tensor, residual: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        logits = super().logits(h, residual, rows)
        cap = self.config.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """HF-named tensors in; each RMSNorm's w becomes the stored multiplier 1 + w."""
        super().load_weights(
            (name, tensor + 1.0 if name.endswith("norm.weight") else tensor)
            for name, tensor in weights
        )
