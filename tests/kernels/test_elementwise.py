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
from lmprog.runtime.kernels.rope import apply_rope, apply_rope_ref, cos_sin_cache  # noqa: E402

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
