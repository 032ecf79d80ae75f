"""4-bit weight-only linears (lmprog.runtime.layers.int4) against plain fp32 linears."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmprog.runtime.layers.int4 import (
    GROUP,
    Int4Linear,
    int4_groups,
    int4_kernels_available,
    quantize_int4_,
)

pytestmark = pytest.mark.skipif(
    not int4_kernels_available(), reason="torch lacks the CPU int4 kernels"
)
torch.set_num_threads(1)


def q4_1_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """What a Q4_1 GGUF dequantizes to: d * q + m per group of 32, q spanning 0..15."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k // GROUP, GROUP), generator=g)
    q[..., 0], q[..., 1] = 0, 15  # the quantizer maps each group's min and max to 0 and 15
    d = (torch.rand(n, k // GROUP, 1, generator=g) * 0.01 + 1e-3).half().float()
    m = (torch.randn(n, k // GROUP, 1, generator=g) * 0.05).half().float()
    return (q * d + m).reshape(n, k)


def test_codes_are_recovered_exactly_and_only_from_4bit_groups():
    w = q4_1_weight(48, 128)
    codes, d, lo = int4_groups(w)
    assert codes.min() >= 0 and codes.max() <= 15
    rebuilt = (codes.reshape(48, 4, GROUP) * d[..., None] + lo[..., None]).reshape(48, 128)
    assert torch.equal(rebuilt, w)
    assert int4_groups(w + 1e-4 * torch.randn_like(w)) is None  # not 4-bit groups
    assert int4_groups(w[:, :100]) is None  # not whole groups
    constant = torch.full((4, 64), 0.25)
    assert int4_groups(constant) is not None


@pytest.mark.parametrize("m", [1, 5, 64])
def test_int4_linear_matches_the_fp32_linear(m):
    lin = nn.Linear(256, 96, bias=True)
    with torch.no_grad():
        lin.weight.copy_(q4_1_weight(96, 256, seed=m))
    packed = Int4Linear.from_linear(lin)
    x = torch.randn(m, 256)
    want = lin(x)
    got = packed(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    # bf16 activations and group scales: relative error of a few 1e-3
    torch.testing.assert_close(got, want, atol=3e-2 * want.abs().max().item(), rtol=0)
    # rows do not depend on the batch they are in
    torch.testing.assert_close(packed(x[:1]), got[:1], atol=0, rtol=0)


def test_quantize_replaces_only_exact_layers():
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(q4_1_weight(32, 64))
    assert quantize_int4_(model) == 1
    assert isinstance(model[0], Int4Linear) and type(model[2]) is nn.Linear
    with pytest.raises(ValueError, match="exact 4-bit groups"):
        quantize_int4_(nn.Sequential(nn.Linear(64, 64)))
    with pytest.raises(ValueError, match="float32"):
        quantize_int4_(nn.Sequential(nn.Linear(64, 64)).to(torch.bfloat16))
