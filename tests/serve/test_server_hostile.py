"""Hostile bodies on a toy backend (issue 13): huge integers, deep nesting (also in tool call
arguments), strings for integers and booleans are 400s, never 500s; a client that leaves is
counted as a client abort, not an error; the bearer scheme is case-insensitive."""

from __future__ import annotations

import argparse
import json
import logging
import socket
import time

import pytest
from fakes import FakeBackend, Gate
from serve_http import assert_error, post_json, request

from lmprog.serve import Server
from lmprog.serve.cli import add_serve_arguments
from lmprog.serve.jsonbody import nesting_depth

MODEL = "toy"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
COMPLETION = {"model": MODEL, "prompt": "hello", "max_tokens": 3}
DEEP = "[" * 100 + "]" * 100
VERY_DEEP = "[" * 100_000 + "]" * 100_000  # beyond the interpreter's recursion limit
LONG_INT = "1" * 5000  # beyond Python's int-string conversion limit (4300 digits)


@pytest.fixture(scope="module")
def url():
    with Server(FakeBackend(), model_name=MODEL, max_body_bytes=1 << 20).start() as srv:
        yield srv.url


def raw_post(url: str, path: str, text: str) -> tuple[int, object]:
    return request(url, "POST", path, text.encode())


def with_call_arguments(arguments: str) -> dict:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {
        **CHAT,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
    }


def still_serves(url: str) -> None:
    status, body = post_json(url, "/v1/chat/completions", CHAT)
    assert status == 200, body


@pytest.mark.parametrize(
    "path,text",
    [
        ("/v1/completions", f'{{"model": "toy", "prompt": "hi", "max_tokens": {LONG_INT}}}'),
        ("/v1/chat/completions", f'{{"model": "toy", "messages": [], "seed": -{LONG_INT}}}'),
        ("/v1/completions", f'{{"model": "toy", "prompt": [{LONG_INT}]}}'),
    ],
)
def test_integers_over_the_conversion_limit_are_400(url, path, text):
    status, body = raw_post(url, path, text)
    err = assert_error(status, body, 400, code="integer_too_long")
    assert "4300 digits" in err["message"]
    still_serves(url)


@pytest.mark.parametrize("nested", [DEEP, VERY_DEEP, '{"a": ' * 70 + "1" + "}" * 70])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_deep_nesting_is_400(url, path, nested):
    status, body = raw_post(url, path, f'{{"model": "toy", "metadata": {nested}}}')
    err = assert_error(status, body, 400, code="json_too_deep")
    assert "max_json_depth" in err["message"] and "64" in err["message"]
    still_serves(url)


@pytest.mark.parametrize(
    "arguments,code",
    [(DEEP, "json_too_deep"), (VERY_DEEP, "json_too_deep"), (LONG_INT, "integer_too_long")],
)
def test_tool_call_arguments_within_limits(url, arguments, code):
    status, body = post_json(url, "/v1/chat/completions", with_call_arguments(arguments))
    assert_error(status, body, 400, param="messages[1].tool_calls", code=code)
    status, body = post_json(url, "/v1/chat/completions", with_call_arguments('{"x": [[1]]}'))
    assert status == 200, body


def test_brackets_in_strings_do_not_count(url):
    status, body = post_json(
        url, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": DEEP}]}
    )
    assert status == 200, body
    assert nesting_depth('{"a": "\\"[[[", "b": [[1]]}') == 3
    assert nesting_depth('"\\\\"[[') == 2 and nesting_depth('"[[[') == 0


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_is_not_json(url, constant):
    status, body = raw_post(
        url, "/v1/completions", f'{{"model": "toy", "prompt": "hi", "temperature": {constant}}}'
    )
    assert_error(status, body, 400, code="invalid_json")


def test_the_depth_limit_is_configurable():
    with Server(FakeBackend(), model_name=MODEL, max_json_depth=4).start() as srv:
        ok = {**COMPLETION, "stop": ["a"]}  # {[ ]}: depth 2
        assert post_json(srv.url, "/v1/completions", ok)[0] == 200
        status, body = post_json(srv.url, "/v1/completions", {**COMPLETION, "prompt": [[[[1]]]]})
        err = assert_error(status, body, 400, code="json_too_deep")
        assert "at most 4" in err["message"]
    with pytest.raises(ValueError, match="max_json_depth"):
        Server(FakeBackend(), max_json_depth=0)
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert parser.parse_args([]).max_json_depth == 64
    assert parser.parse_args(["--max-json-depth", "8"]).max_json_depth == 8


@pytest.mark.parametrize(
    "path,payload,param",
    [
        ("/v1/chat/completions", {**CHAT, "max_tokens": "5"}, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 5.0}, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": True}, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream"),
        ("/v1/chat/completions", {**CHAT, "stream": 1}, "stream"),
        ("/v1/chat/completions", {**CHAT, "n": "2"}, "n"),
        ("/v1/chat/completions", {**CHAT, "seed": "7"}, "seed"),
        ("/v1/chat/completions", {**CHAT, "temperature": "0.5"}, "temperature"),
        ("/v1/chat/completions", {**CHAT, "temperature": True}, "temperature"),
        ("/v1/chat/completions", {**CHAT, "logprobs": "true"}, "logprobs"),
        ("/v1/chat/completions", {**CHAT, "top_k": "3"}, "top_k"),
        ("/v1/chat/completions", {**CHAT, "ignore_eos": "false"}, "ignore_eos"),
        ("/v1/chat/completions", {**CHAT, "stop_token_ids": ["2"]}, "stop_token_ids[0]"),
        (
            "/v1/chat/completions",
            {**CHAT, "stream": True, "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
        ),
        ("/v1/chat/completions", {**CHAT, "max_completion_tokens": "4"}, "max_completion_tokens"),
        ("/v1/completions", {**COMPLETION, "echo": "yes"}, "echo"),
        ("/v1/completions", {**COMPLETION, "logprobs": "2"}, "logprobs"),
        ("/v1/completions", {**COMPLETION, "prompt": [True, False]}, "prompt"),
    ],
)
def test_strings_are_not_integers_or_booleans(url, path, payload, param):
    status, body = post_json(url, path, payload)
    assert_error(status, body, 400, param=param, code="invalid_value")


def test_a_top_k_beyond_any_vocabulary_is_400(url):
    status, body = post_json(url, "/v1/chat/completions", {**CHAT, "top_k": 2**64})
    assert_error(status, body, 400, param="top_k", code="invalid_value")
    assert post_json(url, "/v1/chat/completions", {**CHAT, "top_k": 2**31 - 1})[0] == 200


def test_floats_still_take_integers(url):
    payload = {**CHAT, "temperature": 1, "top_p": 1, "frequency_penalty": 0, "min_p": 0}
    status, body = post_json(url, "/v1/chat/completions", payload)
    assert status == 200, body


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer", "bEaReR"])
def test_bearer_scheme_is_case_insensitive(scheme):
    with Server(FakeBackend(), model_name=MODEL, api_key="s3cret").start() as srv:
        headers = {"Authorization": f"{scheme} s3cret"}
        status, body = post_json(srv.url, "/v1/chat/completions", CHAT, headers)
        assert status == 200, body
        for wrong in (f"{scheme} S3CRET", f"{scheme}s3cret", "Basic s3cret", f"{scheme} "):
            status, body = post_json(
                srv.url, "/v1/chat/completions", CHAT, {"Authorization": wrong}
            )
            assert_error(status, body, 401, code="invalid_api_key")


def metric(url: str, prefix: str) -> int:
    _, text = request(url, "GET", "/metrics")
    return sum(int(float(ln.split()[-1])) for ln in text.splitlines() if ln.startswith(prefix))


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_is_an_abort_not_an_error(caplog, stream):
    caplog.set_level(logging.INFO, logger="lmprog.serve")
    gate = Gate()
    backend = FakeBackend(gate=gate)
    with Server(backend, model_name=MODEL).start() as srv:
        body = json.dumps({**COMPLETION, "stream": stream}).encode()
        sock = socket.create_connection((srv.host, srv.port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_for(lambda: gate.held == 1)  # generating: held at the gate
        if stream:
            assert b"200 OK" in sock.recv(4096)
        sock.close()
        aborts = "lmprog_http_client_aborts_total"
        wait_for(lambda: metric(srv.url, aborts) == 1)  # while the generation is still held
        gate.open()
        wait_for(lambda: backend.active == 0)
        status = 200 if stream else 499
        counted = f'lmprog_http_requests_total{{path="/v1/completions",status="{status}"}}'
        assert metric(srv.url, counted) == 1
        assert metric(srv.url, 'lmprog_http_requests_total{path="/v1/completions",status="5') == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
