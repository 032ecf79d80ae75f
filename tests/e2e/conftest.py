"""End-to-end fixtures: one backend per kind, shared by every e2e test module.

Every DSL test runs on each backend: the llama.cpp backend and lmprog's own runtime (its CPU
reference path), both on the bundled SmolLM2-135M-Instruct.
"""

import pytest
import torch

BACKENDS = ["llamacpp", "runtime"]


def _make(kind: str):
    import lmprog as lp

    if kind == "llamacpp":
        return lp.LlamaCpp()
    return lp.Runtime(device="cpu")


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request):
    torch.set_num_threads(1)
    b = _make(request.param)
    yield b
    b.shutdown()
