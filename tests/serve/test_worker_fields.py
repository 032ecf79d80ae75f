"""What SGLang's router adds to the bodies it forwards and calls on a worker (issue 35,
section 1), on the in-process server: accepted at lmprog's behaviour, refused (400 naming the
field) otherwise; /get_load in SGLang's shape; /model_info as /get_model_info."""

from __future__ import annotations

import logging

import pytest
from serve_http import assert_error, post_json, request

from lmprog.serve.sglang.load_report import load_report


@pytest.fixture(scope="module")
def server():
    import lmprog as lp
    from lmprog.serve.server import Server

    backend = lp.LlamaCpp(n_ctx=1024)
    with Server(backend) as srv:
        yield srv
    backend.shutdown()


# exactly what sglang-router 0.3.2 sends (read from its requests)
ROUTER_GENERATE = {
    "model": None,
    "return_text_in_logprobs": False,
    "stream": False,
    "log_metrics": True,
    "return_hidden_states": False,
    "background": False,
    "no_logs": False,
    "return_bytes": False,
    "return_entropy": False,
}
ROUTER_CHAT = {
    "logprobs": False,
    "stream": False,
    "no_stop_trim": False,
    "ignore_eos": False,
    "continue_final_message": False,
    "skip_special_tokens": True,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_hidden_states": False,
}
ROUTER_COMPLETION = {
    "stream": False,
    "echo": False,
    "no_stop_trim": False,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "return_hidden_states": False,
}


def test_generate_takes_the_routers_fields(server):
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 3}, **ROUTER_GENERATE}
    status, out = post_json(server.url, "/generate", body)
    assert status == 200, out  # was 400 "Unrecognized request argument supplied: model"
    assert out["meta_info"]["completion_tokens"] <= 3
    status, out = post_json(server.url, "/generate", {**body, "model": server.model_name})
    assert status == 200, out
    status, out = post_json(server.url, "/generate", {**body, "model": "another"})
    assert_error(status, out, 404, param="model", code="model_not_found")


@pytest.mark.parametrize(
    "field, value",
    [
        ("return_hidden_states", True),
        ("return_entropy", True),
        ("return_bytes", True),
        ("background", True),
        ("data_parallel_rank", 1),
    ],
)
def test_generate_refuses_what_it_cannot_do(server, field, value):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1}, field: value}
    status, out = post_json(server.url, "/generate", body)
    err = assert_error(status, out, 400, param=field)
    assert "lmprog" in err["message"]
    body[field] = 0 if field == "data_parallel_rank" else False
    assert post_json(server.url, "/generate", body)[0] == 200


def test_openai_routes_know_the_routers_fields(server, caplog):
    caplog.set_level(logging.WARNING, logger="lmprog.serve")
    chat = {
        "model": server.model_name,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_completion_tokens": 3,
        **ROUTER_CHAT,
    }
    status, out = post_json(server.url, "/v1/chat/completions", chat)
    assert status == 200, out
    completion = {"model": server.model_name, "prompt": "Hi", "max_tokens": 3}
    status, out = post_json(server.url, "/v1/completions", {**completion, **ROUTER_COMPLETION})
    assert status == 200, out
    assert not [r for r in caplog.records if "unknown request field" in r.getMessage()]
    for field, value in (("no_stop_trim", True), ("skip_special_tokens", False)):
        status, out = post_json(server.url, "/v1/completions", {**completion, field: value})
        assert_error(status, out, 400, param=field)
    for field, value in (("continue_final_message", True), ("stream_reasoning", False)):
        status, out = post_json(server.url, "/v1/chat/completions", {**chat, field: value})
        assert_error(status, out, 400, param=field)


def test_load_and_metadata_routes(server):
    status, loads = request(server.url, "GET", "/get_load")
    assert status == 200 and isinstance(loads, list) and len(loads) == 1, loads
    entry = loads[0]
    assert entry["dp_rank"] == 0
    assert {"num_reqs", "num_waiting_reqs", "num_tokens", "kv_capacity"} <= set(entry)
    assert entry["kv_capacity"] > 0 and entry["num_reqs"] >= entry["num_waiting_reqs"] >= 0
    assert request(server.url, "GET", "/model_info") == request(
        server.url, "GET", "/get_model_info"
    )
    status, info = request(server.url, "GET", "/server_info")
    assert status == 200 and info["dp_size"] == 1 and info["served_model_name"] == server.model_name


def test_load_report_sums_what_the_backend_counts():
    stats = {"num_running": 3, "num_waiting": 2, "kv_used": 700, "kv_capacity": 4096}
    (entry,) = load_report(stats)
    assert (entry["num_reqs"], entry["num_waiting_reqs"], entry["num_tokens"]) == (5, 2, 700)
    assert load_report({})[0]["num_reqs"] == 0
