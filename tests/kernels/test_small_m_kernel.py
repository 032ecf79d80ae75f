"""The small-M matmul (lmprog.runtime.kernels.small_m) against x @ w^T in float64: tile
configs with and without split-K, K and N not multiples of the tiles, a bias, every row
count up to 16; and each config the runtime may launch compiled for the H200 (sm_90)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernel_helpers import DEVICE, ON_GPU, rel_err, requires_kernels, tolerance

pytest.importorskip("triton", reason="triton is not installed: pip install triton==3.9.0")
pytestmark = requires_kernels

from lmprog.runtime.kernels.small_m import SmallMConfig, small_m_matmul  # noqa: E402

DTYPES = [torch.bfloat16, torch.float16] if ON_GPU else [torch.float32, torch.float16]
CONFIGS = [
    SmallMConfig(16, 64, num_stages=2),
    SmallMConfig(32, 64, split_k=3, num_stages=2),  # K=256: the third split has no K left
    SmallMConfig(16, 128, split_k=2),
]


def reference(x, w, bias=None):
    y = x.double() @ w.double().t()
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.label.replace(" ", "-"))
@pytest.mark.parametrize("m,n,k", [(1, 40, 300), (5, 64, 256), (16, 33, 512)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(config, m, n, k, dtype):
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    w = (torch.randn(n, k, device=DEVICE) / k**0.5).to(dtype)
    bias = torch.randn(n, device=DEVICE).to(dtype) if m != 5 else None
    y = small_m_matmul(x, w, bias, config=config)
    assert y.shape == (m, n) and y.dtype == dtype
    assert rel_err(y, reference(x, w, bias)) < tolerance(dtype)


def test_split_k_is_deterministic_and_leaves_its_counters_zero():
    """Partials summed in split order by whichever program finishes last: the same bits on
    every call; the counters are reset for the next launch (a CUDA graph replays them)."""
    x = torch.randn(3, 1000, device=DEVICE)
    w = torch.randn(70, 1000, device=DEVICE)
    config = SmallMConfig(16, 64, split_k=4, num_stages=2)
    counters = torch.zeros(8, dtype=torch.int32, device=DEVICE)
    first = small_m_matmul(x, w, config=config, counters=counters)
    assert torch.equal(counters, torch.zeros_like(counters))
    assert torch.equal(small_m_matmul(x, w, config=config, counters=counters), first)
    assert rel_err(first, reference(x, w)) < tolerance(torch.float32)


def test_strided_rows_and_no_rows():
    base = torch.randn(4, 384, device=DEVICE)
    x = base[:, :256]  # rows 384 apart
    w = torch.randn(48, 256, device=DEVICE)
    assert rel_err(small_m_matmul(x, w), reference(x, w)) < tolerance(torch.float32)
    assert small_m_matmul(x[:0], w).shape == (0, 48)


def test_errors():
    x = torch.randn(2, 64, device=DEVICE)
    w = torch.randn(32, 64, device=DEVICE)
    with pytest.raises(ValueError, match="M <= 16"):
        small_m_matmul(torch.randn(17, 64, device=DEVICE), w)
    with pytest.raises(ValueError, match="M <= 16"):
        small_m_matmul(x, torch.randn(32, 48, device=DEVICE))
    with pytest.raises(TypeError, match="dtype"):
        small_m_matmul(x, w.half())
    with pytest.raises(ValueError, match="bias"):
        small_m_matmul(x, w, torch.randn(31, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous"):
        small_m_matmul(x, torch.randn(64, 32, device=DEVICE).t())
    with pytest.raises(ValueError, match="counters needs 2"):
        config = SmallMConfig(16, 64, split_k=2)
        one = torch.zeros(1, dtype=torch.int32, device=DEVICE)
        small_m_matmul(x, w, config=config, counters=one)
    with pytest.raises(ValueError, match="shared memory"):
        small_m_matmul(x, w, config=SmallMConfig(256, 512, num_stages=4))
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        SmallMConfig(24, 64)
    with pytest.raises(ValueError, match="split_k must be an int >= 1"):
        SmallMConfig(16, 64, split_k=0)


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the kernels themselves")
def test_runtime_configs_compile_for_sm90_within_shared_memory():
    """Triton's interpreter runs code a GPU compile refuses (plain globals, a second return
    of another type, too much shared memory): compile every config the runtime may launch,
    for Llama-3.1-8B's shapes, to a cubin for sm_90, in a process without the interpreter."""
    script = Path(__file__).with_name("compile_sm90.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(script), "small_m"], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    if run.returncode == 3:  # this triton has no CUDA backend or ptxas to compile with
        pytest.skip(run.stdout.strip())
    assert run.returncode == 0, run.stderr[-3000:]
    compiled = [json.loads(line) for line in run.stdout.splitlines()]
    assert {c["split_k"] for c in compiled} >= {1, 2, 4}
    assert {c["even_k"] for c in compiled} == {c["fp8"] for c in compiled} == {True, False}
    for c in compiled:
        assert 0 < c["shared"] <= c["shared_bound"] <= 227 * 1024, c
        assert c["spills"] == 0, c


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.label.replace(" ", "-"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_e4m3_weights_with_per_channel_scales(config, dtype):
    """Weight-only FP8: e4m3 weights widened to x's dtype, the per-channel scales applied to
    the sums (before the bias): x @ (w * scale)^T of the dequantized weights."""
    from lmprog.runtime.kernels.fp8_ref import quantize_weight_fp8

    m, n, k = 3, 40, 300
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    w_q, scale = quantize_weight_fp8(torch.randn(n, k, device=DEVICE) / k**0.5)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    y = small_m_matmul(x, w_q, bias, w_scale=scale, config=config)
    assert y.shape == (m, n) and y.dtype == dtype
    w = w_q.double() * scale.double()[:, None]
    assert rel_err(y, reference(x, w, bias)) < tolerance(dtype)
    with pytest.raises(ValueError, match="w_scale goes with e4m3"):
        small_m_matmul(x, w_q, config=config)
    with pytest.raises(ValueError, match="w_scale must be"):
        small_m_matmul(x, w_q, w_scale=scale[:-1], config=config)
