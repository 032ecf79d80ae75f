"""One CPU runtime on the default model for every server test module (building one takes
~20 s on this machine; each module still starts its own Server over it: `server`, with an
`openai` client and the served model's name)."""

import pytest
import torch


@pytest.fixture(scope="session")
def rt():
    from lmprog.backends.runtime import Runtime

    torch.set_num_threads(1)
    backend = Runtime(device="cpu", max_total_tokens=8192)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def server(rt):
    from lmprog.serve import Server

    with Server(rt).start() as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(server):
    return server.model_name
