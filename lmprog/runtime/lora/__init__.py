"""Many LoRA adapters served together, each request with its own or none (S-LoRA / Punica).

- `adapter`  PEFT's folder layout read and checked against the model (`read_adapter`)
- `pool`     the device memory of `max_loras_per_batch` adapters, stacked per projection
- `layers`   `LoraLinear` around a loaded model's projections (`attach_lora_`)
- `ops`      a step's tokens grouped by adapter (`plan_lora_step`) and the PyTorch
             implementation of the batched low-rank products (the Triton kernels:
             lmprog.runtime.kernels.lora)
- `manager`  `LoraManager`: adapters by name, LRU paging into the pool, each step's layout

The scheduler runs requests of at most `max_loras_per_batch` adapters at once; the radix
cache keys prefixes by adapter (Req.prefix_key).
"""

from .adapter import SUPPORTED_MODULES, LoraAdapter, read_adapter
from .manager import LoraManager

__all__ = ["SUPPORTED_MODULES", "LoraAdapter", "LoraManager", "read_adapter"]
