"""What SGLang's own frontend asks of `lmprog serve`'s native API, on both backends (issue 38,
section 2): prompt logprobs (its `select`) on llama.cpp too, /concate_and_append_request,
streamed meta_info with completion_tokens and each chunk's logprobs, /server_info and
/get_server_info, /flush_cache, and stop_regex."""

from __future__ import annotations

import json
import math

import pytest
from serve_http import assert_error, post_json, request

import lmprog as lp

pytestmark = pytest.mark.e2e

PROMPT = "The capital of France is"


@pytest.fixture(scope="module", params=["llamacpp", "runtime"])
def backend(request, rt):
    if request.param == "runtime":
        yield rt
        return
    pytest.importorskip("llama_cpp", reason="the llama.cpp backend is not installed")
    backend = lp.LlamaCpp()
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def server(backend):
    from lmprog.serve import Server

    with Server(backend, stats_interval_s=None).start() as srv:
        yield srv


def generate(server, payload):
    status, body = post_json(server.url, "/generate", payload)
    assert status == 200, body
    return body


def test_prompt_logprobs_agree_with_the_generated_tokens_logprob(backend, server):
    """A token's logprob as the prompt's last token (input_token_logprobs) is its logprob
    when it was generated there (output_token_logprobs)."""
    first = generate(
        server,
        {
            "text": PROMPT,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_logprob": True,
            "return_text_in_logprobs": True,
        },
    )
    [[logprob, token, text]] = first["meta_info"]["output_token_logprobs"]
    ids = list(backend.tokenizer.encode(PROMPT)) + [token]
    out = generate(
        server,
        {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 3,
            "return_text_in_logprobs": True,
        },
    )
    meta = out["meta_info"]
    entries = meta["input_token_logprobs"]
    assert [e[1] for e in entries] == ids and entries[0][0] is None  # position 0 has none
    assert math.isclose(entries[-1][0], logprob, abs_tol=2e-3) and entries[-1][2] == text
    tops = meta["input_top_logprobs"][-1]
    assert len(tops) == 3 and tops[0][0] >= tops[1][0] >= tops[2][0]
    assert tops[0][1] == token and math.isclose(tops[0][0], entries[-1][0], abs_tol=1e-5)


def test_sglangs_select_runs_on_the_endpoint_as_in_process(backend, server):
    @lp.function
    def pick(s):
        s += "Determine whether the statement is True or False.\n"
        s += "Statement: The capital of Germany is Berlin.\nAnswer:"
        s += lp.select("answer", ["True", "False", "Unknown"])

    endpoint = lp.RuntimeEndpoint(server.url)
    remote, local = pick.run(backend=endpoint), pick.run(backend=backend)
    assert remote["answer"] == local["answer"]
    for a, b in zip(
        remote.get_meta_info("answer")["normalized_prompt_logprobs"],
        local.get_meta_info("answer")["normalized_prompt_logprobs"],
    ):
        assert math.isclose(a, b, abs_tol=2e-3)


def test_concate_and_append_request_is_answered(server):
    body = {"src_rids": ["a", "b"], "dst_rid": "p"}
    status, out = post_json(server.url, "/concate_and_append_request", body)
    assert status == 200 and out["success"] is True
    status, out = post_json(server.url, "/concate_and_append_request", {"src_rids": "a"})
    assert_error(status, out, 400)


def test_streamed_chunks_carry_completion_tokens_and_their_own_logprobs(server):
    payload = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": 12, "temperature": 0},
        "return_logprob": True,
        "top_logprobs_num": 2,
        "stream": True,
    }
    status, raw = request(server.url, "POST", "/generate", json.dumps(payload).encode())
    assert status == 200
    lines = [line[6:] for line in raw.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(line) for line in lines[:-1]]
    whole = generate(server, {**payload, "stream": False})["meta_info"]
    previous, logprobs = 0, []
    for event in events[:-1]:
        meta = event["meta_info"]
        chunk = meta["output_token_logprobs"]
        assert meta["completion_tokens"] == meta["output_token_logprobs_length"]
        assert len(chunk) == meta["completion_tokens"] - previous  # SGLang's test_stream_logprobs
        assert len(meta["output_top_logprobs"]) == len(chunk)
        previous = meta["completion_tokens"]
        logprobs += chunk
    last = events[-1]["meta_info"]
    assert last["output_token_logprobs_length"] == last["completion_tokens"] == 12
    logprobs += last["output_token_logprobs"]  # those the pieces did not send
    assert [e[1] for e in logprobs] == [e[1] for e in whole["output_token_logprobs"]]


def test_server_info_and_flush_cache(backend, server):
    for path in ("/server_info", "/get_server_info"):
        status, info = request(server.url, "GET", path)
        assert status == 200, info
        assert info["model_path"] == server.model_name == info["tokenizer_path"]
        assert info["backend"] == type(backend).__name__
    assert request(server.url, "POST", "/flush_cache", b'{"empty_cache": true}')[0] == 200
    endpoint = lp.RuntimeEndpoint(server.url)
    assert endpoint.get_server_info()["model_path"] == server.model_name
    assert endpoint.flush_cache() is True


def test_stop_regex_ends_the_output(server):
    out = generate(
        server,
        {
            "text": "Count: 1, 2, 3,",
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "stop_regex": r"\b6\b"},
        },
    )
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": r"\b6\b"}
    assert out["text"].rstrip().endswith("6")  # kept, as SGLang keeps it
    status, body = post_json(
        server.url, "/generate", {"text": "a", "sampling_params": {"stop_regex": "("}}
    )
    assert_error(status, body, 400)
