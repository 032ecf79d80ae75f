import logging
import math

import pytest
import torch

from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.layers.attention import (
    AttentionBackend,
    available_attention_backends,
    create_attention_backend,
    register_attention_backend,
)
from lmprog.runtime.layers.norm import RMSNorm
from lmprog.runtime.layers.rotary import RotaryEmbedding, inv_freq
from lmprog.runtime.models import RopeScaling

torch.set_num_threads(1)
LLAMA3 = RopeScaling(
    "llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=32
)


# ------------------------------------------------------------------ rotary and norm vs transformers


def _hf_rope(head_dim, theta, rope_parameters, positions, q):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_parameters={"rope_theta": theta, **rope_parameters},
    )
    cos, sin = LlamaRotaryEmbedding(cfg)(q, positions[None])
    # transformers wants [batch, heads, seq, dim]
    out, _ = apply_rotary_pos_emb(q.transpose(0, 1)[None], q.transpose(0, 1)[None], cos, sin)
    return out[0].transpose(0, 1)


@pytest.mark.parametrize(
    "scaling,hf_params",
    [
        (None, {"rope_type": "default"}),
        (RopeScaling("linear", factor=2.5), {"rope_type": "linear", "factor": 2.5}),
        (
            LLAMA3,
            {
                "rope_type": "llama3",
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ],
)
def test_rotary_matches_transformers(scaling, hf_params):
    head_dim, theta = 16, 10000.0
    positions = torch.tensor([0, 1, 5, 17, 100, 1000, 4000])
    q = torch.randn(len(positions), 3, head_dim, generator=torch.Generator().manual_seed(0))
    rope = RotaryEmbedding(head_dim, theta, scaling)
    ours = rope.rotate(q, *rope.cos_sin(positions, torch.float32))
    ref = _hf_rope(head_dim, theta, hf_params, positions, q)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-5)


def test_llama3_scaling_touches_every_band_and_equals_its_freq_factor_form():
    base, scaled = inv_freq(16, 10000.0, None), inv_freq(16, 10000.0, LLAMA3)
    ratio = base / scaled
    assert ratio[0] == 1.0 and ratio[-1] == pytest.approx(4.0)  # short kept, long / factor
    assert ((ratio > 1.0) & (ratio < 4.0)).any()  # a blended middle band
    as_factors = RopeScaling("freq_factors", factors=tuple(ratio.tolist()))
    torch.testing.assert_close(inv_freq(16, 10000.0, as_factors), scaled)


def test_rmsnorm_matches_transformers_in_fp32_and_bf16():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(5, 32, generator=g) * 3, torch.randn(32, generator=g)
    ours, ref = RMSNorm(32, eps=1e-5), LlamaRMSNorm(32, eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(w)
        ref.weight.copy_(w)
        torch.testing.assert_close(ours(x), ref(x))
        ours, ref, xb = ours.bfloat16(), ref.bfloat16(), x.bfloat16()
        torch.testing.assert_close(ours(xb), ref(xb), atol=0, rtol=0)


# ------------------------------------------------------------------ attention over the paged pool

HQ, HKV, D = 6, 2, 8


def _scenario(requests, custom_mask=None, dtype=torch.float32, seed=0, consecutive=False):
    """requests: (prefix_len, new_len) each. Random scattered slots (or consecutive ones from a
    random start, as a lone request gets them); random pool contents."""
    g = torch.Generator().manual_seed(seed)
    num_slots = 4 * sum(p + n for p, n in requests) + 8
    kv = KVPool(num_slots, 1, HKV, D, dtype, "cpu")
    kv.k[0].copy_(torch.randn(kv.k[0].shape, generator=g))
    kv.v[0].copy_(torch.randn(kv.v[0].shape, generator=g))
    r2t = torch.zeros(len(requests) + 3, 64, dtype=torch.int32)
    rows = torch.randperm(r2t.shape[0], generator=g)[: len(requests)].tolist()
    free = (torch.randperm(num_slots, generator=g) + 1).tolist()
    if consecutive:
        start = int(torch.randint(1, num_slots // 2, (1,), generator=g))
        free = list(range(num_slots, 0, -1))[: num_slots - start + 1]  # pops start, start+1..
    locs = []
    for row, (p, n) in zip(rows, requests):
        slots = [free.pop() for _ in range(p + n)]
        r2t[row, : p + n] = torch.tensor(slots)
        locs += slots[p:]
    t = sum(n for _, n in requests)
    batch = ForwardBatch.build(
        input_ids=[0] * t,
        out_cache_loc=locs,
        req_pool_indices=rows,
        seq_lens=[p + n for p, n in requests],
        extend_lens=[n for _, n in requests],
        req_to_token=r2t,
        custom_mask=custom_mask,
    )
    q = torch.randn(t, HQ, D, generator=g).to(dtype)
    return batch, kv, q


def _dense_reference(batch, kv, q, custom_mask_blocks=None):
    """Float64 softmax attention, request by request, with K/V read slot by slot."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    ext, lens = batch.extend_lens.tolist(), batch.seq_lens.tolist()
    start = 0
    for r, (n, s) in enumerate(zip(ext, lens)):
        slots = batch.req_to_token[batch.req_pool_indices[r], :s].long()
        k = kv.k[0][slots].double().repeat_interleave(HQ // HKV, dim=1)  # [s, HQ, D]
        v = kv.v[0][slots].double().repeat_interleave(HQ // HKV, dim=1)
        for i in range(n):
            allowed = (
                (torch.arange(s) <= s - n + i)
                if custom_mask_blocks is None
                else custom_mask_blocks[r][i]
            )
            scores = torch.einsum("hd,shd->hs", q[start + i].double(), k) / math.sqrt(D)
            scores[:, ~allowed] = -math.inf
            out[start + i] = torch.einsum("hs,shd->hd", scores.softmax(-1), v)
        start += n
    return out


def _run(batch, kv, q):
    backend = create_attention_backend("torch", HQ, HKV, D, "cpu")
    k = v = torch.zeros(q.shape[0], HKV, D, dtype=q.dtype)  # the pool already holds them
    return backend.forward(q, k, v, 0, kv, backend.plan(batch))


@pytest.mark.parametrize(
    "requests",
    [
        [(0, 1)],  # first token
        [(12, 1), (3, 1), (30, 1)],  # batched decode, ragged lengths (padding mask)
        [(7, 1), (7, 1)],  # batched decode, equal lengths (no mask)
        [(0, 9)],  # prefill from scratch
        [(10, 5)],  # chunk over a cached prefix
        [(0, 6), (4, 1), (9, 3), (20, 1), (2, 1)],  # hybrid: prefill, decodes, verify-like chunk
    ],
)
def test_reference_attention_matches_dense_attention(requests):
    batch, kv, q = _scenario(requests)
    torch.testing.assert_close(
        _run(batch, kv, q).double(), _dense_reference(batch, kv, q), atol=1e-5, rtol=1e-5
    )


def test_lone_decode_over_consecutive_slots_reads_a_view_correctly():
    batch, kv, q = _scenario([(40, 1)], consecutive=True)
    slots = batch.req_to_token[batch.req_pool_indices[0], :41]
    assert torch.equal(slots, torch.arange(int(slots[0]), int(slots[0]) + 41, dtype=torch.int32))
    plan = create_attention_backend("torch", HQ, HKV, D, "cpu").plan(batch)
    assert plan.decode.first_slot == int(slots[0])
    torch.testing.assert_close(
        _run(batch, kv, q).double(), _dense_reference(batch, kv, q), atol=1e-5, rtol=1e-5
    )


def test_custom_mask_blocks_are_per_request_row_major():
    requests = [(3, 3), (5, 1), (0, 2)]
    g = torch.Generator().manual_seed(3)
    blocks = []
    for p, n in requests:
        m = torch.rand(n, p + n, generator=g) < 0.5
        m[torch.arange(n), p + torch.arange(n)] = True  # each token sees itself
        blocks.append(m)
    flat = torch.cat([b.flatten() for b in blocks])
    batch, kv, q = _scenario(requests, custom_mask=flat)
    out = _run(batch, kv, q)
    torch.testing.assert_close(
        out.double(), _dense_reference(batch, kv, q, blocks), atol=1e-5, rtol=1e-5
    )
    causal = _dense_reference(*_scenario(requests)[:2], q)
    assert not torch.allclose(out.double(), causal, atol=1e-3)  # the mask was really used


def test_reference_attention_in_bf16_is_close():
    batch, kv, q = _scenario([(0, 5), (9, 1), (4, 1)], dtype=torch.bfloat16)
    out = _run(batch, kv, q)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), _dense_reference(batch, kv, q), atol=3e-2, rtol=3e-2)


def test_backend_registry_resolves_lazily_and_rejects_unknown_names(monkeypatch):
    import lmprog.runtime.layers.attention as registry

    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    assert "torch" in available_attention_backends()
    assert isinstance(create_attention_backend("torch", 4, 2, 8, "cpu"), AttentionBackend)
    with pytest.raises(ValueError, match="available"):
        create_attention_backend("nope", 4, 2, 8, "cpu")
    with pytest.raises(ValueError, match="module:ClassName"):
        register_attention_backend("bad", "no_colon")
    register_attention_backend(
        "torch-alias", "lmprog.runtime.layers.attention.torch_ref:TorchAttentionBackend"
    )
    assert (
        type(create_attention_backend("torch-alias", 4, 2, 8, "cpu")).__name__
        == "TorchAttentionBackend"
    )


# ------------------------------------------------------------------ oneDNN-packed bf16 linears


NO_AVX512_BF16 = (
    "mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert "
    "or avx512bw, avx512vl and avx512dq"
)


def _bf16_model_and_forward(tie, bias):
    """A small bf16 model (weights x8: logits of a few units) and a forward over a fixed batch."""
    from lmprog.runtime.models import ModelConfig, load_model

    cfg = ModelConfig(
        "qwen2",
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position=64,
        tie_word_embeddings=tie,
        attention_bias=bias,
    )
    model = load_model(cfg, load_format="dummy", dtype="bfloat16", seed=5)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8)
    batch, _, _ = _scenario([(0, 6), (3, 1)])
    batch = ForwardBatch.build(
        input_ids=[1, 5, 9, 2, 7, 3, 11],
        out_cache_loc=batch.out_cache_loc,
        req_pool_indices=batch.req_pool_indices,
        seq_lens=[6, 4],
        extend_lens=[6, 1],
        req_to_token=batch.req_to_token,
        logits_indices=range(7),
    )
    num_slots = int(batch.req_to_token.max())

    def forward():
        with torch.inference_mode():
            return model(batch, KVPool.for_model(cfg, num_slots, torch.bfloat16, "cpu"))

    return cfg, model, forward


def _pack_and_log(model, caplog):
    from lmprog.runtime.layers.cpu_packing import pack_linears

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lmprog.runtime.layers.cpu_packing"):
        assert pack_linears(model) is model
    return caplog.text


@pytest.mark.parametrize("tie,bias", [(True, True), (False, False)])
def test_packed_bf16_linears_give_the_unpacked_logits(tie, bias, caplog):
    """Where this CPU runs oneDNN's bf16 kernel every linear is packed (logits within bf16
    rounding of the plain ones); where it cannot, the plain linears stay (the same logits).
    The log says which path was taken."""
    from lmprog.runtime.layers.cpu_packing import PackedLinear, can_pack_linears, pack_linears
    from lmprog.runtime.models import load_model

    cfg, model, forward = _bf16_model_and_forward(tie, bias)
    packable = can_pack_linears(model)
    plain = forward()
    text = _pack_and_log(model, caplog)
    packed = forward()
    assert packed.dtype == torch.float32 and plain.std() > 0.1
    if packable:
        assert "oneDNN packed path" in text, text
        assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
        assert isinstance(model.lm_head, PackedLinear)
        torch.testing.assert_close(packed, plain, atol=0.05 * plain.abs().max().item(), rtol=0)
    else:  # e.g. a CPU without avx512bw/vl/dq or avx_ne_convert
        assert "plain PyTorch path" in text, text
        assert not any(isinstance(m, PackedLinear) for m in model.modules())
        assert torch.equal(packed, plain)
    with pytest.raises(ValueError, match="bfloat16"):
        pack_linears(load_model(cfg, load_format="dummy", dtype="float32"))


@pytest.mark.parametrize("failing_op", ["_reorder_linear_weight", "_linear_pointwise"])
def test_packing_falls_back_on_a_cpu_without_the_bf16_instructions(failing_op, monkeypatch, caplog):
    """Simulated: the oneDNN ops exist but raise as they do on a CPU without avx512bw/vl/dq
    and avx_ne_convert. The probe notices once, nothing is packed, the logits are the plain
    ones and the log says why."""
    from lmprog.runtime.layers import cpu_packing

    calls = []

    def unsupported(*args, **kwargs):
        calls.append(args)
        raise RuntimeError(NO_AVX512_BF16)

    if failing_op == "_linear_pointwise":  # packing works, the product raises
        monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", lambda w, *a: w.clone())
    monkeypatch.setattr(torch.ops.mkldnn, failing_op, unsupported)
    cpu_packing.packed_bf16_unsupported.cache_clear()
    try:
        _, model, forward = _bf16_model_and_forward(True, True)
        plain = forward()
        assert not cpu_packing.can_pack_linears(model)
        text = _pack_and_log(model, caplog)
        assert "plain PyTorch path" in text and "avx512bw" in text, text
        assert not any(isinstance(m, cpu_packing.PackedLinear) for m in model.modules())
        assert model.lm_head is None  # tied embeddings, as loaded
        assert torch.equal(forward(), plain)
        assert "plain PyTorch path" in _pack_and_log(model, caplog)
        assert len(calls) == 1  # the kernel was tried once
    finally:
        cpu_packing.packed_bf16_unsupported.cache_clear()  # the real op is probed again later


def test_a_model_can_be_walked_with_module_apply():
    """nn.Module.apply(fn) reaches every submodule (the rotary embedding once hid it)."""
    from engine_testing import TINY, random_llama

    seen = []
    random_llama(TINY, 0.3).apply(lambda m: seen.append(type(m).__name__))
    assert "RotaryEmbedding" in seen and "LlamaForCausalLM" in seen
