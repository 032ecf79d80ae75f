"""LoRA around a loaded model's projections, applied from outside (as the quantized and
tensor-parallel layers are).

    layers = attach_lora_(model, pool)    # each adapted projection becomes a LoraLinear
    context = LoraContext(triton, pool, layers)
    context.batch = LoraBatch(...)        # this thread's forwards add the step's adapters
    y = base(x);  if context.batch: y[t] += B[slot(t)] A[slot(t)] x[t]  for adapter tokens

With no adapter in the step the layer is the base layer alone (what CUDA graphs capture
without LoRA). Engines sharing one model (data-parallel replicas on one device, each on its
own thread) each have their own pool and context over the same layers. Design:
docs/design/lora.md.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lmprog.core.errors import LoraError

from ..parallel.sharding import RowParallel
from .ops import LoraBatch, lora_delta_ref
from .pool import LoraPool

if TYPE_CHECKING:
    from ..models.llama import LlamaForCausalLM


class _Active(threading.local):
    context: LoraContext | None = None  # per thread: the context whose batch is set


class LoraLayers:
    """The LoRA layers of one model: which projections are wrapped (`slices` per (layer,
    group)), and on each thread the LoraContext whose step runs there (None: the base)."""

    def __init__(self, slices: dict[tuple[int, str], tuple[int, ...]]) -> None:
        self.slices = slices
        self.active = _Active()


class LoraContext:
    """One LoraManager's view of its model's LoRA layers: its pool (whose buffers the
    layers read) and the step's layout (`batch`, None: base only), set by the model runner
    around each forward on the engine's thread. triton: the layers run the Triton kernels."""

    def __init__(self, triton: bool, pool: LoraPool, layers: LoraLayers) -> None:
        self.triton = triton
        self.pool = pool
        self.layers = layers
        self._batch: LoraBatch | None = None

    @property
    def batch(self) -> LoraBatch | None:
        return self._batch

    @batch.setter
    def batch(self, batch: LoraBatch | None) -> None:
        """Setting a layout makes this context the one the layers read on this thread;
        None puts the base model back."""
        self._batch = batch
        self.layers.active.context = None if batch is None else self


class LoraLinear(nn.Module):
    """`base` plus the active context's adapters of projection `key` ((layer, group)): its
    pool's lora_a [S, n*R, in] and lora_b [S, out, R]; `slices` the n output widths (q, k,
    v or gate, up, or one)."""

    def __init__(
        self, base: nn.Module, layers: LoraLayers, key: tuple[int, str], slices: tuple[int, ...]
    ) -> None:
        super().__init__()
        self.base = base
        self.layers, self.key, self.slices = layers, key, slices

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        context = self.layers.active.context
        if context is None:
            return y
        batch = context.batch
        assert batch is not None  # the active context is the one whose batch is set
        lora_a, lora_b = context.pool.buffers[self.key]
        if batch.triton:
            from ..kernels.lora import lora_expand, lora_shrink

            x = x if x.stride(-1) == 1 else x.contiguous()
            layout = (batch.sorted_ids, batch.block_slots, batch.num_padded, batch.block_m)
            u = lora_shrink(x, lora_a, *layout)
            return lora_expand(u, lora_b, y, self.slices, *layout)
        assert batch.segments is not None
        return lora_delta_ref(x, y, lora_a, lora_b, self.slices, batch.segments)

    def extra_repr(self) -> str:
        layer, group = self.key
        return f"layer={layer}, group={group}, slices={self.slices}"


def attach_lora_(model: LlamaForCausalLM, pool: LoraPool) -> LoraLayers:
    """Wrap every projection the pool has buffers for, once per model: a model wrapped
    already (another engine's pool over the same weights) keeps its layers, which must
    cover the same projections of the same widths (a LoraError otherwise)."""
    slices = {key: pool.slices[key[1]] for key in pool.buffers}
    layers: LoraLayers | None = getattr(model, "lora_layers", None)
    if layers is not None:
        if layers.slices != slices:
            raise LoraError(
                "this model's LoRA layers were attached for other projections "
                f"({len(layers.slices)} wrapped, this pool has {len(slices)}); engines "
                "sharing a model need the same lora_target_modules and LoRA config"
            )
        return layers
    layers = LoraLayers(slices)
    for i, layer in enumerate(model.model.layers):
        for owner, group in (
            (layer.self_attn, "qkv_proj"),
            (layer.self_attn, "o_proj"),
            (layer.mlp, "gate_up_proj"),
            (layer.mlp, "down_proj"),
        ):
            if (i, group) not in slices:
                continue
            base: Any = getattr(owner, group)
            lora = LoraLinear(
                base.inner if isinstance(base, RowParallel) else base,
                layers,
                (i, group),
                slices[(i, group)],
            )
            if isinstance(base, RowParallel):  # B A_r x_r joins the partial sums reduced
                base.inner = lora
            else:
                setattr(owner, group, lora)
    model.lora_layers = layers
    return layers
