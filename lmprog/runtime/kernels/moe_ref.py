"""Plain-PyTorch reference of the fused mixture-of-experts MLP (no triton).

Semantics the kernel (`moe.fused_moe`) must match, for token t and its k-th choice:

    e      = topk_ids[t, k]
    act    = silu(x[t] @ w13[e, :I].T) * (x[t] @ w13[e, I:].T)     rounded to x's dtype
    out[t] = sum_k topk_weights[t, k] * (act @ w2[e].T)

w13 is [E, 2I, H] (each expert's gate rows, then its up rows), w2 is [E, H, I]. Loops over the
experts that have tokens (shapes depend on the routing): the CPU path of the MoE layer and the
kernel tests' reference, not a GPU path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fused_moe_ref(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """[T, H] in x's dtype; products in fp32, the activation rounded to x's dtype as the
    kernel stores it between its two GEMMs."""
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(topk_ids).tolist():
        rows, slot = (topk_ids == e).nonzero(as_tuple=True)
        xe = x[rows].float()
        gate_up = xe @ w13[e].float().t()
        act = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]).to(x.dtype).float()
        y = act @ w2[e].float().t()
        out.index_add_(0, rows, y * topk_weights[rows, slot].float().unsqueeze(1))
    return out.to(x.dtype)
