"""KVPool: the token-granular key/value memory every attention backend reads.

    k[layer]: [num_slots + 1, num_kv_heads, head_dim]     (v[layer] the same)
               ^ slot 0 is a dummy: padding points there, writes to it are harmless
    slots 1..num_slots belong to tokens; req_to_token rows map a request's tokens to slots.

Multi-head latent attention (DeepSeek-V2, `ModelConfig.kv_lora_rank > 0`) keeps one row per
token and layer instead of per-head K and V (`LatentKVPool`):

    k[layer]: [num_slots + 1, 1, kv_lora_rank + qk_rope_head_dim]   | c_kv | k_pe |
    v[layer]: the first kv_lora_rank columns of k[layer] (a view)   | c_kv |

The pool owns memory only; which slot is free is the allocator's business (torch-free).
`for_model`, `bytes_per_token` and `size_for_budget` pick the layout from the config.
"""

from __future__ import annotations

import math
import mmap
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .models.config import ModelConfig


class KVPool:
    """Per-layer K/V buffers in the model's dtype on the model's device (zero-initialised;
    on the CPU an anonymous mapping, whose pages the kernel zeroes when first touched: the
    pool costs memory as it fills, not a second of page faults at start-up)."""

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        _check_slots(num_slots)
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_layers, 2, num_slots + 1, num_kv_heads, head_dim)
        self._buffer = _zeros(shape, dtype, self.device)
        self.k = [self._buffer[i, 0] for i in range(num_layers)]
        self.v = [self._buffer[i, 1] for i in range(num_layers)]

    @classmethod
    def for_model(
        cls, config: ModelConfig, num_slots: int, dtype: torch.dtype, device: torch.device | str
    ) -> KVPool:
        """The pool of `config`'s layout: a LatentKVPool for latent attention."""
        if config.kv_lora_rank:
            return LatentKVPool(
                num_slots,
                config.num_layers,
                config.kv_lora_rank,
                config.qk_rope_head_dim,
                dtype,
                device,
            )
        return cls(
            num_slots, config.num_layers, config.num_kv_heads, config.head_dim, dtype, device
        )

    @staticmethod
    def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
        """What one token costs over all layers: K and V, or the latent and the RoPE key."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        if config.kv_lora_rank:
            per_layer = config.kv_lora_rank + config.qk_rope_head_dim
        else:
            per_layer = 2 * config.num_kv_heads * config.head_dim
        return config.num_layers * per_layer * itemsize

    @classmethod
    def size_for_budget(cls, budget_bytes: int, config: ModelConfig, dtype: torch.dtype) -> int:
        """How many token slots fit in `budget_bytes` (the dummy slot included in the cost)."""
        num_slots = budget_bytes // cls.bytes_per_token(config, dtype) - 1
        if num_slots < 1:
            raise ValueError(
                f"a KV budget of {budget_bytes} bytes holds no token "
                f"({cls.bytes_per_token(config, dtype)} bytes each); raise it"
            )
        return num_slots

    @property
    def nbytes(self) -> int:
        return self._buffer.numel() * self._buffer.element_size()

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, num_kv_heads, head_dim] of layer `layer` at slots loc [T]."""
        self.k[layer][loc] = k
        self.v[layer][loc] = v


class LatentKVPool(KVPool):
    """The latent-attention layout (module docstring): one "KV head" per layer whose key is
    [kv_lora_rank + rope_dim] and whose value is the key's first kv_lora_rank columns."""

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        kv_lora_rank: int,
        rope_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        _check_slots(num_slots)
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.num_kv_heads = 1
        self.head_dim = kv_lora_rank  # the value's size, as attention backends count it
        self.rope_dim = rope_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_layers, num_slots + 1, 1, kv_lora_rank + rope_dim)
        self._buffer = _zeros(shape, dtype, self.device)
        self.k = [self._buffer[i] for i in range(num_layers)]
        self.v = [self._buffer[i, :, :, :kv_lora_rank] for i in range(num_layers)]

    def write(
        self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None
    ) -> None:
        """Store k [T, 1, kv_lora_rank + rope_dim] (c_kv, then the rotated k_pe) at slots
        loc [T]; the value is k's first columns, so `v` must be None."""
        assert v is None, "a latent pool's value is its key's first kv_lora_rank columns"
        self.k[layer][loc] = k


def _check_slots(num_slots: int) -> None:
    if num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}; raise the KV memory budget")


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = math.prod(shape)
    memory = mmap.mmap(-1, count * torch.empty((), dtype=dtype).element_size())
    return torch.frombuffer(memory, dtype=dtype, count=count).view(shape)  # keeps `memory`
