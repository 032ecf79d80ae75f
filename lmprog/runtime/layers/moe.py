"""The sparse mixture-of-experts MLP block (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2).

    moe = SparseMoE(hidden_size=4096, intermediate_size=14336, num_experts=8, top_k=2)
    y = moe(x)                                   # [T, hidden] -> [T, hidden]

Router, stacked experts (fused Triton kernel on CUDA), optional shared experts; row-wise
and host-sync free, so it runs inside CUDA graphs. Parameters: docs/design/models.md.
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.moe_ref import fused_moe_ref
from .mlp import GatedMLP


def select_experts(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    renormalize: bool,
    n_group: int = 1,
    topk_group: int = 1,
    scaling: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights fp32 [T, top_k], expert ids int32 [T, top_k]) from router logits [T, E].

    Softmax over all experts (fp32), then the top_k: among all experts, or (n_group > 1,
    DeepSeek-V2's group-limited routing) among the experts of the topk_group groups whose
    best expert scores highest, the E experts split in n_group consecutive groups. The
    chosen probabilities renormalized to sum 1 when `renormalize` (Mixtral, Qwen3-MoE's
    norm_topk_prob), then multiplied by `scaling` (DeepSeek's routed_scaling_factor)."""
    scores = router_logits.float().softmax(dim=-1)
    if n_group > 1 and topk_group < n_group:
        tokens, experts = scores.shape
        best = scores.view(tokens, n_group, experts // n_group).amax(dim=-1)
        chosen = best.topk(topk_group, dim=-1).indices
        keep = torch.zeros_like(best, dtype=torch.bool).scatter_(1, chosen, True)
        scores = scores.masked_fill(~keep.repeat_interleave(experts // n_group, dim=1), 0.0)
    weights, ids = scores.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if scaling != 1.0:
        weights = weights * scaling
    return weights, ids.to(torch.int32)


class StackedExperts(nn.Module):
    """E gated SiLU MLPs of `intermediate` features, stacked: one tensor per projection.

    `use_kernel`: None picks the Triton kernel for CUDA inputs and the reference loop for
    others; True forces the kernel (CPU tests under Triton's interpreter), False the loop."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.use_kernel: bool | None = None

    def forward(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """[T, H] -> [T, H]: sum over k of topk_weights[t, k] * expert topk_ids[t, k](x[t])."""
        if self.use_kernel or (self.use_kernel is None and x.is_cuda):
            from ..kernels.moe import fused_moe

            x = x if x.stride(-1) == 1 else x.contiguous()
            return fused_moe(x, self.gate_up_proj, self.down_proj, topk_weights, topk_ids)
        return fused_moe_ref(x, self.gate_up_proj, self.down_proj, topk_weights, topk_ids)

    def extra_repr(self) -> str:
        e, two_i, h = self.gate_up_proj.shape
        return f"num_experts={e}, hidden={h}, intermediate={two_i // 2}"


class SparseMoE(nn.Module):
    """Router, top-k routed experts and optional shared experts (docs/design/models.md).

    intermediate_size: each routed expert's; shared_intermediate_size: the shared experts'
    together (0: none; DeepSeek's n_shared_experts * moe_intermediate_size);
    shared_expert_gate: scale the shared output by sigmoid(x . w) (Qwen2-MoE)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        *,
        norm_topk_prob: bool = True,
        n_group: int = 1,
        topk_group: int = 1,
        routed_scaling_factor: float = 1.0,
        shared_intermediate_size: int = 0,
        shared_expert_gate: bool = False,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        if num_experts % n_group or not 1 <= topk_group <= n_group:
            raise ValueError(
                f"group-limited routing needs n_group ({n_group}) dividing num_experts "
                f"({num_experts}) and 1 <= topk_group ({topk_group}) <= n_group"
            )
        if top_k > topk_group * (num_experts // n_group):
            raise ValueError(f"top_k={top_k} exceeds the experts of {topk_group} groups")
        if shared_expert_gate and not shared_intermediate_size:
            raise ValueError("shared_expert_gate needs shared experts (shared_intermediate_size)")
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.n_group, self.topk_group = n_group, topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = StackedExperts(num_experts, hidden_size, intermediate_size)
        self.shared_experts = (
            GatedMLP(hidden_size, shared_intermediate_size) if shared_intermediate_size else None
        )
        self.shared_expert_gate = (
            nn.Linear(hidden_size, 1, bias=False) if shared_expert_gate else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = select_experts(
            self.gate(x),
            self.top_k,
            renormalize=self.norm_topk_prob,
            n_group=self.n_group,
            topk_group=self.topk_group,
            scaling=self.routed_scaling_factor,
        )
        out = self.experts(x, weights, ids)
        if self.shared_experts is not None:
            shared = self.shared_experts(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out
