"""Running a graph test script: its `run(device, capture, dtype)` in this process on a GPU,
or on the CPU under Triton's interpreter in a subprocess (TRITON_INTERPRET must be set
before triton is imported, and other tests of the session import it without).

`script(tol)` returns the script's source with its relative tolerance filled in."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import torch


def run_uncaptured(script: Callable[[float], str]) -> None:
    """The padded static inputs without capture, on a GPU or the CPU interpreter."""
    if torch.cuda.is_available():
        namespace: dict = {}
        exec(script(2e-2), namespace)  # noqa: S102 - the same checks, in this process
        namespace["run"]("cuda", False, "float32")
        return
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", script(1e-4) + "\nrun('cpu', False, 'float32')\n"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok cpu" in result.stdout


def run_captured(script: Callable[[float], str], dtype: str) -> None:
    """Capture and replay on a GPU; fp32 tl.dot runs in TF32 there and bf16 rounds
    differently with padded GEMM shapes, hence the looser tolerances."""
    namespace: dict = {}
    exec(script(2e-2 if dtype == "float32" else 4e-2), namespace)  # noqa: S102
    namespace["run"]("cuda", True, dtype)
