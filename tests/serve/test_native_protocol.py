"""SGLang's native HTTP protocol both ways, on loopback with the default model (issue 15):
`lmprog serve` answers a client written from the protocol (POST /generate, GET
/get_model_info, /flush_cache, /health_generate; SSE streaming; prompt and output
logprobs), and `lp.RuntimeEndpoint` runs lmprog programs against it with the same results
as in process."""

from __future__ import annotations

import json
import math

import pytest
from serve_http import assert_error, post_json, request

import lmprog as lp
from lmprog.core.errors import BackendError
from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams

pytestmark = pytest.mark.e2e

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def endpoint(server):
    return lp.RuntimeEndpoint(server.url)


def generate(server, payload):
    status, body = post_json(server.url, "/generate", payload)
    assert status == 200, body
    return body


def sse_events(raw: str) -> list:
    """The payloads of an SSE body, as SGLang's clients read it: `data: ...` lines."""
    lines = [line[len("data: ") :] for line in raw.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


# ---- the server, from the protocol ------------------------------------------------------


def test_get_model_info_names_the_model(server):
    status, info = request(server.url, "GET", "/get_model_info")
    assert status == 200
    assert info["model_path"] == server.model_name and info["is_generation"] is True


def test_generate_returns_text_output_ids_and_meta_info(rt, server):
    out = generate(
        server, {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    )
    ref = rt.generate(GenerateRequest(PROMPT, SamplingParams(max_tokens=8, temperature=0)))
    assert out["text"] == ref.text and out["output_ids"] == list(ref.token_ids)
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == ref.prompt_tokens and meta["completion_tokens"] == 8
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert isinstance(meta["id"], str) and meta["e2e_latency"] >= 0


def test_a_stop_string_is_the_matched_finish_reason(server):
    out = generate(
        server,
        {
            "text": "1, 2, 3, 4,",
            "sampling_params": {"max_new_tokens": 16, "temperature": 0, "stop": [" 6"]},
            "rid": "my-request",
        },
    )
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": " 6"}
    assert out["meta_info"]["id"] == "my-request" and " 6" not in out["text"]


def test_sglang_frontends_null_fields_are_accepted(server):
    # SGLang's RuntimeEndpoint sends every sampling field, unset ones as null or [].
    params = {
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
        "max_new_tokens": 4,
        "min_new_tokens": 0,
        "n": 1,
        "stop": [],
        "stop_token_ids": None,
        "stop_regex": None,
        "temperature": 0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "ignore_eos": False,
        "regex": None,
        "json_schema": None,
    }
    out = generate(server, {"text": PROMPT, "sampling_params": params})
    assert out["meta_info"]["completion_tokens"] <= 4


def test_a_batch_answers_a_list_in_order_with_per_prompt_params(rt, server):
    texts = [PROMPT, "One, two,"]
    outs = generate(
        server,
        {
            "text": texts,
            "sampling_params": [
                {"max_new_tokens": 3, "temperature": 0},
                {"max_new_tokens": 5, "temperature": 0},
            ],
        },
    )
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [3, 5]
    ref = rt.generate(GenerateRequest(texts[1], SamplingParams(max_tokens=5, temperature=0)))
    assert outs[1]["text"] == ref.text


def test_input_ids_prompts(rt, server):
    ids = list(rt.tokenizer.encode(PROMPT))
    out = generate(
        server, {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    )
    ref = rt.generate(GenerateRequest(PROMPT, SamplingParams(max_tokens=4, temperature=0)))
    assert out["text"] == ref.text


def test_streaming_sends_the_text_so_far_then_done(rt, server):
    payload = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": 8, "temperature": 0},
        "stream": True,
    }
    status, raw = request(server.url, "POST", "/generate", json.dumps(payload).encode())
    assert status == 200
    events = sse_events(raw)
    ref = rt.generate(GenerateRequest(PROMPT, SamplingParams(max_tokens=8, temperature=0)))
    texts = [e["text"] for e in events]
    assert len(events) > 2 and texts[-1] == ref.text
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative, as SGLang's
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_return_logprob_gives_prompt_logprobs_from_logprob_start_len(rt, server):
    ids = list(rt.tokenizer.encode(PROMPT))
    out = generate(
        server,
        {
            "text": PROMPT,
            "sampling_params": {"max_new_tokens": 2, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 2,
            "return_text_in_logprobs": True,
        },
    )
    meta = out["meta_info"]
    inputs = meta["input_token_logprobs"]
    assert [e[1] for e in inputs] == ids and inputs[0][0] is None  # position 0 has none
    ref = rt.generate([ids], SamplingParams(max_tokens=0), logprob_start_len=0)[0]
    assert all(
        math.isclose(e[0], r.logprob, abs_tol=1e-4) for e, r in zip(inputs[1:], ref.prompt_logprobs)
    )
    assert "".join(e[2] for e in inputs) == PROMPT
    assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"]
    assert len(meta["output_top_logprobs"]) == 2 and len(meta["output_top_logprobs"][0]) == 2
    assert len(meta["input_top_logprobs"]) == len(ids)
    # from a later position: positions start..end, the same values
    later = generate(
        server,
        {
            "text": PROMPT,
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": 3,
        },
    )["meta_info"]
    assert [e[1] for e in later["input_token_logprobs"]] == ids[3:]
    assert all(
        math.isclose(a[0], b[0], abs_tol=1e-4)
        for a, b in zip(later["input_token_logprobs"], inputs[3:])
    )
    assert len(later["input_token_logprobs"]) == len(ids) - 3


def test_sglang_frontends_select_requests(rt, server):
    # What SGLang's RuntimeEndpoint.select sends: the prompt with max_new_tokens=0 for its
    # length, then every prompt + choice with logprob_start_len = length - 2.
    prompt = "Q: Is the sky blue? A:"
    first = generate(server, {"text": prompt, "sampling_params": {"max_new_tokens": 0}})
    length = first["meta_info"]["prompt_tokens"]
    assert length == len(rt.tokenizer.encode(prompt))
    outs = generate(
        server,
        {
            "text": [prompt + c for c in (" Yes", " No")],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "return_text_in_logprobs": True,
            "logprob_start_len": length - 2,
        },
    )
    for out in outs:
        entries = out["meta_info"]["input_token_logprobs"]
        assert len(entries) == 3 and all(isinstance(e[2], str) for e in entries)
        assert out["meta_info"]["output_token_logprobs"] == []
        assert out["meta_info"]["cached_tokens"] > 0  # the prompt was cached by the first call


def test_regex_and_json_schema_constrain_the_output(server):
    out = generate(
        server,
        {
            "text": "My phone number is ",
            "sampling_params": {"max_new_tokens": 16, "regex": r"[0-9]{3}-[0-9]{4}"},
        },
    )
    assert len(out["text"]) == 8 and out["text"][3] == "-"
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    out = generate(
        server,
        {
            "text": "Answer in JSON: ",
            "sampling_params": {"max_new_tokens": 32, "json_schema": json.dumps(schema)},
        },
    )
    assert isinstance(json.loads(out["text"])["ok"], bool)


def test_flush_cache_and_health_generate(server):
    assert request(server.url, "POST", "/flush_cache", b'{"empty_cache": true}')[0] == 200
    assert request(server.url, "GET", "/flush_cache")[0] == 200
    assert request(server.url, "GET", "/health_generate")[0] == 200


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"sampling_params": {"max_new_tokens": 1}}, "text"),  # no prompt
        ({"text": "a", "input_ids": [1]}, "text"),  # both
        ({"text": "a", "sampling_params": {"spaces_between_special_tokens": False}}, None),
        ({"text": "a", "sampling_params": {"max_new_tokens": "5"}}, None),
        ({"text": "a", "sampling_params": {"regex": "(unclosed"}}, "sampling_params.regex"),
        ({"text": "a", "sampling_params": {"regex": "a", "ebnf": "root ::= 'a'"}}, None),
        ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
        ({"text": "a", "image_data": "cat.png"}, None),
        ({"text": "a", "sampling_params": {"max_new_tokens": 10**6}}, None),
    ],
)
def test_bad_requests_are_400s_in_the_servers_error_shape(server, payload, param):
    status, body = post_json(server.url, "/generate", payload)
    assert_error(status, body, 400, param=param)


def test_lora_path_of_no_adapter_is_a_404(server):
    """SGLang's lora_path names an adapter; this server loaded none (tests/serve/
    test_lora_serve.py serves some)."""
    status, body = post_json(server.url, "/generate", {"text": "a", "lora_path": "x"})
    assert_error(status, body, 404, param="lora_path", code="lora_not_found")


# ---- lp.RuntimeEndpoint against lmprog serve ----------------------------------------------


@lp.function
def qa(s, question):
    s += lp.system("You are a terse assistant.")
    s += lp.user(question)
    s += lp.assistant(lp.gen("answer", max_tokens=12, stop="\n"))
    s += lp.user("Is that right? Yes or no.")
    s += lp.assistant(lp.select("verdict", choices=["Yes", "No"]))
    s += (
        "\nAge: "
        + lp.gen_int("age", 4)
        + "\nName: "
        + lp.gen("name", max_tokens=8, regex="[A-Z][a-z]+")
    )


def test_a_program_on_the_endpoint_matches_in_process(rt, endpoint):
    local = qa.run(question="Capital of France?", temperature=0, backend=rt)
    remote = qa.run(question="Capital of France?", temperature=0, backend=endpoint)
    assert remote.text() == local.text()
    for name in ("answer", "verdict", "age", "name"):
        assert remote[name] == local[name]
    scores = remote.get_meta_info("verdict")["normalized_scores"]
    assert all(
        math.isclose(a, b, abs_tol=1e-4)
        for a, b in zip(scores, local.get_meta_info("verdict")["normalized_scores"])
    )
    assert (
        remote.get_meta_info("answer")["prompt_tokens"]
        == local.get_meta_info("answer")["prompt_tokens"]
    )


def test_streaming_logprobs_and_unconditional_select_on_the_endpoint(rt, endpoint):
    @lp.function
    def prog(s):
        s += "The capital of France is" + lp.gen("x", max_tokens=6, return_logprob=True)
        s += " So: " + lp.select(
            "c", choices=["yes", "no"], choices_method=lp.unconditional_likelihood_normalized
        )

    local = prog.run(temperature=0, backend=rt)
    remote = prog.run(temperature=0, backend=endpoint, stream=True)
    pieces = list(remote.text_iter("x"))
    assert len(pieces) > 1 and "".join(pieces) == local["x"]
    remote_lps = remote.get_meta_info("x")["output_token_logprobs"]
    local_lps = local.get_meta_info("x")["output_token_logprobs"]
    assert [t.token_id for t in remote_lps] == [t.token_id for t in local_lps]
    assert remote["c"] == local["c"]


def test_run_batch_caches_the_prefix_and_token_usage_counts(endpoint):
    endpoint.token_usage.reset()
    states = qa.run_batch(
        [{"question": "Capital of Italy?"}, {"question": "Capital of Spain?"}],
        temperature=0,
        backend=endpoint,
    )
    assert all(s.error() is None for s in states)
    assert endpoint.token_usage.completion_tokens > 0
    assert endpoint.token_usage.prompt_tokens >= sum(
        s.get_meta_info("answer")["prompt_tokens"] for s in states
    )
    assert endpoint.flush_cache() is True


def test_endpoint_errors_are_clear(server, endpoint):
    with pytest.raises(ValueError, match="http"):
        lp.RuntimeEndpoint("localhost:30000")
    with pytest.raises(BackendError, match="is the server running"):
        lp.RuntimeEndpoint("http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(BackendError, match="max_new_tokens"):
        endpoint.generate(GenerateRequest("Hi", SamplingParams(max_tokens=100_000)))
    assert endpoint.generate(GenerateRequest("Hi", SamplingParams(max_tokens=1))).text is not None
