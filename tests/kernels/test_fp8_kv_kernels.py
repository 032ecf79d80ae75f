"""An FP8 (e4m3) KV pool in the Triton kernels: rope_and_store writes it, hybrid attention
reads it (upcast as loaded, the scales folded in), each against its PyTorch reference."""

from __future__ import annotations

import pytest
import torch
from attention_batches import make_batch
from kernel_helpers import DEVICE, DTYPES, ON_GPU, rel_err, requires_kernels, tolerance

pytest.importorskip("triton", reason="triton is not installed: pip install triton==3.9.0")
pytestmark = requires_kernels

from lmprog.runtime.kernels.attention import hybrid_attention  # noqa: E402
from lmprog.runtime.kernels.attention_plan import plan_attention  # noqa: E402
from lmprog.runtime.kernels.attention_ref import hybrid_attention_ref  # noqa: E402
from lmprog.runtime.kernels.fp8_ref import FP8, cast_e4m3  # noqa: E402
from lmprog.runtime.kernels.rope import rope_and_store, rope_and_store_ref  # noqa: E402
from lmprog.runtime.layers.rotary import RotaryEmbedding  # noqa: E402

SCALE = 16 if ON_GPU else 1
HYBRID = [(37, 37), (50, 1), (64, 19), (20, 4), (3, 1)]  # (seq_len, extend_len)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.5, 2.0)])
def test_hybrid_attention_reads_an_fp8_pool(dtype, scales):
    seq = [s * SCALE for s, _ in HYBRID]
    ext = [e if e <= 4 else e * SCALE for _, e in HYBRID]
    b = make_batch(seq, ext, 8, 2, 64 if ON_GPU else 32, dtype, DEVICE)
    k_scale, v_scale = scales
    k8, v8 = cast_e4m3(b.k_buffer, k_scale), cast_e4m3(b.v_buffer, v_scale)
    plan = plan_attention(*b.tensors, num_q_heads=8, num_kv_heads=2, head_dim=b.q.shape[2],
                          split_max_tokens=4, num_kv_splits=3)  # fmt: skip
    assert plan.extend is not None and plan.split is not None  # both launches read FP8
    out = hybrid_attention(b.q, k8, v8, plan, k_scale=k_scale, v_scale=v_scale)
    ref = hybrid_attention_ref(b.q, k8, v8, *b.tensors, k_scale=k_scale, v_scale=v_scale)
    assert out.dtype == dtype
    assert rel_err(out, ref) < tolerance(dtype)
    # and the FP8 pool's attention is close to the full-precision pool's
    full = hybrid_attention_ref(b.q, b.k_buffer, b.v_buffer, *b.tensors)
    assert rel_err(out, full) < 0.08


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_and_store_writes_the_fp8_pool_as_the_reference(dtype):
    t, hq, hk, d = 9, 4, 2, 32
    qkv = torch.randn(t, hq + 2 * hk, d, dtype=dtype, device=DEVICE) * 3
    pos = torch.arange(t, device=DEVICE) * 7
    cos, sin = RotaryEmbedding(d, 10000.0).cos_sin(pos, dtype)
    loc = torch.randperm(20, device=DEVICE)[:t] + 1
    caches = [torch.zeros(21, hk, d, device=DEVICE).to(FP8) for _ in range(4)]
    ref_qkv = qkv.clone()
    rope_and_store(qkv, hq, cos, sin, caches[0], caches[1], loc, k_scale=0.5, v_scale=3.0)
    rope_and_store_ref(ref_qkv, hq, cos, sin, caches[2], caches[3], loc, k_scale=0.5, v_scale=3.0)
    assert rel_err(qkv, ref_qkv) < tolerance(dtype)
    k_rot, v = ref_qkv[:, hq : hq + hk], ref_qkv[:, hq + hk :]
    if dtype == torch.float32 and not ON_GPU:  # same rounding of the rotation: same codes
        assert torch.equal(caches[0].view(torch.uint8), caches[2].view(torch.uint8))
        assert torch.equal(caches[1].view(torch.uint8), caches[3].view(torch.uint8))
    # the stored values are k / 0.5 and v / 3 within e4m3's relative step (2**-4)
    assert rel_err(caches[0][loc].float() * 0.5, k_rot.float()) < 0.04
    assert rel_err(caches[1][loc].float() * 3.0, v.float()) < 0.04
    untouched = torch.ones(21, dtype=torch.bool, device=DEVICE)
    untouched[loc] = False
    assert not caches[0][untouched].float().any()


def test_fp8_pool_dtype_errors():
    b = make_batch([5], [1], 4, 2, 32, DTYPES[0], DEVICE)
    plan = plan_attention(*b.tensors, num_q_heads=4, num_kv_heads=2, head_dim=32)
    with pytest.raises(ValueError, match="same dtype"):
        hybrid_attention(b.q, b.k_buffer.to(FP8), b.v_buffer, plan)
    with pytest.raises(TypeError, match="dtype"):
        hybrid_attention(b.q, b.k_buffer.to(torch.int8), b.v_buffer.to(torch.int8), plan)
