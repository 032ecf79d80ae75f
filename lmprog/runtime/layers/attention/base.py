"""AttentionBackend: how a layer's queries attend over the paged KV pool.

    plan = backend.plan(batch)                                          # once per step
    q, k, v = backend.rotate_and_store(qkv, cos, sin, layer, kv, loc)   # per layer
    out  = backend.forward(q, k, v, layer, kv, plan)                    # per layer

Latent attention (DeepSeek-V2) calls `rotate_and_store_latent` instead.
Design: docs/design/attention.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

from ..rotary import RotaryEmbedding

if TYPE_CHECKING:
    from ...executor.forward_batch import ForwardBatch
    from ...executor.kv_pool import KVPool, LatentKVPool


class AttentionBackend(ABC):
    """Built once per model as `Backend(num_heads, num_kv_heads, head_dim, device)`; with
    `rope_dim` (latent attention: keys longer than values by it) and `scale` (the softmax
    scale, default head_dim**-0.5) as keywords."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        device: torch.device,
        *,
        rope_dim: int = 0,
        scale: float | None = None,
    ) -> None:
        assert num_heads % num_kv_heads == 0
        assert rope_dim == 0 or num_kv_heads == 1, "latent attention has one KV head"
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.rope_dim = rope_dim
        self.device = device
        self.scale = head_dim**-0.5 if scale is None else scale

    @abstractmethod
    def plan(self, batch: ForwardBatch) -> Any:
        """Per-step metadata shared by all layers (index tensors, masks, split sizes).

        Called once per forward; must not change `batch`, the pool, or the backend's own state
        in a way a later plan() depends on.
        """

    def warm_up(self, kv: KVPool, req_to_token: torch.Tensor) -> None:
        """Compile, before serving, what a step could otherwise first need mid-run (default:
        nothing). May read the pool; changes nothing a step depends on."""

    def rotate_and_store(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        layer: int,
        kv: KVPool,
        out_cache_loc: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qkv [T, num_heads + 2 * num_kv_heads, head_dim] (q, k, v heads of the fused
        projection); cos/signed_sin from RotaryEmbedding.cos_sin. Returns (q, k, v) with q and
        k rotated, after writing k and v into `kv` at out_cache_loc [T]."""
        kv.wait_layer(layer)  # the host tier's copies into this layer (layer-wise loading)
        hq, hkv = self.num_heads, self.num_kv_heads
        qk = RotaryEmbedding.rotate(qkv[:, : hq + hkv], cos, signed_sin)
        q, k, v = qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv :]
        kv.write(layer, out_cache_loc, k, v)
        return q, k, v

    def rotate_and_store_latent(
        self,
        q: torch.Tensor,
        latent: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        layer: int,
        kv: LatentKVPool,
        out_cache_loc: torch.Tensor,
    ) -> torch.Tensor:
        """Latent attention: q [T, num_heads, head_dim + rope_dim] and latent [T, 1, head_dim
        + rope_dim] (c_kv | k_pe), each rotated in place in its last rope_dim columns; the
        latent row written into `kv` at out_cache_loc [T]. Returns q."""
        kv.wait_layer(layer)
        d = self.head_dim
        q[..., d:] = RotaryEmbedding.rotate(q[..., d:], cos, signed_sin)
        latent[..., d:] = RotaryEmbedding.rotate(latent[..., d:], cos, signed_sin)
        kv.write(layer, out_cache_loc, latent)
        return q

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: int,
        kv: KVPool,
        plan: Any,
    ) -> torch.Tensor:
        """q [T, num_heads, head_dim + rope_dim], k/v [T, num_kv_heads, ...] (already in the
        pool; may be None) -> attention output [T, num_heads, head_dim] in q's dtype, scaled by
        `scale`, each new token attending per the ForwardBatch rule (causal over its
        request's slots, or custom_mask)."""
