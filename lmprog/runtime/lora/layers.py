"""LoRA around a loaded model's projections, applied from outside (as the quantized and
tensor-parallel layers are).

    attach_lora_(model, pool, context)   # each adapted projection becomes a LoraLinear
    y = base(x);  if context.batch: y[t] += B[slot(t)] A[slot(t)] x[t]  for adapter tokens

With no adapter in the step the layer is the base layer alone (what CUDA graphs capture
without LoRA). Design: docs/design/lora.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..parallel.sharding import RowParallel
from .ops import LoraBatch, lora_delta_ref
from .pool import LoraPool

if TYPE_CHECKING:
    from ..models.llama import LlamaForCausalLM


class LoraContext:
    """What every LoRA layer of one model shares: the step's layout (None: base only), set
    by the model runner around each forward. triton: the layers run the Triton kernels."""

    def __init__(self, triton: bool) -> None:
        self.triton = triton
        self.batch: LoraBatch | None = None


class LoraLinear(nn.Module):
    """`base` plus the pool's adapters of this projection: lora_a [S, n*R, in], lora_b
    [S, out, R] (views of the pool's buffers, not parameters), `slices` its n output
    widths (q, k, v or gate, up, or one)."""

    def __init__(
        self,
        base: nn.Module,
        context: LoraContext,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        slices: tuple[int, ...],
    ) -> None:
        super().__init__()
        self.base = base
        self.context = context
        self.lora_a, self.lora_b, self.slices = lora_a, lora_b, slices

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        batch = self.context.batch
        if batch is None:
            return y
        if batch.triton:
            from ..kernels.lora import lora_expand, lora_shrink

            x = x if x.stride(-1) == 1 else x.contiguous()
            layout = (batch.sorted_ids, batch.block_slots, batch.num_padded, batch.block_m)
            u = lora_shrink(x, self.lora_a, *layout)
            return lora_expand(u, self.lora_b, y, self.slices, *layout)
        assert batch.segments is not None
        return lora_delta_ref(x, y, self.lora_a, self.lora_b, self.slices, batch.segments)

    def extra_repr(self) -> str:
        s, nr, _ = self.lora_a.shape
        return f"slots={s}, rank={nr // len(self.slices)}, slices={self.slices}"


def attach_lora_(model: LlamaForCausalLM, pool: LoraPool, context: LoraContext) -> int:
    """Wrap every projection the pool has buffers for; returns how many were wrapped."""
    wrapped = 0
    for i, layer in enumerate(model.model.layers):
        for owner, group in (
            (layer.self_attn, "qkv_proj"),
            (layer.self_attn, "o_proj"),
            (layer.mlp, "gate_up_proj"),
            (layer.mlp, "down_proj"),
        ):
            buffers = pool.buffers.get((i, group))
            if buffers is None:
                continue
            base: Any = getattr(owner, group)
            if isinstance(base, RowParallel):  # B A_r x_r joins the partial sums reduced
                base.inner = LoraLinear(base.inner, context, *buffers, pool.slices[group])
            else:
                setattr(owner, group, LoraLinear(base, context, *buffers, pool.slices[group]))
            wrapped += 1
    return wrapped
