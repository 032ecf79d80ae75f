"""The gated MLP of the Llama family: down(act(gate(x)) * up(x)), gate and up as one matmul."""

from __future__ import annotations

import torch
from torch import nn

from .activation import SiluAndMul


class GatedMLP(nn.Module):
    """[T, hidden] -> [T, hidden] through `intermediate` features; `act` maps the fused
    [T, 2 * intermediate] (gate | up) projection to [T, intermediate]."""

    def __init__(self, hidden: int, intermediate: int, act: nn.Module | None = None) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.act = SiluAndMul() if act is None else act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))
