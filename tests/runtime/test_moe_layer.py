"""The sparse MoE block against transformers' own blocks of the same weights: Mixtral's,
Qwen2-MoE's (shared expert behind a sigmoid gate) and DeepSeek-V2's (shared experts,
group-limited routing, routed_scaling_factor), on the reference path and through the Triton
kernel (Triton's CPU interpreter here, the GPU where there is one)."""

from __future__ import annotations

import pytest
import torch
from triton_testing import ON_GPU, requires_triton

from lmprog.runtime.layers.moe import SparseMoE, select_experts

torch.set_num_threads(1)
H, INTER, E = 32, 24, 8


def _randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module.eval()


def _ours_from(hf_block, **kwargs) -> SparseMoE:
    """Our block holding the weights of a transformers MoE block (same stacked layout)."""
    ours = SparseMoE(H, INTER, E, **kwargs)
    shared = getattr(hf_block, "shared_expert", None) or getattr(hf_block, "shared_experts", None)
    with torch.no_grad():
        ours.gate.weight.copy_(hf_block.gate.weight)
        ours.experts.gate_up_proj.copy_(hf_block.experts.gate_up_proj)
        ours.experts.down_proj.copy_(hf_block.experts.down_proj)
        if shared is not None:
            ours.shared_experts.gate_up_proj.weight.copy_(
                torch.cat([shared.gate_proj.weight, shared.up_proj.weight])
            )
            ours.shared_experts.down_proj.weight.copy_(shared.down_proj.weight)
        if getattr(hf_block, "shared_expert_gate", None) is not None:
            ours.shared_expert_gate.weight.copy_(hf_block.shared_expert_gate.weight)
    return ours.eval()


def _mixtral():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(hidden_size=H, intermediate_size=INTER, num_local_experts=E)
    return _randomize(MixtralSparseMoeBlock(cfg)), {"top_k": 2}


def _qwen2_moe():
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    cfg = Qwen2MoeConfig(
        hidden_size=H,
        moe_intermediate_size=INTER,
        shared_expert_intermediate_size=40,
        num_experts=E,
        num_experts_per_tok=3,
    )
    kwargs = dict(top_k=3, norm_topk_prob=False, shared_intermediate_size=40)
    return _randomize(Qwen2MoeSparseMoeBlock(cfg)), {**kwargs, "shared_expert_gate": True}


def _deepseek_v2():
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe

    cfg = DeepseekV2Config(
        hidden_size=H,
        moe_intermediate_size=INTER,
        n_routed_experts=E,
        n_shared_experts=2,
        num_experts_per_tok=3,
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
    )
    kwargs = dict(top_k=3, norm_topk_prob=False, n_group=4, topk_group=2)
    kwargs.update(routed_scaling_factor=2.5, shared_intermediate_size=2 * INTER)
    return _randomize(DeepseekV2Moe(cfg)), kwargs


BLOCKS = {"mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "deepseek_v2": _deepseek_v2}


def _check(kind: str, use_kernel: bool) -> None:
    """fp32 on the CPU (the kernel through Triton's interpreter); the kernel on a GPU runs
    its fp32 products in TF32, hence the looser tolerance there."""
    hf, kwargs = BLOCKS[kind]()
    ours = _ours_from(hf, **kwargs)
    ours.experts.use_kernel = use_kernel
    x = torch.randn(1, 13, H, generator=torch.Generator().manual_seed(1))
    tol = 1e-5
    if use_kernel and ON_GPU:
        hf, ours, x, tol = hf.cuda(), ours.cuda(), x.cuda(), 5e-3
    with torch.inference_mode():
        want = hf(x)[0]
        got = ours(x[0])
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_sparse_moe_matches_transformers(kind):
    _check(kind, use_kernel=False)


@requires_triton
@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_sparse_moe_through_the_kernel_matches_transformers(kind):
    _check(kind, use_kernel=True)


def test_group_limited_routing_only_picks_from_the_best_groups():
    # experts 0-3 | 4-7 | 8-11: group 1 holds the best expert, group 2 the larger total
    logits = torch.tensor([[0.0, 0, 0, 0, 5, 1, 0.5, 0, 4, 3.9, 3.8, 0]])
    probs = logits.softmax(-1)[0]
    w, ids = select_experts(logits, 3, renormalize=False, n_group=3, topk_group=1)
    assert ids[0].tolist() == [4, 5, 6]  # groups ranked by their best expert, not their sum
    torch.testing.assert_close(w[0], probs[[4, 5, 6]])  # not renormalized
    w, ids = select_experts(logits, 3, renormalize=True, n_group=3, topk_group=2, scaling=2.0)
    assert ids[0].tolist() == [4, 8, 9]
    torch.testing.assert_close(w[0], 2.0 * probs[[4, 8, 9]] / probs[[4, 8, 9]].sum())
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    _, ids = select_experts(logits, 3, renormalize=False)  # no groups: the global top 3
    assert ids[0].tolist() == [4, 8, 9]
    _, ids = select_experts(logits, 3, renormalize=False, n_group=3, topk_group=3)
    assert ids[0].tolist() == [4, 8, 9]  # every group kept: the same


def test_bad_routing_arguments_are_refused():
    with pytest.raises(ValueError, match="top_k must be in"):
        SparseMoE(H, INTER, 4, top_k=5)
    with pytest.raises(ValueError, match="n_group"):
        SparseMoE(H, INTER, 6, top_k=2, n_group=4, topk_group=1)
    with pytest.raises(ValueError, match="exceeds the experts"):
        SparseMoE(H, INTER, 8, top_k=3, n_group=4, topk_group=1)
    with pytest.raises(ValueError, match="shared_expert_gate needs"):
        SparseMoE(H, INTER, 8, top_k=2, shared_expert_gate=True)
