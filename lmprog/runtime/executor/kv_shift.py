"""Attention sinks, the model runner's side: a step's KVShift done on the pool before the
forward. Each kept key is rotated back by the evicted distance (R(-d) R(p) k == R(p - d) k);
which tokens move is scheduler/sinks.py's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..layers.rotary import RotaryEmbedding, inv_freq

if TYPE_CHECKING:
    from ..models.config import ModelConfig
    from ..models.llama import LlamaForCausalLM
    from .kv_pool import KVPool


def check_attention_sinks(model: LlamaForCausalLM, tp: Any = None) -> None:
    """ValueError naming what to change unless `model` can evict and re-rotate its KV:
    one RoPE for every layer over per-head K/V, in one process."""
    config = model.config
    if tp is not None:
        raise ValueError("attention sinks do not support tensor parallelism (tp_size > 1) yet")
    if config.sliding_window_pattern:
        raise ValueError(
            f"attention sinks need one RoPE for every layer; {config.architecture}'s "
            "sliding-window layers rotate with their own base (Gemma 3 is not supported)"
        )
    if getattr(config, "kv_lora_rank", 0):
        raise ValueError("attention sinks do not support latent attention (kv_lora_rank > 0)")


class KeyShifter:
    """Rotates keys of `config`'s RoPE back by a number of positions."""

    def __init__(self, config: ModelConfig) -> None:
        self._inv_freq = inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def rotation(self, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """delta [N] -> fp32 (cos, signed sin) [N, 1, head_dim] of the rotation by -delta, in
        RotaryEmbedding.rotate's layout."""
        freq = self._on_device.get(delta.device)
        if freq is None:
            freq = self._on_device.setdefault(delta.device, self._inv_freq.to(delta.device))
        angles = -delta.float()[:, None] * freq[None, :]
        sin = angles.sin()
        cos = torch.cat((angles.cos(),) * 2, dim=-1)[:, None, :]
        return cos, torch.cat((-sin, sin), dim=-1)[:, None, :]

    def shift(self, kv: KVPool, src: torch.Tensor, dst: torch.Tensor, delta: torch.Tensor) -> None:
        """For every layer: k[dst] = R(-delta) k[src], v[dst] = v[src] (src, dst, delta:
        int64 [N] on the pool's device; every src read before any dst is written)."""
        if not src.shape == dst.shape == delta.shape or src.dim() != 1:
            raise ValueError(
                f"src, dst and delta must be 1-D of one length, got {tuple(src.shape)}, "
                f"{tuple(dst.shape)}, {tuple(delta.shape)}"
            )
        if src.device != kv.device or dst.device != kv.device or delta.device != kv.device:
            raise ValueError(f"src, dst and delta must be on the pool's device {kv.device}")
        cos, sin = self.rotation(delta)
        # a rotation is linear, so an FP8 pool's scaled keys rotate as they are; a component
        # may grow (by up to sqrt(2)): clamp to the storage type's range
        bound = torch.finfo(kv.dtype).max
        for layer in range(kv.num_layers):
            k = RotaryEmbedding.rotate(kv.k[layer].index_select(0, src).float(), cos, sin)
            v = kv.v[layer].index_select(0, src)
            kv.k[layer][dst] = k.clamp_(-bound, bound).to(kv.dtype)
            kv.v[layer][dst] = v
