"""The server's HTTP layer on a toy backend (no model): every kind of bad input gets a 4xx
with an OpenAI-style error body, and the server keeps serving; API key; limits; /metrics."""

from __future__ import annotations

import json
import logging

import pytest
from fakes import FakeBackend
from serve_http import assert_error, post_json, request

from lmprog.serve import Server

MODEL = "toy"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
COMPLETION = {"model": MODEL, "prompt": "hello", "max_tokens": 3}


@pytest.fixture(scope="module")
def backend():
    return FakeBackend(fail_on="EXPLODE")


@pytest.fixture(scope="module")
def url(backend):
    with Server(
        backend,
        model_name=MODEL,
        max_n=4,
        max_choices=16,
        max_tokens=64,
        max_body_bytes=20_000,
        max_stop=2,
    ).start() as srv:
        yield srv.url


def still_serves(url: str) -> None:
    status, body = post_json(url, "/v1/chat/completions", CHAT)
    assert status == 200, body
    assert body["choices"][0]["message"]["content"]


def test_a_good_request_works(url):
    status, body = post_json(url, "/v1/completions", COMPLETION)
    assert status == 200, body
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["choices"][0]["text"].split() and body["choices"][0]["finish_reason"] == "length"
    still_serves(url)


@pytest.mark.parametrize("raw", [b"{not json", b"", b"\xff\xfe", b"[1, 2]", b'"text"'])
def test_malformed_json(url, raw):
    status, body = request(url, "POST", "/v1/chat/completions", raw)
    assert_error(status, body, 400, code="invalid_json")
    still_serves(url)


@pytest.mark.parametrize(
    "path,payload,param",
    [
        ("/v1/chat/completions", {**CHAT, "temprature": 0.5}, "temprature"),
        ("/v1/completions", {**COMPLETION, "frobnicate": True}, "frobnicate"),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": "x", "mood": 1}]},
            "messages[0].mood",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "response_format": {"type": "json_object", "extra": 1}},
            "response_format.extra",
        ),
    ],
)
def test_unknown_fields_are_rejected_in_strict_mode(strict_url, path, payload, param):
    status, body = post_json(strict_url, path, payload)
    err = assert_error(status, body, 400, param=param, code="unknown_parameter")
    assert param.split(".")[-1].split("]")[-1] in err["message"]
    still_serves(strict_url)


@pytest.fixture(scope="module")
def strict_url(backend):
    with Server(backend, model_name=MODEL, strict_requests=True).start() as srv:
        yield srv.url


def test_unknown_fields_are_ignored_with_one_warning_per_name(url, caplog):
    chat = {
        **CHAT,
        "messages": [
            {"role": "system", "content": "be brief", "id": "m0"},
            {"role": "user", "content": "hi", "id": "m1"},
        ],
        "guided_decoding_backend": "xgrammar",  # another server's extension
        "tool_choice": "none",
        "response_format": {"type": "text", "extra": 1},
    }
    with caplog.at_level(logging.WARNING, logger="lmprog.serve"):
        for _ in range(3):
            status, body = post_json(url, "/v1/chat/completions", chat)
            assert status == 200, body
            assert body["choices"][0]["message"]["content"]
        status, body = post_json(url, "/v1/completions", {**COMPLETION, "vendor_x": [1]})
        assert status == 200, body
    warned = [r.getMessage() for r in caplog.records if "unknown request field" in r.getMessage()]
    for name in ("messages[].id", "guided_decoding_backend", "response_format.extra", "vendor_x"):
        assert sum(name + " " in m for m in warned) == 1, (name, warned)
    assert len(warned) == 4, warned


def test_a_nested_unknown_field_inside_a_union_is_dropped(url):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    choice = {"type": "function", "function": {"name": "f", "x": 1}, "y": 2}
    status, body = post_json(
        url, "/v1/chat/completions", {**CHAT, "tools": tools, "tool_choice": choice}
    )
    assert status == 200, body


@pytest.mark.parametrize(
    "payload,param",
    [
        ({**CHAT, "max_tokens": "5", "unknown_field": 1}, "max_tokens"),
        ({**CHAT, "max_tokens": 5.0}, "max_tokens"),
        (
            {**CHAT, "stream": "yes", "messages": [{"role": "user", "content": "x", "id": 1}]},
            "stream",
        ),
        ({**CHAT, "repetition_penalty": 0}, "repetition_penalty"),
        ({**CHAT, "repetition_penalty": -1.0}, "repetition_penalty"),
        ({**CHAT, "repetition_penalty": "1.1"}, "repetition_penalty"),
        ({**CHAT, "guided_choice": "yes"}, "guided_choice"),
        ({**CHAT, "guided_regex": 5}, "guided_regex"),
    ],
)
def test_known_fields_stay_strictly_typed_when_unknown_ones_are_ignored(url, payload, param):
    status, body = post_json(url, "/v1/chat/completions", payload)
    assert_error(status, body, 400, param=param)
    still_serves(url)


@pytest.mark.parametrize(
    "path,payload,param",
    [
        ("/v1/chat/completions", {"model": MODEL}, "messages"),
        ("/v1/chat/completions", {**CHAT, "messages": []}, "messages"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "many"}, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "temperature": 7}, "temperature"),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "wizard", "content": "x"}]},
            "messages[0].role",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "tool", "content": "x"}]},
            "messages[0]",
        ),
        ("/v1/completions", {**COMPLETION, "prompt": []}, "prompt"),
        ("/v1/completions", {**COMPLETION, "prompt": {"a": 1}}, "prompt"),
        ("/v1/completions", {**COMPLETION, "seed": -1}, "seed"),
        ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {**CHAT, "min_tokens": 9, "max_tokens": 3}, "min_tokens"),
    ],
)
def test_invalid_values(url, path, payload, param):
    status, body = post_json(url, path, payload)
    assert_error(status, body, 400, param=param)
    still_serves(url)


@pytest.mark.parametrize(
    "payload,param",
    [
        (
            {
                **CHAT,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}},
                    },
                },
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                **CHAT,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "string", "pattern": "(?<=ab)c"},
                    },
                },
            },
            "response_format.json_schema.schema",
        ),
        ({**CHAT, "response_format": {"type": "json_schema"}}, "response_format"),
        ({**CHAT, "regex": "(a"}, "regex"),
        (
            {
                **CHAT,
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}
                ],
            },
            "tools[0].function.parameters",
        ),
        (
            {**CHAT, "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            "tools[0].function.name",
        ),
        (
            {
                **CHAT,
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "tool_choice",
        ),
        ({**CHAT, "tool_choice": "required"}, "tool_choice"),
    ],
)
def test_invalid_schemas_and_tools(url, backend, payload, param):
    before = len(backend.generations())
    status, body = post_json(url, "/v1/chat/completions", payload)
    assert_error(status, body, 400, param=param)
    assert len(backend.generations()) == before  # refused before reaching the backend
    still_serves(url)


@pytest.mark.parametrize(
    "path,payload,status_code,param,code",
    [
        ("/v1/chat/completions", {**CHAT, "n": 5}, 400, "n", None),
        (
            "/v1/chat/completions",
            {**CHAT, "max_tokens": 65},
            400,
            "max_tokens",
            "max_tokens_too_large",
        ),
        ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 1000}, 400, "max_tokens", None),
        ("/v1/chat/completions", {**CHAT, "stop": ["a", "b", "c"]}, 400, "stop", None),
        (
            "/v1/completions",
            {**COMPLETION, "prompt": ["a"] * 5, "n": 4, "max_tokens": 1},
            400,
            "n",
            None,
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "logprobs": True, "top_logprobs": 21},
            400,
            "logprobs",
            None,
        ),
    ],
)
def test_request_limits(url, path, payload, status_code, param, code):
    status, body = post_json(url, path, payload)
    assert_error(status, body, status_code, param=param, code=code)
    still_serves(url)


def test_oversized_body_is_413(url):
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 30_000}]}
    status, body = post_json(url, "/v1/chat/completions", big)
    assert_error(status, body, 413, code="request_too_large")
    still_serves(url)


def test_oversized_chunked_body_is_413(url):
    """No Content-Length: the body is counted as it arrives."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    chunks = (
        json.dumps({**CHAT, "messages": [{"role": "user", "content": "y" * 30_000}]}).encode()[
            i : i + 4096
        ]
        for i in range(0, 31_000, 4096)
    )
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=chunks,
        encode_chunked=True,
        headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
    )
    resp = conn.getresponse()
    body = json.loads(resp.read())
    conn.close()
    assert_error(resp.status, body, 413, code="request_too_large")
    still_serves(url)


@pytest.mark.parametrize("name", ["/etc/passwd", "../../models/other.gguf", "gpt-4o", "smollm2"])
def test_only_the_served_model(url, backend, name):
    """A `model` that is a path (or any other name) loads nothing: 404, backend untouched."""
    before = len(backend.generations())
    status, body = post_json(url, "/v1/completions", {**COMPLETION, "model": name})
    assert_error(status, body, 404, param="model", code="model_not_found")
    status, body = request(url, "GET", "/v1/models/" + name.lstrip("/"))
    assert_error(status, body, 404)
    assert len(backend.generations()) == before
    still_serves(url)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
        {"type": "file", "file": {"file_id": "/etc/passwd"}},
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
    ],
)
def test_no_file_or_media_content(url, backend, part):
    before = len(backend.generations())
    payload = {
        **CHAT,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, part]}],
    }
    status, body = post_json(url, "/v1/chat/completions", payload)
    assert_error(status, body, 400, param="messages[0].content[1]", code="unsupported_content")
    assert len(backend.generations()) == before
    still_serves(url)


@pytest.mark.parametrize(
    "field,value", [("logit_bias", {"42": 5}), ("suffix", "tail"), ("best_of", 3)]
)
def test_unsupported_openai_fields(url, field, value):
    status, body = post_json(url, "/v1/completions", {**COMPLETION, field: value})
    assert_error(status, body, 400, param=field)
    still_serves(url)


def test_chat_unsupported_fields(url):
    status, body = post_json(url, "/v1/chat/completions", {**CHAT, "functions": [{"name": "f"}]})
    assert_error(status, body, 400, param="functions", code="unsupported_parameter")
    status, body = post_json(url, "/v1/chat/completions", {**CHAT, "modalities": ["audio"]})
    assert_error(status, body, 400, param="modalities")
    status, body = post_json(
        url, "/v1/chat/completions", {**CHAT, "store": False, "user": "u1", "modalities": ["text"]}
    )
    assert status == 200, body


def test_backend_failure_is_a_500_and_the_server_survives(url):
    status, body = post_json(url, "/v1/completions", {**COMPLETION, "prompt": "EXPLODE now"})
    assert_error(status, body, 500, code="backend_error")
    still_serves(url)


def test_unknown_route_and_method(url):
    status, body = request(url, "GET", "/v1/engines")
    assert_error(status, body, 404)
    status, body = request(url, "GET", "/v1/chat/completions")
    assert_error(status, body, 405)
    still_serves(url)


def test_models_and_health(url):
    status, body = request(url, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in body["data"]] == [MODEL]
    status, body = request(url, "GET", "/health")
    assert status == 200 and body == {"status": "ok"}


def test_metrics_count_requests(url):
    still_serves(url)
    status, text = request(url, "GET", "/metrics")
    assert status == 200
    lines = text.splitlines()
    ok = [
        ln
        for ln in lines
        if ln.startswith('lmprog_http_requests_total{path="/v1/chat/completions",status="200"}')
    ]
    assert ok and float(ok[0].split()[-1]) >= 1
    assert any(
        ln.startswith('lmprog_http_requests_total{path="/v1/chat/completions",status="400"}')
        for ln in lines
    )
    tokens = [ln for ln in lines if ln.startswith("lmprog_completion_tokens_total ")]
    assert tokens and float(tokens[0].split()[-1]) > 0
    for name in (
        "lmprog_time_to_first_token_seconds",
        "lmprog_time_per_output_token_seconds",
        "lmprog_e2e_request_latency_seconds",
        "lmprog_request_queue_time_seconds",
        "lmprog_http_request_duration_seconds",
    ):
        assert f"# TYPE {name} histogram" in lines
    count = [ln for ln in lines if ln.startswith("lmprog_e2e_request_latency_seconds_count ")]
    assert count and float(count[0].split()[-1]) >= 1


def test_api_key(backend):
    with Server(backend, model_name=MODEL, api_key="s3cret").start() as srv:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            status, body = post_json(srv.url, "/v1/chat/completions", CHAT, headers)
            assert_error(status, body, 401, code="invalid_api_key")
        status, body = request(srv.url, "GET", "/metrics")
        assert_error(status, body, 401)
        assert request(srv.url, "GET", "/health")[0] == 200
        status, body = post_json(
            srv.url, "/v1/chat/completions", CHAT, {"Authorization": "Bearer s3cret"}
        )
        assert status == 200, body


def test_server_arguments(backend):
    with pytest.raises(TypeError, match="max_nn"):
        Server(backend, max_nn=3)
    with pytest.raises(ValueError, match="max_n"):
        Server(backend, max_n=0)
    with pytest.raises(TypeError, match="Backend"):
        Server(object())
    srv = Server(backend)
    assert srv.url.startswith("http://127.0.0.1:")  # localhost unless told otherwise
    srv.stop()  # stopping a server never started is a no-op
