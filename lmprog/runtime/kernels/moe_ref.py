"""Plain-PyTorch reference of the fused mixture-of-experts MLP (no triton): the CPU path of the
MoE layer and the kernel tests' reference; `moe_align_ref` is the kernel's row grouping.
Semantics: docs/design/models.md.
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


def moe_align_ref(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe.moe_align's (sorted_ids, block_experts, num_padded), from a stable sort."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    n, dev = flat.numel(), flat.device
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)  # rows grouped by expert, token order kept
    grouped = flat[order]
    rank = torch.arange(n, device=dev) - (counts.cumsum(0) - counts)[grouped]
    length = n + min(num_experts, n) * (block_m - 1)
    sorted_ids = torch.full((length,), n, dtype=torch.int32, device=dev)
    sorted_ids[(pad_end - padded)[grouped] + rank] = order.to(torch.int32)
    starts = torch.arange(0, length, block_m, device=dev)
    block_experts = torch.searchsorted(pad_end, starts, right=True).clamp_(max=num_experts - 1)
    return sorted_ids, block_experts.to(torch.int32), pad_end[-1:].to(torch.int32)
