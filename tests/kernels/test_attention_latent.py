"""Latent attention (DeepSeek-V2's absorbed MLA) in the hybrid kernels against the PyTorch
reference: one latent head [c_kv | k_pe] per slot, values its first columns, queries
[q_nope W_uk | q_pe]; the head passed as a stride-0 view of several (as the Triton backend
does past 16 query heads). CPU interpreter or GPU."""

from __future__ import annotations

import pytest
import torch
from attention_batches import make_batch
from kernel_helpers import DEVICE, DTYPES, ON_GPU, rel_err, requires_kernels, tolerance

pytest.importorskip("triton", reason="triton is not installed: pip install triton==3.9.0")
pytestmark = requires_kernels

from lmprog.runtime.kernels.attention import (  # noqa: E402
    FP32_LATENT_MAX_GROUP,
    decode_attention,
    hybrid_attention,
)
from lmprog.runtime.kernels.attention_plan import plan_attention  # noqa: E402
from lmprog.runtime.kernels.attention_ref import hybrid_attention_ref  # noqa: E402

RANK, ROPE = (512, 64) if ON_GPU else (32, 16)  # kv_lora_rank, qk_rope_head_dim
SCALE = 16 if ON_GPU else 1
# (seq_len, extend_len): prefill, decode, chunk over a prefix, verify-like, a zero-token row
HYBRID = [(23, 23), (40, 1), (30, 9), (12, 3), (5, 0)]


def _latent_batch(seq, ext, heads, dtype):
    """make_batch's slots and rows, with a latent pool: values are the keys' first RANK
    columns (a view, as kv_pool.LatentKVPool lays them out)."""
    b = make_batch(seq, ext, heads, 1, RANK + ROPE, dtype, DEVICE)
    return b, b.k_buffer[..., :RANK]


def _run(batch, v_buffer, views, sm_scale, **plan_kwargs):
    heads = batch.q.shape[1]
    plan = plan_attention(*batch.tensors, num_q_heads=heads, num_kv_heads=views,
                          head_dim=RANK, **plan_kwargs)  # fmt: skip
    k = batch.k_buffer.expand(-1, views, -1)
    out = torch.full((batch.q.shape[0], heads, RANK), float("nan"), dtype=batch.q.dtype,
                     device=DEVICE)  # fmt: skip
    return hybrid_attention(batch.q, k, v_buffer.expand(-1, views, -1), plan,
                            sm_scale=sm_scale, out=out)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,views", [(4, 1), (32, 2)])
def test_latent_hybrid_batch_matches_reference(dtype, heads, views):
    seq = [s * SCALE for s, _ in HYBRID]
    ext = [e if e <= 3 else e * SCALE for _, e in HYBRID]
    batch, v = _latent_batch(seq, ext, heads, dtype)
    want = hybrid_attention_ref(batch.q, batch.k_buffer, v, *batch.tensors, sm_scale=0.11)
    assert want.shape == (sum(ext), heads, RANK)
    if ON_GPU and dtype == torch.float32 and heads // views > FP32_LATENT_MAX_GROUP:
        with pytest.raises(ValueError, match="fp32 latent attention on CUDA"):
            _run(batch, v, views, 0.11, split_max_tokens=3, num_kv_splits=3)
        return
    got = _run(batch, v, views, 0.11, split_max_tokens=3, num_kv_splits=3)
    assert rel_err(got, want) < tolerance(dtype)


def test_rope_columns_count():
    """The scores use every key column: changing only k_pe of the cached keys changes the
    output (and the reference agrees), so the RoPE half is not dropped."""
    batch, v = _latent_batch([20], [1], 4, torch.float32)
    before = _run(batch, v, 1, 0.2)
    batch.k_buffer[1:, :, RANK:] *= 3
    after = _run(batch, v, 1, 0.2)
    want = hybrid_attention_ref(batch.q, batch.k_buffer, v, *batch.tensors, sm_scale=0.2)
    assert rel_err(after, want) < tolerance(torch.float32)
    assert rel_err(before, after) > 1e-2


@pytest.mark.parametrize("num_kv_splits", [1, 4])
def test_latent_decode_split_kv(num_kv_splits):
    seq = [s * SCALE for s in (33, 1, 17)]
    dtype = torch.bfloat16 if ON_GPU else DTYPES[-1]  # fp32 takes 4 heads a view on CUDA
    batch, v = _latent_batch(seq, [1, 1, 1], 16, dtype)
    got = decode_attention(batch.q, batch.k_buffer, v, *batch.tensors[:3], sm_scale=0.3,
                           num_kv_splits=num_kv_splits)  # fmt: skip
    want = hybrid_attention_ref(batch.q, batch.k_buffer, v, *batch.tensors, sm_scale=0.3)
    assert got.shape == (3, 16, RANK)
    assert rel_err(got, want) < tolerance(dtype)


def test_latent_inputs_are_checked():
    batch, v = _latent_batch([8, 4], [8, 1], 4, DTYPES[0])
    plan = plan_attention(*batch.tensors, num_q_heads=4, num_kv_heads=1, head_dim=RANK)
    with pytest.raises(ValueError, match="k_buffer must be"):  # keys narrower than q
        hybrid_attention(batch.q, batch.k_buffer[..., :-2], v, plan)
    with pytest.raises(ValueError, match="v_buffer must be"):  # values not head_dim wide
        hybrid_attention(batch.q, batch.k_buffer, batch.k_buffer, plan)
    with pytest.raises(ValueError, match="out must have shape"):
        hybrid_attention(batch.q, batch.k_buffer, v, plan, out=torch.empty_like(batch.q))


def test_latent_warm_up_runs_every_variant():
    """What the Triton backend's warm_up (at engine start) hands the kernels for 16
    latent-attention heads: keys RANK + ROPE wide, values their first RANK columns."""
    from lmprog.runtime.kernels.attention import warm_up

    dtype = torch.bfloat16 if ON_GPU else torch.float32  # fp32 takes 4 heads a view on CUDA
    k = torch.randn(65, 1, RANK + ROPE, device=DEVICE, dtype=dtype)
    table = torch.arange(1, 65, dtype=torch.int32, device=DEVICE).view(1, 64)
    assert warm_up(k, k[..., :RANK], table, num_q_heads=16) >= 4
