"""Attention backends by name, imported lazily (the Triton one needs a GPU and triton).

create_attention_backend("torch", num_heads, num_kv_heads, head_dim, device)
register_attention_backend("mine", "my_package.attention:MyBackend")
"""

from __future__ import annotations

import importlib

import torch

from .base import AttentionBackend

_BACKENDS: dict[str, str] = {
    "torch": "lmprog.runtime.layers.attention.torch_ref:TorchAttentionBackend",
    "triton": "lmprog.runtime.layers.attention.triton_backend:TritonAttentionBackend",
}


def register_attention_backend(name: str, target: str) -> None:
    """Make `name` resolve to the AttentionBackend subclass at "module:ClassName"."""
    if ":" not in target:
        raise ValueError(f"target must be 'module:ClassName', got {target!r}")
    _BACKENDS[name] = target


def available_attention_backends() -> list[str]:
    return sorted(_BACKENDS)


def attention_backend_class(name: str) -> type[AttentionBackend]:
    if name not in _BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; available: {available_attention_backends()}"
        )
    module, cls_name = _BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    assert issubclass(cls, AttentionBackend), f"{_BACKENDS[name]} is not an AttentionBackend"
    return cls


def create_attention_backend(
    name: str,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    device: torch.device | str,
    *,
    rope_dim: int = 0,
    scale: float | None = None,
) -> AttentionBackend:
    """rope_dim > 0: latent attention (see base.py); scale: the softmax scale."""
    cls = attention_backend_class(name)
    return cls(
        num_heads, num_kv_heads, head_dim, torch.device(device), rope_dim=rope_dim, scale=scale
    )


__all__ = [
    "AttentionBackend",
    "attention_backend_class",
    "available_attention_backends",
    "create_attention_backend",
    "register_attention_backend",
]
