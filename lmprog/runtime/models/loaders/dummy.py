"""Random weights for benchmarks: generated on the target device, scaled to stay finite.

Normal(0, 0.02) everywhere, with the residual-branch outputs (o_proj, down_proj) shrunk by
1/sqrt(2 * num_layers) as in GPT-2, so the residual stream does not grow with depth; norms 1
(a vision tower's LayerNorms: weight 1, bias 0).
"""

from __future__ import annotations

import math

import torch
from torch import nn


@torch.no_grad()
def init_dummy_weights(model: nn.Module, num_layers: int, seed: int = 0) -> None:
    generators: dict[torch.device, torch.Generator] = {}
    for name, p in model.named_parameters():
        module = name.rsplit(".", 2)[-2] if name.count(".") else ""
        if name.endswith("norm.weight") or ("norm" in module and name.endswith(".weight")):
            p.fill_(1.0)
            continue
        if "norm" in module and name.endswith(".bias"):
            p.zero_()
            continue
        residual_out = "o_proj" in name or "down_proj" in name
        std = 0.02 / math.sqrt(2 * num_layers) if residual_out else 0.02
        g = generators.get(p.device)
        if g is None:
            g = generators.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
        p.normal_(0.0, std, generator=g)
