"""Many LoRA adapters served together, each request with its own or none (S-LoRA / Punica).

Modules: adapter (read PEFT folders), pool (device memory of max_loras_per_batch adapters),
layers (LoraLinear), ops (a step's layout, the PyTorch products), manager (LoraManager).
Design: docs/design/lora.md.
"""

from .adapter import SUPPORTED_MODULES, LoraAdapter, read_adapter
from .manager import LoraManager

__all__ = ["SUPPORTED_MODULES", "LoraAdapter", "LoraManager", "read_adapter"]
