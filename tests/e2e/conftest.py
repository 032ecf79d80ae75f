"""End-to-end fixtures: one backend per kind, shared by every e2e test module.

Every DSL test runs on each backend: the llama.cpp backend and lmprog's own runtime (its CPU
reference path, or CUDA on a GPU machine: scripts/gpu/), both on the bundled
SmolLM2-135M-Instruct.
"""

import pytest
import torch

BACKENDS = ["llamacpp", "runtime"]


def _make(kind: str):
    import lmprog as lp

    if kind == "llamacpp":
        pytest.importorskip("llama_cpp", reason="the llama.cpp backend is not installed")
        return lp.LlamaCpp()
    # on a GPU machine: CUDA with its defaults (overlap scheduling, decode and piecewise
    # CUDA graphs); elsewhere the CPU reference path
    return lp.Runtime(device="cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request):
    torch.set_num_threads(1)
    b = _make(request.param)
    yield b
    b.shutdown()
