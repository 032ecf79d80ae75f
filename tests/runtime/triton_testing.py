"""Shared by the runtime's tests of Triton kernels inside a whole model (test_cuda_graph,
test_piecewise_graph, test_triton_fused, test_layers_triton): they run on a CUDA GPU when
there is one, and otherwise on the CPU through Triton's interpreter, in this process
(tests/conftest.py sets TRITON_INTERPRET=1 before any test module imports triton).

`setup(device, dtype, num_layers, rows, num_slots)` builds the graph tests' tiny
sharp-attention Llama (`moe=True`: a Mixtral, its experts through the fused Triton kernel), a
shuffled 64-wide req_to_token table and two KV pools (one for the graphs, one for the eager
reference); `run_uncaptured` / `run_captured` call a graph test's
`run(device, capture, dtype, tol)` with the tolerance of each place it runs."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.layers.moe import StackedExperts
from lmprog.runtime.models import ModelConfig, load_model

ON_GPU = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None


def _skip_reason() -> str | None:
    if not HAS_TRITON:
        return "triton is not installed"
    if ON_GPU:
        return None
    from lmprog.runtime.kernels._checks import interpreting

    if not interpreting():
        return "no GPU and TRITON_INTERPRET is disabled in the environment"
    return None


TRITON_SKIP = _skip_reason()
requires_triton = pytest.mark.skipif(TRITON_SKIP is not None, reason=TRITON_SKIP or "")


@pytest.fixture
def one_thread():
    """One CPU thread and a seeded global RNG while the test runs; the session's thread
    count and RNG states are restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if ON_GPU else []):
        torch.manual_seed(0)
        yield
    torch.set_num_threads(before)


def setup(device, dtype, num_layers, rows, num_slots, width=64, moe=False):
    cfg = ModelConfig(
        "llama",
        vocab_size=50,
        hidden_size=32,
        intermediate_size=32,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position=128,
    )
    if moe:
        cfg = replace(cfg, architecture="mixtral", num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32)  # fmt: skip
    model = load_model(
        cfg, load_format="dummy", seed=3, device=device, dtype=dtype, attention="triton"
    )
    for module in model.modules():  # the kernel under the CPU interpreter too
        if isinstance(module, StackedExperts):
            module.use_kernel = True
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(10)  # sharp attention, so a wrong key, mask or row shows
    g = torch.Generator().manual_seed(0)
    slots = (torch.randperm(num_slots, generator=g)[: rows * width] + 1).int()
    table = slots.view(rows, width).to(device)
    kvs = [KVPool.for_model(cfg, num_slots, model.dtype, device) for _ in range(2)]
    return model, g, table, kvs


GraphRun = Callable[[str, bool, str, float], None]


def run_uncaptured(run: GraphRun) -> None:
    """The padded static inputs without capture, on a GPU or the CPU interpreter."""
    if ON_GPU:
        run("cuda", False, "float32", 2e-2)
    else:
        run("cpu", False, "float32", 1e-4)


def run_captured(run: GraphRun, dtype: str) -> None:
    """Capture and replay on a GPU; fp32 tl.dot runs in TF32 there and bf16 rounds
    differently with padded GEMM shapes, hence the looser tolerances."""
    run("cuda", True, dtype, 2e-2 if dtype == "float32" else 4e-2)


def capture_against_eager(graphs, step, kvs, hidden, tol):
    """A graph runner's maybe_run_capture (pool kvs[0]) against the model's forward_capture
    (pool kvs[1]): the hidden states compared here. Returns (logits, or None when the graphs
    did not serve the step; the reference logits; the hidden states or None)."""
    out = graphs.maybe_run_capture(step, kvs[0], hidden)
    want, want_states = graphs.model.forward_capture(step, kvs[1], hidden)
    if out is None:
        return None, want, None
    got, states = out
    assert states.shape == want_states.shape, (states.shape, want_states.shape)
    diff = (states.float() - want_states.float()).abs().max().item()
    assert diff <= tol * want_states.float().abs().max().item(), diff
    return got, want, states
