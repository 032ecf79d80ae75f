"""The pieces of multi-head latent attention below the model: YaRN RoPE (against transformers'
own computation), the latent KV pool (layout, bytes per token, budget), and both attention
backends in latent mode over the paged pool against the kernels' plain reference."""

from __future__ import annotations

import pytest
import torch
from triton_testing import requires_triton

from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool, LatentKVPool
from lmprog.runtime.kernels.attention_ref import hybrid_attention_ref
from lmprog.runtime.layers.attention import create_attention_backend
from lmprog.runtime.layers.rotary import RotaryEmbedding, inv_freq
from lmprog.runtime.models import PRESETS, ModelConfig, config_from_hf

torch.set_num_threads(1)

YARN = [  # DeepSeek-V2-Lite's, and one with mscale != mscale_all_dim and a short context
    dict(factor=40.0, mscale=0.707, mscale_all_dim=0.707, original_max_position_embeddings=4096),
    dict(factor=4.0, mscale=1.0, mscale_all_dim=0.5, original_max_position_embeddings=64),
]


@pytest.mark.parametrize("params", YARN)
def test_yarn_frequencies_and_scales_match_transformers(params):
    from transformers import DeepseekV2Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import yarn_apply_mscale

    rope = {"rope_type": "yarn", "rope_theta": 500.0, "beta_fast": 32, "beta_slow": 1, **params}
    hf = DeepseekV2Config(hidden_size=64, num_attention_heads=4, qk_nope_head_dim=8,
                          qk_rope_head_dim=16, max_position_embeddings=256 * 1024,
                          rope_parameters=dict(rope))  # fmt: skip
    want_freq, want_factor = ROPE_INIT_FUNCTIONS["yarn"](hf)
    ours = config_from_hf(hf.to_dict())
    s = ours.rope_scaling
    assert s.rope_type == "yarn" and s.factor == params["factor"]
    assert torch.equal(inv_freq(16, ours.rope_theta, s), want_freq)
    assert s.cos_sin_scale == pytest.approx(want_factor, rel=1e-12)
    assert ours.mla_softmax_scale == pytest.approx(
        yarn_apply_mscale(hf.rope_parameters, 24**-0.5), rel=1e-12
    )
    cos, sin = RotaryEmbedding(16, ours.rope_theta, s).cos_sin(torch.tensor([0, 5]), torch.float32)
    assert cos[0].max().item() == pytest.approx(want_factor)  # cos and sin carry the factor
    assert sin.abs().max().item() <= want_factor + 1e-6


def _latent_config(layers=2, rank=32, rope=16) -> ModelConfig:
    return ModelConfig("deepseek_v2", vocab_size=50, hidden_size=32, intermediate_size=48,
                       num_layers=layers, num_heads=4, num_kv_heads=4, head_dim=8 + rope,
                       max_position=256, kv_lora_rank=rank, qk_nope_head_dim=8,
                       qk_rope_head_dim=rope, v_head_dim=8)  # fmt: skip


def test_latent_pool_layout_bytes_and_budget():
    cfg = _latent_config(layers=3)
    pool = KVPool.for_model(cfg, 10, torch.float32, "cpu")
    assert isinstance(pool, LatentKVPool)
    assert pool.k[1].shape == (11, 1, 48) and pool.v[1].shape == (11, 1, 32)
    assert KVPool.bytes_per_token(cfg, torch.bfloat16) == 3 * 48 * 2  # c_kv + k_pe per layer
    assert pool.nbytes == 11 * KVPool.bytes_per_token(cfg, torch.float32)
    assert KVPool.size_for_budget(11 * 3 * 48 * 4, cfg, torch.float32) == 10
    row = torch.arange(48.0).view(1, 1, 48)
    pool.write(1, torch.tensor([4]), row)
    assert torch.equal(pool.k[1][4], row[0]) and torch.equal(pool.v[1][4], row[0, :, :32])
    assert pool.k[0].abs().sum() == 0 and pool.k[2].abs().sum() == 0  # other layers untouched
    with pytest.raises(AssertionError):
        pool.write(0, torch.tensor([1]), row, row[..., :32])
    # V2-Lite (27 layers, kv_lora_rank 512, RoPE key 64) in bf16: 31,104 bytes a token
    assert KVPool.bytes_per_token(PRESETS["deepseek-v2-lite"], torch.bfloat16) == 27 * 576 * 2


def _paged_batch(seq_lens, extend_lens, num_slots=300, width=64):
    g = torch.Generator().manual_seed(0)
    table = (torch.randperm(num_slots, generator=g)[: len(seq_lens) * width] + 1).int()
    table = table.view(len(seq_lens), width)
    locs = [table[r, s - e : s] for r, (s, e) in enumerate(zip(seq_lens, extend_lens))]
    return ForwardBatch.build(
        input_ids=[0] * sum(extend_lens),
        out_cache_loc=torch.cat(locs),
        req_pool_indices=range(len(seq_lens)),
        seq_lens=seq_lens,
        extend_lens=extend_lens,
        req_to_token=table,
        logits_indices=range(sum(extend_lens)),
    )


def _backend_vs_reference(name, heads, rank=32, rope=16):
    """Random latent rows in the pool (the step's new ones written by the backend, rotated),
    a hybrid batch (prefill, chunk over a prefix, two decodes): the backend's output equals
    the reference over the pool it wrote."""
    seq, ext = [13, 20, 9, 31], [13, 6, 1, 1]
    batch = _paged_batch(seq, ext)
    pool = LatentKVPool(300, 1, rank, rope, torch.float32, "cpu")
    pool.k[0].normal_(generator=torch.Generator().manual_seed(1))
    att = create_attention_backend(name, heads, 1, rank, "cpu", rope_dim=rope, scale=0.2)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(sum(ext), heads, rank + rope, generator=g)
    latent = torch.randn(sum(ext), 1, rank + rope, generator=g)
    cos, sin = RotaryEmbedding(rope, 100.0).cos_sin(batch.positions, torch.float32)
    q = att.rotate_and_store_latent(q, latent, cos, sin, 0, pool, batch.out_cache_loc)
    assert torch.equal(pool.k[0][batch.out_cache_loc], latent)  # written, rotated in place
    got = att.forward(q, None, None, 0, pool, att.plan(batch))
    want = hybrid_attention_ref(q, pool.k[0], pool.v[0], batch.req_to_token,
                                batch.req_pool_indices, batch.seq_lens, batch.extend_lens,
                                batch.extend_start_loc, sm_scale=0.2)  # fmt: skip
    assert got.shape == (sum(ext), heads, rank)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_torch_backend_latent_attention_matches_reference():
    _backend_vs_reference("torch", heads=4)


@requires_triton
@pytest.mark.parametrize("heads", [4, 32])  # 32: the latent head as two views of 16 heads
def test_triton_backend_latent_attention_matches_reference(heads):
    _backend_vs_reference("triton", heads)
