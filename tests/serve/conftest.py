"""One CPU runtime on the default model for every server test module (building one takes
~20 s on this machine; each module still starts its own Server over it)."""

import pytest
import torch


@pytest.fixture(scope="session")
def rt():
    from lmprog.backends.runtime import Runtime

    torch.set_num_threads(1)
    backend = Runtime(device="cpu", max_total_tokens=8192)
    yield backend
    backend.shutdown()
