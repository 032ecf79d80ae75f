"""The Triton hybrid-attention kernels (lmprog.runtime.kernels) as an AttentionBackend.

One plan per step (host-side tiling, no device sync when the batch carries host lengths),
then one kernel family per layer: prefill chunks, decodes and verify rows in the same launch.

Latent attention (rope_dim > 0): the pool's one latent head is handed to the kernels as
num_heads // group heads, an expanded view with stride 0, so that a tile holds at most
MAX_LATENT_GROUP query heads (16 of DeepSeek-V2-Lite's 16, of V2's 128) and its accumulator
[rows, kv_lora_rank] stays in registers; `num_kv_heads` counts those views.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...kernels.attention import hybrid_attention, warm_up
from ...kernels.attention_plan import AttentionPlan, plan_attention
from ...kernels.rope import rope_and_store
from .base import AttentionBackend

if TYPE_CHECKING:
    from ...executor.forward_batch import ForwardBatch
    from ...executor.kv_pool import KVPool


MAX_LATENT_GROUP = 16  # query heads a latent-attention tile holds at most


class TritonAttentionBackend(AttentionBackend):
    """CUDA (or CPU under TRITON_INTERPRET=1); the pool layout is the kernels' own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As the base class; latent attention's head then counts as num_kv_heads views."""
        super().__init__(*args, **kwargs)
        if self.rope_dim:
            heads = self.num_heads
            group = max(g for g in range(1, MAX_LATENT_GROUP + 1) if heads % g == 0)
            self.num_kv_heads = heads // group

    def _buffers(self, kv: KVPool, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K and V as the kernels read them (docs/design/attention.md)."""
        k, v = kv.k[layer], kv.v[layer]
        if self.rope_dim:
            k, v = k.expand(-1, self.num_kv_heads, -1), v.expand(-1, self.num_kv_heads, -1)
        return k, v

    def plan(self, batch: ForwardBatch) -> AttentionPlan:
        return plan_attention(
            batch.req_to_token,
            batch.req_pool_indices,
            batch.seq_lens,
            batch.extend_lens,
            batch.extend_start_loc,
            num_q_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            seq_lens_cpu=batch.seq_lens_cpu,
            extend_lens_cpu=batch.extend_lens_cpu,
            custom_mask=batch.custom_mask,
            mask_indptr=batch.mask_indptr,
        )

    def warm_up(self, kv: KVPool, req_to_token: torch.Tensor) -> None:
        """The split launch's variants (kernels.attention.warm_up); on a GPU only (under the
        interpreter nothing is compiled)."""
        if req_to_token.device.type == "cuda":
            warm_up(*self._buffers(kv, 0), req_to_token, num_q_heads=self.num_heads,
                    q_dtype=kv.compute_dtype)  # fmt: skip

    def rotate_and_store(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        layer: int,
        kv: KVPool,
        out_cache_loc: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One kernel: q and k rotated in place in qkv, k and v written to the pool."""
        kv.wait_layer(layer)  # the host tier's copies into this layer (layer-wise loading)
        k_scale, v_scale = kv.scales(layer)
        rope_and_store(qkv, self.num_heads, cos, signed_sin, kv.k[layer], kv.v[layer],
                       out_cache_loc, k_scale=k_scale, v_scale=v_scale)  # fmt: skip
        hq, hkv = self.num_heads, self.num_kv_heads
        return qkv[:, :hq], qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: int,
        kv: KVPool,
        plan: AttentionPlan,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As the base class; `out` ([T, num_heads, head_dim]) receives the result when given."""
        k_buffer, v_buffer = self._buffers(kv, layer)
        k_scale, v_scale = kv.scales(layer)  # an FP8 pool's (1.0 otherwise)
        return hybrid_attention(q, k_buffer, v_buffer, plan, sm_scale=self.scale, out=out,
                                k_scale=k_scale, v_scale=v_scale)  # fmt: skip
