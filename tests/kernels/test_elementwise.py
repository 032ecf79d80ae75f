"""RMSNorm, RoPE and SiLU-and-mul kernels against their PyTorch references."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import DEVICE, DTYPES, ON_GPU, rel_err, requires_kernels, tolerance

pytest.importorskip("triton", reason="triton is not installed: pip install triton==3.9.0")
pytestmark = requires_kernels

from lmprog.runtime.kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402
from lmprog.runtime.kernels.rmsnorm import (  # noqa: E402
    add_rms_norm,
    add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)
from lmprog.runtime.kernels.rope import (  # noqa: E402
    apply_rope,
    apply_rope_ref,
    cos_sin_cache,
    rope_and_store,
    rope_and_store_ref,
)
from lmprog.runtime.layers.rotary import RotaryEmbedding  # noqa: E402

HIDDEN = [1, 300, 4096, 5120] if ON_GPU else [1, 300, 2048]
ROWS = 257 if ON_GPU else 5
SILU_SHAPES = [(5, 2 * 1500), (2, 3, 2 * 64)] + ([(300, 2 * 14336)] if ON_GPU else [])


def _close(out, ref, dtype):
    """Elementwise kernels round once where the reference may round once more: one ulp."""
    assert rel_err(out, ref) < tolerance(dtype) / 2 + 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_rms_norm(dtype, hidden):
    x = torch.randn(ROWS, hidden, dtype=dtype, device=DEVICE) * 3
    w = torch.randn(hidden, dtype=dtype, device=DEVICE)
    _close(rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_updates_residual_in_place(dtype):
    x = torch.randn(3, ROWS, 300, dtype=dtype, device=DEVICE)
    residual = torch.randn_like(x)
    w = torch.rand(300, dtype=torch.float32, device=DEVICE)  # fp32 weights, low-precision x
    ref_out, ref_res = add_rms_norm_ref(x, residual, w)
    out, res = add_rms_norm(x, residual, w, out=x)  # output over the input is allowed
    assert res is residual and out.data_ptr() == x.data_ptr()
    _close(res, ref_res, dtype)
    _close(out, ref_out, dtype)


def test_rms_norm_strided_rows_and_errors():
    dtype = DTYPES[0]
    big = torch.randn(ROWS, 640, dtype=dtype, device=DEVICE)
    x = big[:, 100:400]  # row stride 640, unit last stride
    w = torch.randn(300, dtype=dtype, device=DEVICE)
    _close(rms_norm(x, w), rms_norm_ref(x, w), dtype)
    with pytest.raises(ValueError, match="weight must be contiguous"):
        rms_norm(x, w[:299])
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        rms_norm(big.t(), torch.randn(ROWS, dtype=dtype, device=DEVICE))


def _qk(tokens, hq, hk, head_dim, dtype):
    """q and k as views into one fused qkv projection output, as a model produces them."""
    qkv = torch.randn(tokens, (hq + 2 * hk) * head_dim, dtype=dtype, device=DEVICE)
    q = qkv[:, : hq * head_dim].view(tokens, hq, head_dim)
    k = qkv[:, hq * head_dim : (hq + hk) * head_dim].view(tokens, hk, head_dim)
    return qkv, q, k


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("head_dim,rot_dim", [(64, 64), (64, 32), (128, 128)])
def test_rope_in_place(dtype, is_neox, head_dim, rot_dim):
    tokens = 300 if ON_GPU else 7
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, rot_dim, 2, device=DEVICE) / rot_dim))
    cache = cos_sin_cache(inv_freq, 4096)
    qkv, q, k = _qk(tokens, 8, 2, head_dim, dtype)
    v_before = qkv[:, 10 * head_dim :].clone()
    positions = torch.randint(0, 4096, (tokens,), device=DEVICE)
    q_ref, k_ref = apply_rope_ref(q, k, positions, cache, is_neox=is_neox)
    apply_rope(q, k, positions.int(), cache, is_neox=is_neox)
    _close(q, q_ref, dtype)
    _close(k, k_ref, dtype)
    assert torch.equal(qkv[:, 10 * head_dim :], v_before)  # v untouched


def _rope_store_inputs(tokens, hq, hk, head_dim, dtype, slots=64):
    qkv = torch.randn(tokens, hq + 2 * hk, head_dim, dtype=dtype, device=DEVICE)
    positions = torch.randint(0, 8192, (tokens,), device=DEVICE)
    cos, sin = RotaryEmbedding(head_dim, 500000.0).cos_sin(positions, dtype)
    caches = [torch.zeros(slots, hk, head_dim, dtype=dtype, device=DEVICE) for _ in range(2)]
    loc = torch.randperm(slots - 1, device=DEVICE)[:tokens] + 1
    return qkv, cos, sin, caches, loc


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hk,head_dim", [(8, 2, 64), (6, 6, 32), (32, 8, 128)])
def test_rope_and_store_matches_reference_and_model_path(dtype, hq, hk, head_dim):
    tokens = 200 if ON_GPU else 5
    qkv, cos, sin, (kc, vc), loc = _rope_store_inputs(tokens, hq, hk, head_dim, dtype, 256)
    ref_qkv, ref_kc, ref_vc = qkv.clone(), kc.clone(), vc.clone()
    rope_and_store_ref(ref_qkv, hq, cos, sin, ref_kc, ref_vc, loc)
    # the model's plain path: RotaryEmbedding.rotate, then the pool write
    model_qk = RotaryEmbedding.rotate(qkv[:, : hq + hk].clone(), cos, sin)
    rope_and_store(qkv, hq, cos, sin, kc, vc, loc.int())
    _close(qkv, ref_qkv, dtype)
    _close(qkv[:, : hq + hk], model_qk, dtype)
    assert torch.equal(kc[loc], qkv[:, hq : hq + hk]) and torch.equal(vc[loc], qkv[:, hq + hk :])
    untouched = torch.ones(kc.shape[0], dtype=torch.bool, device=DEVICE)
    untouched[loc] = False
    assert not kc[untouched].any() and not vc[untouched].any()


def test_rope_and_store_errors():
    dtype = DTYPES[0]
    qkv, cos, sin, (kc, vc), loc = _rope_store_inputs(3, 4, 2, 32, dtype)
    with pytest.raises(ValueError, match="num_q_heads"):
        rope_and_store(qkv, 3, cos, sin, kc, vc, loc)
    with pytest.raises(ValueError, match="cos must be"):
        rope_and_store(qkv, 4, cos[:2], sin, kc, vc, loc)
    with pytest.raises(ValueError, match="k_cache must be"):
        rope_and_store(qkv, 4, cos, sin, kc[:, :1], vc, loc)
    with pytest.raises(ValueError, match="out_loc must be"):
        rope_and_store(qkv, 4, cos, sin, kc, vc, loc[:2])
    with pytest.raises(TypeError, match="k_cache must have dtype"):
        rope_and_store(qkv, 4, cos, sin, kc.double(), vc, loc)


def test_rope_position_zero_is_identity_and_errors():
    dtype = DTYPES[0]
    _, q, k = _qk(4, 4, 2, 64, dtype)
    q0, k0 = q.clone(), k.clone()
    cache = cos_sin_cache(torch.rand(32, device=DEVICE), 16)
    apply_rope(q, k, torch.zeros(4, dtype=torch.int64, device=DEVICE), cache)
    assert torch.equal(q, q0) and torch.equal(k, k0)
    with pytest.raises(ValueError, match="positions must be"):
        apply_rope(q, k, torch.zeros(3, dtype=torch.int64, device=DEVICE), cache)
    with pytest.raises(ValueError, match="even rot_dim"):
        apply_rope(q, k, torch.zeros(4, dtype=torch.int64, device=DEVICE), cache[:, :7])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SILU_SHAPES)
def test_silu_and_mul(dtype, shape):
    x = torch.randn(shape, dtype=dtype, device=DEVICE) * 2
    _close(silu_and_mul(x), silu_and_mul_ref(x), dtype)
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(x[..., :-1])
