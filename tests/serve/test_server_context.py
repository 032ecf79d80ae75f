"""A prompt too long for the context, told to an HTTP client: the server's own flag
(`lmprog serve --max-total-tokens`), not the backend's Python keyword (`LlamaCpp(n_ctx=...)`),
and the model's own context length as such (issue 28, section 5)."""

from __future__ import annotations

import types

import pytest
from serve_http import post_json

from lmprog.core.errors import ContextLengthError
from lmprog.runtime.scheduler.lengths import LengthLimits
from lmprog.serve.errors import from_exception


def _runtime_error(prompt_len: int, context: int, pool: int) -> ContextLengthError:
    cache = types.SimpleNamespace(capacity=pool, round_up=lambda n: n)
    with pytest.raises(ContextLengthError) as info:
        LengthLimits(context, cache, None).check_fits(prompt_len)
    return info.value


def test_the_runtime_s_limits_name_the_flag_or_the_model():
    pool = from_exception(_runtime_error(600, context=8192, pool=512))
    assert pool.code == "context_length_exceeded" and pool.status == 400
    assert pool.message == (
        "the prompt has 600 tokens and this server's context holds 512 (at least one more is "
        "needed to generate): shorten the prompt, or start the server with a larger "
        "--max-total-tokens"
    )
    model = from_exception(_runtime_error(9000, context=8192, pool=100_000)).message
    assert "the model's context length is 8192" in model and "--max" not in model
    assert "max_total_tokens)" not in pool.message  # the Python keyword


def test_an_error_without_its_numbers_keeps_its_message():
    # e.g. an endpoint backend's, relayed from another server
    assert from_exception(ContextLengthError("too long upstream")).message == "too long upstream"


def test_llamacpp_behind_the_server_names_the_flag():
    pytest.importorskip("llama_cpp")
    pytest.importorskip("uvicorn")
    import lmprog as lp
    from lmprog.serve import Server

    backend = lp.LlamaCpp(n_ctx=256)
    try:
        with Server(backend).start() as srv:
            body = {
                "model": srv.model_name,
                "messages": [{"role": "user", "content": "word " * 400}],
                "max_tokens": 2,
            }
            status, reply = post_json(srv.url, "/v1/chat/completions", body)
    finally:
        backend.shutdown()
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    message = reply["error"]["message"]
    assert "this server's context holds 256" in message and "--max-total-tokens" in message
    assert "LlamaCpp(" not in message
