"""fuse_elementwise swaps RMSNorm / SiLU-and-mul for the fused Triton kernels without
changing the logits (Llama, and Qwen3 whose q/k norms run per head on strided views).

On the CPU it runs under Triton's interpreter (tests/conftest.py sets it up)."""

import torch
from triton_testing import ON_GPU, one_thread, requires_triton  # noqa: F401

from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.layers.triton_fused import TritonRMSNorm, fuse_elementwise
from lmprog.runtime.models import ModelConfig, load_model


def check_fused_logits(device, dtype, tol):
    for arch, qk_norm in (("llama", False), ("qwen3", True)):
        cfg = ModelConfig(
            arch,
            vocab_size=50,
            hidden_size=32,
            intermediate_size=48,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            max_position=128,
            qk_norm=qk_norm,
        )
        model = load_model(cfg, load_format="dummy", seed=1, device=device, dtype=dtype)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.add_(torch.randn_like(p) * (0.3 if "norm" in name else 0.1))
        table = (torch.arange(2 * 32, dtype=torch.int32) + 1).view(2, 32)
        batch = ForwardBatch.build(
            input_ids=list(range(3, 20)),
            out_cache_loc=list(range(1, 18)),
            req_pool_indices=[0, 1],
            seq_lens=[12, 5],
            extend_lens=[12, 5],
            req_to_token=table,
            logits_indices=range(17),
            device=device,
        )
        with torch.inference_mode():
            want = model(batch, KVPool.for_model(cfg, 64, model.dtype, device))
            params = dict(model.named_parameters())
            assert fuse_elementwise(model) == 3 * 2 + 1 + 4 * qk_norm  # per layer: 2 norms, 1 act
            assert dict(model.named_parameters()).keys() == params.keys()
            assert any(isinstance(m, TritonRMSNorm) for m in model.modules())
            got = model(batch, KVPool.for_model(cfg, 64, model.dtype, device))
        diff = (got - want).abs().max().item()
        assert diff <= tol * want.abs().max().item(), (arch, diff)


@requires_triton
def test_fused_layers_keep_the_logits(one_thread):
    if ON_GPU:
        check_fused_logits("cuda", "bfloat16", 3e-2)
    else:
        check_fused_logits("cpu", "float32", 1e-5)
