"""FP8 kernels (activation quantization, block-scaled matmul) against their PyTorch
references (lmprog.runtime.kernels.fp8_ref)."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import DEVICE, ON_GPU, rel_err, requires_kernels

pytest.importorskip("triton", reason="triton is not installed: pip install triton==3.9.0")
pytestmark = requires_kernels

from lmprog.runtime.kernels.fp8 import (  # noqa: E402
    block_fp8_matmul,
    fp8_matmul_small_m,
    quantize_fp8,
)
from lmprog.runtime.kernels.fp8_ref import (  # noqa: E402
    FP8,
    quantize_fp8_ref,
    scaled_matmul_ref,
)

IN_DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32, torch.float16]


def _bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)


def test_rounding_matches_torch_at_every_e4m3_value_and_midpoint():
    """Every finite e4m3 value, the midpoints between neighbours (ties: round half to
    even), just above and below them, values past 448 and tiny subnormals: the kernel's
    encoding equals torch's cast on the CPU (its software rounding) bit for bit."""
    codes = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    grid = codes[torch.isfinite(codes)].unique()  # sorted, -448..448
    mid = (grid[1:] + grid[:-1]) / 2
    eps = mid.abs() * 2.0**-12 + 2.0**-20
    x = torch.cat([grid, mid, mid + eps, mid - eps, torch.tensor([460.0, 1e4, -1e4, 2.0**-12])])
    x = x.reshape(1, -1).to(DEVICE)
    one = torch.ones(1, dtype=torch.float32, device=DEVICE)
    q, _ = quantize_fp8(x, scale=one)
    want = x.cpu().clamp(-448, 448).to(FP8)
    differ = (_bits(q).cpu() != _bits(want)).nonzero()[:, 1].tolist()
    assert not differ, [(x[0, i].item(), _bits(q)[0, i].item(), _bits(want)[0, i].item())
                        for i in differ[:8]]  # fmt: skip


@pytest.mark.parametrize("dtype", IN_DTYPES)
@pytest.mark.parametrize("group", [None, 128, 64])
def test_quantize_matches_reference(dtype, group):
    x = (torch.randn(7, 384, device=DEVICE) * torch.rand(7, 1, device=DEVICE) * 20).to(dtype)
    x[3] = 0  # an all-zero row: a floor scale, zero codes
    x[5, :64] = 0  # an all-zero group
    q, s = quantize_fp8(x, group=group)
    q_ref, s_ref = quantize_fp8_ref(x, group=group)
    assert s.shape == (7, 1 if group is None else 384 // group)
    assert torch.equal(s, s_ref)
    assert torch.equal(_bits(q), _bits(q_ref))
    assert not torch.isnan(q.float()).any()


def test_quantize_static_scale_and_strided_rows():
    base = torch.randn(6, 512, device=DEVICE) * 4
    x = base[:, :256]  # rows 512 apart
    scale = torch.tensor([0.02], device=DEVICE)
    q, s = quantize_fp8(x, scale=scale)
    q_ref, s_ref = quantize_fp8_ref(x, scale=scale)
    assert torch.equal(_bits(q), _bits(q_ref)) and torch.equal(s, s_ref)
    assert s.shape == (6, 1) and s.is_contiguous()
    assert (q.float().abs() == 448).any(), "values past 448 * scale saturate"


def test_quantize_errors():
    x = torch.randn(2, 96, device=DEVICE)
    with pytest.raises(ValueError, match="divisor of K"):
        quantize_fp8(x, group=64)
    with pytest.raises(ValueError, match="contiguous"):
        quantize_fp8(x.t())
    with pytest.raises(ValueError, match="one element"):
        quantize_fp8(x, scale=torch.ones(2, device=DEVICE))
    with pytest.raises(TypeError, match="dtype"):
        quantize_fp8(x.to(torch.int32))


@pytest.mark.parametrize(
    "m,n,k,group", [(1, 256, 256, 128), (19, 200, 384, 128), (40, 130, 64, 32)]
)
def test_block_matmul_matches_reference(m, n, k, group):
    x = torch.randn(m, k, device=DEVICE) * 3
    w = torch.randn(n, k, device=DEVICE)
    w[:, :group] *= 50  # blocks of very different scales
    x_q, x_s = quantize_fp8_ref(x, group=group)
    w_q, w_s = quantize_fp8_ref(w, group=group)
    out = block_fp8_matmul(x_q, x_s, w_q, w_s, group, out_dtype=torch.float32)
    ref = scaled_matmul_ref(x_q, x_s, w_q, w_s, group=group)
    assert out.shape == (m, n)
    assert rel_err(out, ref) < (1e-2 if ON_GPU else 1e-5)  # sums in another order (fp8 MMA)
    exact = x @ w.t()  # and the quantized product is near the unquantized one
    assert rel_err(out, exact) < 0.08


@pytest.mark.parametrize("m,n,k", [(1, 96, 512), (5, 64, 300), (16, 40, 256)])
@pytest.mark.parametrize("static", [False, True])
def test_small_m_matmul_quantizes_as_quantize_fp8(m, n, k, static):
    """The fused kernel's numbers are quantize_fp8's codes times the weights, summed in fp32:
    K not a multiple of its block, N not of its tile, every row count up to 16."""
    x = torch.randn(m, k, device=DEVICE) * 3
    w_q, w_s = quantize_fp8_ref(torch.randn(n, k, device=DEVICE))
    w_s = w_s.reshape(n)
    scale = torch.tensor([0.02], device=DEVICE) if static else None
    out = fp8_matmul_small_m(x, w_q, w_s, scale=scale, out_dtype=torch.float32)
    x_q, x_s = quantize_fp8_ref(x, scale=scale)
    ref = scaled_matmul_ref(x_q, x_s, w_q, w_s)
    assert out.shape == (m, n)
    assert rel_err(out, ref) < (1e-2 if ON_GPU else 1e-5)
    with pytest.raises(ValueError, match="M <= 16"):
        fp8_matmul_small_m(torch.randn(17, k, device=DEVICE), w_q, w_s)


def test_block_matmul_errors():
    q = torch.zeros(4, 256, device=DEVICE).to(FP8)
    s = torch.ones(4, 2, device=DEVICE)
    with pytest.raises(ValueError, match="power of two"):
        block_fp8_matmul(q, s, q, s, 96)
    with pytest.raises(ValueError, match="w_s must be"):
        block_fp8_matmul(q, s, q, s[:, :1], 128)
    with pytest.raises(TypeError, match="dtype"):
        block_fp8_matmul(q.float(), s, q, s, 128)
