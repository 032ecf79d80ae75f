"""Limits on what one request may ask (issue 13, finding 1): n, stop lists (count and
length), tools count, each a 400 in the OpenAI error shape naming the limit; constraints
compile off the event loop, within `constraint_timeout_s` (a 400 after it), and a compile
whose client left is abandoned."""

import socket
import threading
import time

import pytest
from fakes import FakeBackend
from serve_http import assert_error, post_json, request

from lmprog.serve import Server
from lmprog.serve.limits import ServerLimits
from lmprog.serve.openai import chat_completions, completions

MODEL = "fake"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}


def tool(i):
    return {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def url():
    limits = {"max_n": 3, "max_stop": 2, "max_stop_chars": 8, "max_tools": 2}
    with Server(FakeBackend(), model_name=MODEL, **limits).start() as srv:
        yield srv.url


@pytest.mark.parametrize(
    "path,base", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]
)
def test_request_limits_are_400s_naming_them(url, path, base):
    status, body = post_json(url, path, {**base, "n": 4})
    assert "max_n" in assert_error(status, body, 400, param="n")["message"]
    status, body = post_json(url, path, {**base, "stop": ["a", "b", "c"]})
    assert "max_stop" in assert_error(status, body, 400, param="stop")["message"]
    status, body = post_json(url, path, {**base, "stop": ["x" * 9]})
    err = assert_error(status, body, 400, param="stop", code="stop_too_long")
    assert "max_stop_chars" in err["message"]
    assert post_json(url, path, {**base, "n": 3, "stop": ["a", "x" * 8]})[0] == 200


def test_too_many_tools_is_a_400(url):
    status, body = post_json(
        url, "/v1/chat/completions", {**CHAT, "tools": [tool(i) for i in range(3)]}
    )
    err = assert_error(status, body, 400, param="tools", code="too_many_tools")
    assert "max_tools" in err["message"]
    status, _ = post_json(url, "/v1/chat/completions", {**CHAT, "tools": [tool(0), tool(1)]})
    assert status == 200


def test_limits_are_validated():
    with pytest.raises(ValueError, match="constraint_timeout_s"):
        ServerLimits(constraint_timeout_s=0)
    with pytest.raises(ValueError, match="allow_special_tokens"):
        ServerLimits(allow_special_tokens="yes")
    with pytest.raises(ValueError, match="max_tools"):
        ServerLimits(max_tools=0)


@pytest.fixture
def slow_compile(monkeypatch):
    """Every constraint's token index takes 1.5 s to build (a pathological schema)."""
    started, finished = threading.Event(), threading.Event()

    def build(ctx, constraint):
        started.set()
        time.sleep(1.5)
        finished.set()

    monkeypatch.setattr(completions, "build_index", build)
    monkeypatch.setattr(chat_completions, "build_index", build)
    return started, finished


@pytest.mark.parametrize(
    "path,base", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]
)
def test_a_slow_compile_times_out_off_the_event_loop(slow_compile, path, base):
    with Server(FakeBackend(), model_name=MODEL, constraint_timeout_s=0.5).start() as srv:
        answer = {}

        def send():
            answer["r"] = post_json(srv.url, path, {**base, "regex": "[a-z]+"})

        thread = threading.Thread(target=send)
        thread.start()
        assert slow_compile[0].wait(5)
        t0 = time.monotonic()
        assert request(srv.url, "GET", "/health")[0] == 200  # the loop is free meanwhile
        assert time.monotonic() - t0 < 0.3
        thread.join(10)
        status, body = answer["r"]
        err = assert_error(status, body, 400, param="regex", code="constraint_timeout")
        assert "constraint_timeout_s" in err["message"] and "0.5" in err["message"]


def test_a_compile_whose_client_left_is_abandoned(slow_compile):
    backend = FakeBackend()
    with Server(backend, model_name=MODEL, constraint_timeout_s=30).start() as srv:
        body = b'{"model": "fake", "prompt": "Hi", "max_tokens": 2, "regex": "[a-z]+"}'
        sock = socket.create_connection((srv.host, srv.port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert slow_compile[0].wait(5)
        sock.close()  # gone while its regex compiles
        assert slow_compile[1].wait(5)
        time.sleep(0.5)
        assert backend.generations() == []  # the request never generated
        assert request(srv.url, "GET", "/health")[0] == 200


def test_default_max_tokens_applies_where_a_request_sets_none():
    backend = FakeBackend()
    with Server(backend, model_name=MODEL, max_tokens=100, default_max_tokens=7).start() as srv:
        chat = {k: v for k, v in CHAT.items() if k != "max_tokens"}
        assert post_json(srv.url, "/v1/chat/completions", chat)[0] == 200
        assert backend.requests[-1].params.max_tokens == 7
        assert post_json(srv.url, "/v1/chat/completions", {**chat, "max_tokens": 50})[0] == 200
        assert backend.requests[-1].params.max_tokens == 50  # up to the max_tokens limit
        status, _ = post_json(srv.url, "/v1/responses", {"model": MODEL, "input": "Hi"})
        assert status == 200 and backend.requests[-1].params.max_tokens == 7
        prompt_only = {k: v for k, v in COMPLETION.items() if k != "max_tokens"}
        assert post_json(srv.url, "/v1/completions", prompt_only)[0] == 200
        assert backend.requests[-1].params.max_tokens == 16  # OpenAI's completions default
    with Server(backend, model_name=MODEL, max_tokens=100).start() as srv:  # unset: the limit
        assert post_json(srv.url, "/v1/chat/completions", chat)[0] == 200
        assert backend.requests[-1].params.max_tokens == 100
    with pytest.raises(ValueError, match="default_max_tokens 101 is over the max_tokens limit"):
        ServerLimits(max_tokens=100, default_max_tokens=101)
    with pytest.raises(ValueError, match="default_max_tokens must be an int >= 1"):
        ServerLimits(default_max_tokens=0)
