"""The adapter memory pool: device buffers for `slots` adapters at once, beside the KV pool.

Per layer and fused projection, every slot's A and B stacked and zero-padded to the pool's
rank. `write(slot, adapter)` pages one in; the manager decides which slot.
Buffer shapes: docs/design/lora.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from .adapter import FUSED_SLICE, MLP_MODULES, module_shapes

if TYPE_CHECKING:
    from ..models.config import ModelConfig
    from ..parallel.sharding import ShardPlan

GROUP_MEMBERS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}
# the staged host copy of one adapter: (layer, group) -> (A [n*R, in], B [out, R])
Staged = dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


class LoraPool:
    def __init__(
        self,
        config: ModelConfig,
        *,
        slots: int,
        max_rank: int,
        targets: Iterable[str],
        dtype: torch.dtype,
        device: torch.device,
        shard: ShardPlan | None = None,
    ) -> None:
        self.slots, self.rank = slots, max_rank
        self.targets = frozenset(targets)
        self.dtype, self.device = dtype, device
        self.shard = shard  # tensor parallelism: this rank's part of every adapter
        shapes = module_shapes(config if shard is None else shard.local)
        self.slices: dict[str, tuple[int, ...]] = {
            g: tuple(shapes[m][1] for m in members) for g, members in GROUP_MEMBERS.items()
        }
        self.buffers: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for layer in range(config.num_layers):
            for group, members in GROUP_MEMBERS.items():
                if not self.targets & set(members):
                    continue
                if members[0] in MLP_MODULES and config.is_moe_layer(layer):
                    continue
                fan_in = shapes[members[0]][0]
                a = torch.zeros(slots, len(members) * max_rank, fan_in, dtype=dtype, device=device)
                b = torch.zeros(
                    slots, sum(self.slices[group]), max_rank, dtype=dtype, device=device
                )
                self.buffers[(layer, group)] = (a, b)

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size()
                   for a, b in self.buffers.values())  # fmt: skip

    @staticmethod
    def bytes_needed(
        config: ModelConfig,
        *,
        slots: int,
        max_rank: int,
        targets: Iterable[str],
        dtype: torch.dtype,
    ) -> int:
        """What a pool of these arguments takes, without allocating it."""
        shapes, targets, size = module_shapes(config), frozenset(targets), 0
        for layer in range(config.num_layers):
            for members in GROUP_MEMBERS.values():
                if not targets & set(members):
                    continue
                if members[0] in MLP_MODULES and config.is_moe_layer(layer):
                    continue
                size += len(members) * max_rank * shapes[members[0]][0]
                size += sum(shapes[m][1] for m in members) * max_rank
        return size * slots * torch.empty(0, dtype=dtype).element_size()

    def stage(self, weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]) -> Staged:
        """An adapter's weights laid out as one slot of the buffers, in the pool's dtype, on
        the host (pinned when the pool is on a GPU, so paging in does not wait)."""
        r = self.rank
        staged: Staged = {}
        for key, (a_buf, b_buf) in self.buffers.items():
            layer, group = key
            members = GROUP_MEMBERS[group]
            if not any((layer, m) in weights for m in members):
                continue
            a = torch.zeros(a_buf.shape[1:], dtype=self.dtype)
            b = torch.zeros(b_buf.shape[1:], dtype=self.dtype)
            lo = 0
            for j, member in enumerate(members):
                width = self.slices[group][j]
                if (layer, member) in weights:
                    wa, wb = self._part(layer, member, *weights[(layer, member)])
                    rank = wa.shape[0]
                    a[j * r : j * r + rank] = wa
                    b[lo : lo + width, :rank] = wb
                lo += width
            if self.device.type == "cuda":
                a, b = a.pin_memory(), b.pin_memory()
            staged[key] = (a, b)
        return staged

    def _part(
        self, layer: int, module: str, a: torch.Tensor, b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (A, B) of a module, sharded as the layer it wraps: a column-parallel
        projection (q/k/v, gate/up) keeps all of A and its rows of B (its output features);
        a row-parallel one (o, down) its columns of A (its input features) and all of B, its
        partial B A_r x_r summed by the layer's all-reduce with the base output's."""
        if self.shard is None:
            return a, b
        block = "mlp" if module in MLP_MODULES else "self_attn"
        sel = self.shard.select(f"model.layers.{layer}.{block}.{module}.weight")
        if sel is None:
            return a, b
        dim, start, stop = sel
        if dim == 0:
            return a, b[start:stop]
        return a[:, start:stop], b

    def write(self, slot: int, staged: Staged) -> None:
        """Page a staged adapter into `slot` (every other buffer of the slot zeroed). Queued
        on the device's stream after the steps already launched, which may still read the
        slot's previous adapter."""
        for key, (a_buf, b_buf) in self.buffers.items():
            part = staged.get(key)
            if part is None:
                a_buf[slot].zero_()
                b_buf[slot].zero_()
            else:
                a_buf[slot].copy_(part[0], non_blocking=True)
                b_buf[slot].copy_(part[1], non_blocking=True)


def group_of(module: str) -> str:
    return FUSED_SLICE[module][0]
