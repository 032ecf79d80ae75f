"""Decode-sized matmuls on the path timed fastest (lmprog.runtime.layers.small_m): a
SmallMLinear keeps the replaced layer's Parameters and outputs; choose_small_m_paths_ swaps
the layers of a shape only where a kernel config won (and computed what cuBLAS does), none
with LMPROG_SMALL_M=0. Without a GPU: Triton's interpreter and a scripted timer (the real
one replays CUDA graphs); the last test times for real on a GPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from triton_testing import ON_GPU, requires_triton

from lmprog.runtime.assemble import assemble_model
from lmprog.runtime.layers.small_m import ENV_VAR, SmallMLinear, choose_small_m_paths_
from lmprog.runtime.models import ModelConfig, load_model

pytestmark = requires_triton
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPE = torch.bfloat16 if ON_GPU else torch.float16  # the interpreter has no bf16
TOL = 1.6e-2 if ON_GPU else 2e-3
TINY = ModelConfig("llama", vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16, max_position=64)  # fmt: skip


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def scripted(start: float, step: float):
    """A timer that runs each path once and reports start, start + step, ... in call order
    (a shape's paths are timed in the order cuBLAS, then each candidate config)."""
    times = iter(start + i * step for i in range(10_000))

    def timer(fn) -> float:
        fn()
        return next(times)

    return timer


def linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def test_swap_keeps_parameters_state_dict_and_outputs():
    from lmprog.runtime.kernels.small_m import SmallMConfig

    lin = nn.Linear(96, 40, bias=True, device=DEVICE)
    layer = SmallMLinear(lin, SmallMConfig(16, 64, split_k=2, num_stages=2))
    assert isinstance(layer, nn.Linear)
    assert layer.weight is lin.weight and layer.bias is lin.bias
    assert list(layer.state_dict()) == ["weight", "bias"]  # the counters are not state
    x = torch.randn(2, 3, 96, device=DEVICE)  # 6 rows: the kernel
    big = torch.randn(17, 96, device=DEVICE)  # 17 rows: F.linear
    with torch.no_grad():
        assert rel(layer(x), lin(x)) < (5e-3 if ON_GPU else 1e-5)
        assert torch.equal(layer(big), lin(big))
    assert not layer.counters.any()


def test_a_shape_whose_kernel_config_timed_fastest_is_swapped():
    model = load_model(TINY, load_format="dummy", device=DEVICE, dtype=DTYPE)
    plain = copy.deepcopy(model)
    weights = {name: m.weight for name, m in linears(model).items()}
    results = choose_small_m_paths_(model, timer=scripted(1000.0, -1.0))  # the last is fastest
    shapes = {(m.in_features, m.out_features) for m in linears(plain).values()}
    assert {(r.k, r.n) for r in results} == shapes
    assert {r.kind for r in results} == {str(DTYPE).removeprefix("torch.")}
    for r in results:
        labels = list(r.us)
        assert labels[0] == "cublas" and len(labels) > 2 and r.chosen == labels[-1]
    swapped = linears(model)
    assert all(type(m) is SmallMLinear for m in swapped.values())
    assert model.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(5, 96, device=DEVICE, dtype=DTYPE)
    with torch.no_grad():
        for name, layer in linears(plain).items():
            assert swapped[name].weight is weights[name]
            xi = x[:, : layer.in_features]
            assert rel(swapped[name](xi), layer(xi)) < TOL


def test_cublas_stays_where_it_timed_fastest_and_the_switch_turns_the_kernel_off(monkeypatch):
    model = load_model(TINY, load_format="dummy", device=DEVICE, dtype=DTYPE)
    results = choose_small_m_paths_(model, timer=scripted(1.0, 1.0))  # cuBLAS timed first
    assert results and all(r.chosen == "cublas" for r in results)
    assert all(type(m) is nn.Linear for m in linears(model).values())
    monkeypatch.setenv(ENV_VAR, "0")
    assert choose_small_m_paths_(model, timer=scripted(1000.0, -1.0)) == []
    assert all(type(m) is nn.Linear for m in linears(model).values())


def test_a_config_that_computes_something_else_is_left_out(monkeypatch):
    from lmprog.runtime.kernels import small_m

    real = small_m.small_m_matmul

    def wrong_for_block_n_16(x, w, bias=None, *, config, counters=None):
        y = real(x, w, bias, config=config, counters=counters)
        return y + 1 if config.block_n == 16 else y

    monkeypatch.setattr(small_m, "small_m_matmul", wrong_for_block_n_16)
    model = load_model(TINY, load_format="dummy", device=DEVICE, dtype=DTYPE)
    for r in choose_small_m_paths_(model, timer=scripted(1000.0, -1.0)):
        assert r.us and not any(label.startswith("n16 ") for label in r.us)
        assert any(label.startswith("n32 ") for label in r.us)


@pytest.mark.skipif(not ON_GPU, reason="times kernels in CUDA graphs")
def test_assembly_times_each_shape_on_cuda():
    net = assemble_model(TINY, device="cuda", load_format="dummy", dtype="bfloat16")
    results = choose_small_m_paths_(net)  # what assembly left as nn.Linear, timed again
    for r in results:
        assert r.us["cublas"] > 0 and r.chosen in r.us
    kernel = [m for m in net.modules() if type(m) is SmallMLinear]
    plain = [m for m in net.modules() if type(m) is nn.Linear]
    assert len(kernel) + len(plain) == 4 * TINY.num_layers + 1


def test_fp8_layers_take_the_weight_only_kernel_where_it_timed_fastest():
    """FP8 shapes time the fused W8A8 kernel, quantize + _scaled_mm and the weight-only
    small_m_matmul's configs; the last timed (a weight-only config) wins here, and its
    layers then compute x @ the dequantized weights for up to 16 rows, W8A8 past that."""
    from lmprog.runtime.kernels.fp8_ref import dequantize_fp8
    from lmprog.runtime.layers.fp8_linear import Fp8Linear

    net = assemble_model(TINY, device=DEVICE, load_format="dummy", quantization="fp8")
    layers = [m for m in net.modules() if isinstance(m, Fp8Linear)]
    for layer in layers:
        layer.use_kernels = True  # the Triton paths (the interpreter off a GPU)
    results = [r for r in choose_small_m_paths_(net, timer=scripted(1000.0, -1.0))
               if r.kind == "fp8"]  # fmt: skip
    assert {(r.k, r.n) for r in results} == {(m.in_features, m.out_features) for m in layers}
    for r in results:
        labels = list(r.us)
        assert labels[:2] == ["fused", "scaled_mm"] and len(labels) > 2 and r.chosen == labels[-1]
    x = torch.randn(3, 64, device=DEVICE, dtype=next(net.parameters()).dtype)  # as timed
    with torch.no_grad():
        for layer in (m for m in layers if m.in_features == 64):
            assert layer.small_m_config is not None and not layer.small_m_fused
            w = dequantize_fp8(layer.weight, layer.weight_scale, None)
            assert rel(layer(x), x.float() @ w.t()) < (1e-2 if ON_GPU else 1e-5)
            assert not layer.small_m_counters.any()
