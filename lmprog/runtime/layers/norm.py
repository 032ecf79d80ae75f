"""RMSNorm, computed in fp32 and cast back (as transformers does, so bf16 logits match)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """y = x / rms(x) * weight over the last dimension; works on [..., dim] (also per head).

    With a residual stream: `norm(x, residual)` returns (norm(x + residual), x + residual), so
    a decoder layer's residual add travels with the next norm (one kernel when fused)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        if residual is not None:
            total = x + residual
            return self._norm(total), total
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        y = F.rms_norm(x.float(), self.weight.shape, eps=self.eps)
        return self.weight * y.to(x.dtype)
