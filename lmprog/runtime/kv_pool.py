"""KVPool: the token-granular key/value memory every attention backend reads.

    k[layer]: [num_slots + 1, num_kv_heads, head_dim]     (v[layer] the same)
               ^ slot 0 is a dummy: padding points there, writes to it are harmless
    slots 1..num_slots belong to tokens; req_to_token rows map a request's tokens to slots.

The pool owns memory only; which slot is free is the allocator's business (torch-free).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .models.config import ModelConfig


class KVPool:
    """Per-layer K/V buffers in the model's dtype on the model's device (zero-initialised)."""

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}; raise the KV memory budget")
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_layers, 2, num_slots + 1, num_kv_heads, head_dim)
        self._buffer = torch.zeros(shape, dtype=dtype, device=self.device)
        self.k = [self._buffer[i, 0] for i in range(num_layers)]
        self.v = [self._buffer[i, 1] for i in range(num_layers)]

    @classmethod
    def for_model(
        cls, config: ModelConfig, num_slots: int, dtype: torch.dtype, device: torch.device | str
    ) -> KVPool:
        return cls(
            num_slots, config.num_layers, config.num_kv_heads, config.head_dim, dtype, device
        )

    @staticmethod
    def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
        """K and V of one token over all layers."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize

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
