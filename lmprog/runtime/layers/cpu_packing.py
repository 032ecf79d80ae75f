"""oneDNN-packed bf16 linears for CPU decode, applied to a loaded model from outside.

    model = load_model(dtype="bfloat16")
    pack_linears(model)           # after loading: load_weights no longer applies

Where the CPU cannot run the kernel, the plain bf16 linears stay. Design:
docs/design/quantization.md.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from ..models.llama import LlamaForCausalLM

log = logging.getLogger(__name__)


@functools.cache
def packed_bf16_unsupported() -> str | None:
    """None if this CPU runs oneDNN's packed bf16 linear, else why not (tried once, cached)."""
    ops = torch.ops.mkldnn
    if not (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    ):
        return "this PyTorch has no oneDNN packed linear ops"
    weight = torch.eye(16, dtype=torch.bfloat16, device="cpu")
    x = torch.arange(32, dtype=torch.bfloat16, device="cpu").reshape(2, 16)
    try:
        packed = ops._reorder_linear_weight(weight, None)
        y = ops._linear_pointwise(x, packed, None, "none", [], "")
    except RuntimeError as exc:  # the ops exist, the CPU lacks the instructions they need
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if not torch.equal(y, x):
        return "oneDNN's packed bf16 linear gave wrong results on a test weight"
    return None


def _cpu_capability() -> str:
    get = getattr(torch.backends.cpu, "get_cpu_capability", None)
    return get() if get is not None else "unknown"


def _is_bf16_on_cpu(model: nn.Module) -> bool:
    weight = next(model.parameters())
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16


def can_pack_linears(model: nn.Module) -> bool:
    """True for a bf16 model on a CPU that runs oneDNN's packed bf16 linear."""
    return _is_bf16_on_cpu(model) and packed_bf16_unsupported() is None


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


def pack_linears(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """Swap every nn.Linear of `model` (and a tied output projection) for a PackedLinear.

    On a CPU that cannot run the packed kernel the model is returned unchanged (plain bf16
    linears, the same logits); the log says which path was taken.
    """
    if not _is_bf16_on_cpu(model):
        raise ValueError(
            "packing needs a bfloat16 model on the CPU; load the model with "
            "dtype='bfloat16', device='cpu'"
        )
    why_not = packed_bf16_unsupported()
    if why_not is not None:
        log.info(
            "bf16 linears: plain PyTorch path, not packed (oneDNN's packed bf16 kernel "
            "cannot run here: %s; CPU capability %s)",
            why_not,
            _cpu_capability(),
        )
        return model
    n = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, PackedLinear(child.weight, child.bias))
                n += 1
    if getattr(model, "lm_head", False) is None:  # tied embeddings: pack a copy for the output
        model.lm_head = PackedLinear(model.model.embed_tokens.weight)
        n += 1
    log.info(
        "bf16 linears: oneDNN packed path (%d linears packed; CPU capability %s)",
        n,
        _cpu_capability(),
    )
    return model
