"""KVPool: the token-granular key/value memory every attention backend reads.

    k[layer], v[layer]: [num_slots + 1, num_kv_heads, head_dim]   slot 0 is a dummy

`LatentKVPool` keeps one row per token for latent attention (DeepSeek-V2); an FP8 pool
stores e4m3 K/V with per-layer scales. The pool owns memory only; the allocator decides
which slot is free. `for_model`, `bytes_per_token`, `size_for_budget` pick the layout.
Design: docs/design/kv-cache.md.
"""

from __future__ import annotations

import math
import mmap
from typing import TYPE_CHECKING

import torch

from ..config import KV_CACHE_DTYPES
from ..kernels.fp8_ref import cast_e4m3
from ..models.config import ConfiguredModel, local_config

if TYPE_CHECKING:
    from ..models.config import ModelConfig
    from .layer_loads import LayerLoads

FP8_KV = torch.float8_e4m3fn


def kv_storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """What the pool stores for a `kv_cache_dtype` setting ("auto": the model's dtype)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    return model_dtype if kv_cache_dtype == "auto" else FP8_KV


def dequantize_kv(t: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """K or V rows read from a pool, in `dtype` (an FP8 pool's values times its scale)."""
    if t.dtype == dtype:
        return t
    t = t.to(dtype)
    return t if scale == 1.0 else t * scale


class KVPool:
    """Per-layer K/V buffers in `dtype` (the model's, or FP8) on the model's device
    (zero-initialised; on the CPU an anonymous mapping, whose pages the kernel zeroes when
    first touched: the pool costs memory as it fills, not a second of page faults at
    start-up). compute_dtype: the model's dtype (default `dtype`); scales: an FP8 pool's
    ((k scale per layer), (v scale per layer)), default 1.0."""

    k_scales: tuple[float, ...] = ()
    v_scales: tuple[float, ...] = ()
    # the host KV tier's copies still under way on CUDA (host_kv.py); None: none can be
    loads: LayerLoads | None = None

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        *,
        compute_dtype: torch.dtype | None = None,
        scales: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
    ) -> None:
        _check_slots(num_slots)
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.compute_dtype = dtype if compute_dtype is None else compute_dtype
        self.device = torch.device(device)
        if dtype == FP8_KV:
            k_scales, v_scales = scales or ((1.0,) * num_layers,) * 2
            if len(k_scales) != num_layers or len(v_scales) != num_layers:
                raise ValueError(f"KV-cache scales must give one value per layer ({num_layers})")
            self.k_scales, self.v_scales = tuple(k_scales), tuple(v_scales)
        shape = (num_layers, 2, num_slots + 1, num_kv_heads, head_dim)
        self._buffer = _zeros(shape, dtype, self.device)
        self.k = [self._buffer[i, 0] for i in range(num_layers)]
        self.v = [self._buffer[i, 1] for i in range(num_layers)]

    @classmethod
    def for_model(
        cls,
        config: ModelConfig,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device | str,
        *,
        kv_cache_dtype: str = "auto",
        scales: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
    ) -> KVPool:
        """The pool of `config`'s layout (a LatentKVPool for latent attention) for a model in
        `dtype`, storing kv_cache_dtype ("auto": dtype; "fp8_e4m3" with its scales)."""
        storage = kv_storage_dtype(kv_cache_dtype, dtype)
        if storage != dtype:
            if config.kv_lora_rank:
                raise ValueError("an FP8 KV cache is not supported with latent attention")
            return cls(num_slots, config.num_layers, config.num_kv_heads, config.head_dim,
                       storage, device, compute_dtype=dtype, scales=scales)  # fmt: skip
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

    def scales(self, layer: int) -> tuple[float, float]:
        """(k, v) scale of the layer: stored = value / scale (1.0 unless FP8)."""
        if not self.k_scales:
            return 1.0, 1.0
        return self.k_scales[layer], self.v_scales[layer]

    def wait_layer(self, layer: int) -> None:
        """Before a forward pass writes or reads `layer`: its current stream waits for the
        host tier's copies into that layer (layer-wise loading; a no-op without any)."""
        if self.loads is not None:
            self.loads.wait(layer)

    def fence_loads(self) -> None:
        """Before anything but a layer-by-layer forward pass uses the pool: wait for every
        copy the host tier has under way (a no-op without any)."""
        if self.loads is not None:
            self.loads.fence()

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, num_kv_heads, head_dim] of layer `layer` at slots loc [T]."""
        if self.dtype == FP8_KV:
            k_scale, v_scale = self.scales(layer)
            k, v = cast_e4m3(k, k_scale), cast_e4m3(v, v_scale)
        self.k[layer][loc] = k
        self.v[layer][loc] = v

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """For every layer, slot dst[i] gets slot src[i]'s K and V (src, dst: int64 [N] on the
        pool's device; every src is read before any dst is written)."""
        self._buffer[:, :, dst] = self._buffer[:, :, src]  # [layers, k|v, slots, ...]


class LatentKVPool(KVPool):
    """The latent-attention layout (docs/design/kv-cache.md): one "KV head" per layer whose key is
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
        self.dtype = self.compute_dtype = dtype
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

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """As KVPool.copy_slots (the value is part of the key)."""
        self._buffer[:, dst] = self._buffer[:, src]  # [layers, slots, 1, ...]


def _check_slots(num_slots: int) -> None:
    if num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}; raise the KV memory budget")


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = math.prod(shape)
    memory = mmap.mmap(-1, count * torch.empty((), dtype=dtype).element_size())
    return torch.frombuffer(memory, dtype=dtype, count=count).view(shape)  # keeps `memory`


# KV pool size when max_total_tokens is not given: on a GPU, `gpu_memory_fraction` of the
# memory free after the weights are loaded; on a CPU this budget (memory the pool takes as it
# fills: raise it with max_total_tokens for long workloads).
CPU_KV_BUDGET_BYTES = 1 << 30


def kv_slots(
    model: ConfiguredModel,
    max_total_tokens: int | None,
    gpu_memory_fraction: float,
    kv_cache_dtype: str = "auto",
) -> int:
    """How many token slots the KV pool gets (an FP8 pool's slots cost 1 byte a value)."""
    if max_total_tokens is not None:
        if (
            isinstance(max_total_tokens, bool)
            or not isinstance(max_total_tokens, int)
            or max_total_tokens < 2
        ):
            raise ValueError(f"max_total_tokens must be an int >= 2, got {max_total_tokens!r}")
        return max_total_tokens
    param = next(model.parameters())
    if param.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(param.device)
        budget = int(free * gpu_memory_fraction)
    else:
        budget = CPU_KV_BUDGET_BYTES
    storage = kv_storage_dtype(kv_cache_dtype, param.dtype)
    return KVPool.size_for_budget(budget, local_config(model), storage)
