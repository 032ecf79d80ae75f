"""oneDNN-packed bf16 linears for CPU decode, applied to a loaded model from outside.

Batch-1 decode on a CPU is bound by reading the weights. In bf16 the weights are half the
bytes, but PyTorch's plain bf16 GEMV is no faster than fp32's; oneDNN's packed bf16 kernel
(AVX512-BF16 / AMX) is. Measured on SmolLM2-135M (1 thread, Xeon with avx512_bf16): fp32
48 ms/step, plain bf16 50, packed bf16 37. Packing fp32 weights does not help.

    model = load_model(dtype="bfloat16")
    if can_pack_linears(model):
        pack_linears(model)       # after loading: load_weights no longer applies
"""

from __future__ import annotations

import torch
from torch import nn


def can_pack_linears(model: nn.Module) -> bool:
    """True for a bf16 model on a CPU whose PyTorch has oneDNN's packed linear ops."""
    weight = next(model.parameters())
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedLinear(nn.Module):
    """y = x @ W.T + b with W pre-packed in oneDNN's blocked layout (any batch size)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(model: nn.Module) -> nn.Module:
    """Swap every nn.Linear of `model` (and a tied output projection) for a PackedLinear."""
    if not can_pack_linears(model):
        raise ValueError("packing needs a bfloat16 model on the CPU and a PyTorch built with "
                         "oneDNN; load the model with dtype='bfloat16', device='cpu'")
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, PackedLinear(child.weight, child.bias))
    if getattr(model, "lm_head", False) is None:  # tied embeddings: pack a copy for the output
        model.lm_head = PackedLinear(model.model.embed_tokens.weight)
    return model
