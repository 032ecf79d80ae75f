"""Running a graph test script: its `run(device, capture, dtype)` in this process on a GPU,
or on the CPU under Triton's interpreter in a subprocess (TRITON_INTERPRET must be set
before triton is imported, and other tests of the session import it without).

`script(tol)` returns the script's source with its relative tolerance filled in; PRELUDE
is run before it: `setup(device, dtype, num_layers, rows, num_slots)` builds the tiny
sharp-attention Llama, a shuffled 64-wide req_to_token table and two KV pools (one for the
graphs, one for the eager reference)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import textwrap

import torch

PRELUDE = textwrap.dedent("""
    import torch
    from lmprog.runtime.forward_batch import ForwardBatch
    from lmprog.runtime.kv_pool import KVPool
    from lmprog.runtime.models import ModelConfig, load_model

    def setup(device, dtype, num_layers, rows, num_slots, width=64):
        torch.set_num_threads(1)
        cfg = ModelConfig("llama", vocab_size=50, hidden_size=32, intermediate_size=32,
                          num_layers=num_layers, num_heads=4, num_kv_heads=2, head_dim=16,
                          max_position=128)
        model = load_model(cfg, load_format="dummy", seed=3, device=device, dtype=dtype,
                           attention="triton")
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(10)  # sharp attention, so a wrong key, mask or row shows
        g = torch.Generator().manual_seed(0)
        slots = (torch.randperm(num_slots, generator=g)[:rows * width] + 1).int()
        table = slots.view(rows, width).to(device)
        kvs = [KVPool.for_model(cfg, num_slots, model.dtype, device) for _ in range(2)]
        return model, g, table, kvs
""")


def run_uncaptured(script: Callable[[float], str]) -> None:
    """The padded static inputs without capture, on a GPU or the CPU interpreter."""
    if torch.cuda.is_available():
        namespace: dict = {}
        exec(PRELUDE + script(2e-2), namespace)  # noqa: S102 - the same checks, in this process
        namespace["run"]("cuda", False, "float32")
        return
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", PRELUDE + script(1e-4) + "\nrun('cpu', False, 'float32')\n"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok cpu" in result.stdout


def run_captured(script: Callable[[float], str], dtype: str) -> None:
    """Capture and replay on a GPU; fp32 tl.dot runs in TF32 there and bf16 rounds
    differently with padded GEMM shapes, hence the looser tolerances."""
    namespace: dict = {}
    exec(PRELUDE + script(2e-2 if dtype == "float32" else 4e-2), namespace)  # noqa: S102
    namespace["run"]("cuda", True, dtype)
