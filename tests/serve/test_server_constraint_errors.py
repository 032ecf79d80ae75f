"""Constraints a client gets wrong are its 400s, and its compiles cannot starve anyone else's
(issue 29, sections 2 and 3). On llama.cpp (a tokenizer, so token indexes are built): limits
llguidance reaches are found where the constraint is built, never as a forbidden token sampled
(a 500); schemas refused while their index is built are 400s (were 500 internal_error); a
tool that can never be called is refused. On a toy backend: abandoned compiles stop, and one
client's compiles take at most its share of the compile pool."""

from __future__ import annotations

import gc
import http.client
import json
import threading
import time

import pytest
from fakes import FakeBackend
from serve_http import assert_error, post_json

from lmprog.core.errors import ConstraintError
from lmprog.fsm.deadline import tick
from lmprog.serve import Server, compile
from lmprog.serve.openai import chat_completions, completions

MODEL = "toy"
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
COMPLETION = {"prompt": "Hi", "max_tokens": 4}
ALTERNATIVES = "root ::= " + " | ".join(f'"w{i}"' for i in range(12_500))


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


@pytest.fixture(scope="module")
def llama():
    pytest.importorskip("llama_cpp")
    import lmprog as lp

    backend = lp.LlamaCpp(n_ctx=1024)
    with Server(backend, model_name=MODEL).start() as srv:
        yield srv.url
    backend.shutdown()


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {**COMPLETION, "regex": "a{1000000}"}),
        ("/v1/chat/completions", {**CHAT, "regex": "a{1000000}"}),
        ("/v1/chat/completions", {**CHAT, "regex": "a{1000000}", "stream": True}),
    ],
    ids=["completions", "chat", "chat-stream"],
)
def test_a_repetition_past_llguidance_is_a_400_not_a_forbidden_token(llama, path, body):
    status, reply = post_json(llama, path, {"model": MODEL, **body})
    assert_error(status, reply, 400, param="regex", code="invalid_regex")  # was 500


def test_a_grammar_of_12500_alternatives_is_a_400(llama):
    status, reply = post_json(
        llama, "/v1/completions", {"model": MODEL, **COMPLETION, "ebnf": ALTERNATIVES}
    )
    err = assert_error(status, reply, 400, param="ebnf", code="invalid_grammar")  # was 500
    assert "too many alternatives at one position" in err["message"]


@pytest.mark.parametrize(
    "schema", [{"$ref": "#"}, {"type": "number", "multipleOf": 1e-300}], ids=["ref", "multiple"]
)
def test_schemas_refused_by_the_index_are_400s_everywhere(llama, schema):
    status, reply = post_json(
        llama,
        "/v1/chat/completions",
        {"model": MODEL, **CHAT, "response_format": schema_format(schema)},
    )
    assert_error(  # was 500 internal_error, a traceback in the log
        status, reply, 400, param="response_format.json_schema.schema", code="invalid_schema"
    )
    status, reply = post_json(
        llama, "/v1/completions", {"model": MODEL, **COMPLETION, "json_schema": schema}
    )
    assert_error(status, reply, 400, param="json_schema", code="invalid_schema")
    status, reply = post_json(
        llama,
        "/generate",
        {"text": "Hi", "sampling_params": {"max_new_tokens": 4, "json_schema": json.dumps(schema)}},
    )
    assert_error(status, reply, 400, param="sampling_params.json_schema")


def test_a_tool_that_can_never_be_called_is_refused(llama):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}
    status, reply = post_json(
        llama, "/v1/chat/completions", {"model": MODEL, **CHAT, "tools": [tool]}
    )
    assert_error(  # was 200
        status, reply, 400, param="tools[0].function.parameters", code="invalid_schema"
    )


def test_an_object_of_1000_optional_properties_generates(llama):
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1000)}}
    status, reply = post_json(
        llama,
        "/v1/chat/completions",
        {"model": MODEL, **CHAT, "max_tokens": 12, "response_format": schema_format(schema)},
    )
    assert status == 200, reply  # was 500 'sampled a token the constraint forbids'
    assert reply["choices"][0]["message"]["content"].startswith("{")


# ---- compiles on the pool -------------------------------------------------------------------


def test_a_constraint_refused_while_its_index_builds_is_a_400(monkeypatch):
    def refuse(ctx, constraint):
        raise ConstraintError("no token can start it")

    monkeypatch.setattr(completions, "build_index", refuse)
    monkeypatch.setattr(chat_completions, "build_index", refuse)
    with Server(FakeBackend(), model_name=MODEL).start() as srv:
        status, reply = post_json(
            srv.url, "/v1/completions", {"model": MODEL, **COMPLETION, "regex": "[a-z]+"}
        )
        assert_error(status, reply, 400, param="regex", code="invalid_regex")
        status, reply = post_json(
            srv.url,
            "/v1/chat/completions",
            {"model": MODEL, **CHAT, "response_format": schema_format({"type": "integer"})},
        )
        assert_error(status, reply, 400, param="response_format", code="invalid_schema")


def test_abandoned_compiles_stop_and_the_next_request_compiles(monkeypatch):
    """The issue's run: two requests with a 1.2 MB enum of 100,000 strings time out, and
    their compiles, abandoned, kept both compile threads for minutes, so the next small
    schema timed out too, blaming itself."""
    values = [f"value-{i:06d}" for i in range(100_000)]
    big = {"model": MODEL, **CHAT, "response_format": schema_format({"enum": values})}
    assert len(json.dumps(big)) > 1_200_000
    with Server(FakeBackend(), model_name=MODEL, constraint_timeout_s=1.0).start() as srv:
        answers: list = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(post_json(srv.url, "/v1/chat/completions", big))
            )
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for status, reply in answers:
            assert_error(status, reply, 400, code="constraint_timeout")
        # the abandoned compiles leave millions of objects behind; in the full suite's
        # process a collection of them during the small compile took past its budget (CI):
        # collect here, so the budget measures the compile threads, which is the point
        gc.collect()
        small = {**CHAT, "model": MODEL, "response_format": schema_format({"type": "integer"})}
        # the small compile's 1 s includes its wait for a compile thread, which an abandoned
        # compile holds until its next check: on a busy machine (two test workers) the first
        # small request can still time out, but within seconds one compiles; with the bug
        # every one timed out for minutes
        deadline = time.monotonic() + 15
        while True:
            status, reply = post_json(srv.url, "/v1/chat/completions", small)
            if status == 200 or time.monotonic() > deadline:
                break
            # out of time waiting or compiling (a deadline met inside the compile reads
            # as "took longer than" the little time left)
            assert status == 400 and "took longer" in reply["error"]["message"], reply
        assert status == 200, reply


def test_one_clients_compiles_take_only_its_share_of_the_pool(monkeypatch):
    """A client with as many slow compiles as the pool has threads cannot make another
    client's compile wait: it runs at most half of them at once."""
    running, most = [0], [0]
    lock = threading.Lock()

    def build(ctx, constraint):
        if constraint is None or constraint.source != "slow[a-z]+":
            return
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            while True:  # a compile in Python, checking its deadline and flag as it works
                tick()
                time.sleep(0.0005)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(completions, "build_index", build)
    monkeypatch.setattr(chat_completions, "build_index", build)
    with Server(FakeBackend(), model_name=MODEL, constraint_timeout_s=3.0).start() as srv:
        slow = {"model": MODEL, **COMPLETION, "regex": "slow[a-z]+"}
        heavy = [
            threading.Thread(target=post_json, args=(srv.url, "/v1/completions", slow))
            for _ in range(compile._workers)
        ]
        for t in heavy:
            t.start()
        time.sleep(0.5)
        start = time.monotonic()
        status, reply = _post_from(
            "127.0.0.2", srv, {"model": MODEL, **COMPLETION, "regex": "[a-z]+"}
        )
        assert status == 200, reply  # another client: it had a thread at once
        assert time.monotonic() - start < 2
        for t in heavy:
            t.join(30)
        assert most[0] <= compile.per_client()
        stopped = time.monotonic() + 1
        while running[0] and time.monotonic() < stopped:
            time.sleep(0.01)
        assert running[0] == 0  # every abandoned compile stopped, within milliseconds


def _post_from(address: str, srv: Server, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=30, source_address=(address, 0))
    try:
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()
