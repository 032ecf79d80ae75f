"""The server end to end: the official `openai` client against lmprog.serve.Server on the
default model (lp.Runtime on the CPU), on a loopback port. Outputs are checked against the
same work done in process, so the HTTP layer must neither change nor lose anything. (Tool
calls: test_tools_e2e.py.)"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from serve_http import assert_error, post_json

from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams
from lmprog.serve import Server

pytestmark = pytest.mark.e2e

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def in_process(rt, prompt, **params) -> str:
    return rt.generate(GenerateRequest(prompt, SamplingParams(**params))).text


def chat_prompt(rt, messages) -> str:
    return rt.chat_template.render(messages, add_generation_prompt=True)


def test_completion_matches_in_process(rt, client, model):
    r = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert r.choices[0].text == in_process(
        rt, "The capital of France is", max_tokens=6, temperature=0
    )
    assert r.usage.completion_tokens == 6 and r.usage.prompt_tokens == 5
    assert r.choices[0].finish_reason == "length"


def test_chat_uses_the_models_template(rt, client, model):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a color."},
    ]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    expected = in_process(rt, chat_prompt(rt, messages), max_tokens=8, temperature=0)
    assert r.choices[0].message.content == expected and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(
        rt.tokenizer.encode(chat_prompt(rt, messages), add_special_tokens=False)
    )


def test_stop_strings(client, model):
    r = client.completions.create(
        model=model, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[" 7"]
    )
    assert r.choices[0].text == " 5, 6," and r.choices[0].finish_reason == "stop"


def test_chat_streaming(client, model):
    kwargs = dict(
        model=model,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=10,
        temperature=0,
    )
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == whole and sum(1 for p in pieces if p) >= 3  # really streamed
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_completion_streaming_n(client, model):
    stream = client.completions.create(
        model=model,
        prompt="Once upon a time",
        max_tokens=5,
        n=2,
        temperature=0.8,
        seed=3,
        stream=True,
    )
    texts, reasons = {0: "", 1: ""}, {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    whole = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=5, n=2, temperature=0.8, seed=3
    )
    assert [texts[0], texts[1]] == [c.text for c in whole.choices]
    assert reasons == {0: "length", 1: "length"}


def test_json_schema(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON},
        },
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("strict", [None, True, False])
def test_json_schema_strict(client, model, strict):
    """Issue 28: a schema that does not close its object gets only the listed keys unless
    `strict: false` asks for JSON Schema's reading (this model then invents keys)."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    format_ = {"name": "Person", "schema": schema}
    if strict is not None:
        format_["strict"] = strict
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a person named Ava as JSON."}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": format_},
    )
    choice = r.choices[0]
    if strict is False:  # (its grammar lets the model go on with other keys)
        assert choice.message.content.startswith('{ "name": "Ava", "age": 25, ')
        return
    assert choice.finish_reason == "stop"
    assert json.loads(choice.message.content) == {"name": "Ava", "age": 25}


def test_json_object(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a cat as JSON with keys name and color."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_regex_extension_on_completions(client, model):
    r = client.completions.create(
        model=model,
        prompt="Today's date:",
        max_tokens=20,
        temperature=0,
        extra_body={"regex": r"\d{4}-\d{2}-\d{2}"},
    )
    assert len(r.choices[0].text) == 10 and r.choices[0].text[4] == "-"


def test_chat_logprobs(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say yes or no."}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert r.choices[0].finish_reason == "stop"  # the end-of-turn token: counted, not in the text
    assert len(content) == r.usage.completion_tokens - 1 and content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.logprob == pytest.approx(
            max(a.logprob for a in t.top_logprobs), abs=1e-5
        )  # greedy
        assert bytes(t.bytes).decode() == t.token


def test_echo_prompt_logprobs_score_like_in_process(rt, client, model):
    """What the endpoint backend does to score `select` choices: echo, logprobs, max_tokens=0."""
    prompt = "The capital of France is Paris"
    r = client.completions.create(model=model, prompt=prompt, max_tokens=0, echo=True, logprobs=2)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == prompt and "".join(lp.tokens) == prompt
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ids = rt.tokenizer.encode(prompt, add_special_tokens=False)
    ref = rt.generate([ids], SamplingParams(max_tokens=0), logprob_start_len=0)[0].prompt_logprobs
    assert lp.token_logprobs[1:] == pytest.approx([t.logprob for t in ref], abs=1e-4)
    assert all(len(t) == 2 for t in lp.top_logprobs[1:])
    r = client.completions.create(
        model=model, prompt=prompt, max_tokens=3, echo=True, logprobs=0, temperature=0
    )
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(prompt) and len(lp.tokens) == len(ids) + 3
    assert lp.top_logprobs is None and lp.text_offset[len(ids)] == len(prompt)


def test_n_and_seed(client, model):
    kwargs = dict(
        model=model,
        prompt="My favourite animal is the",
        max_tokens=6,
        temperature=1.0,
        n=3,
        seed=1234,
    )
    a = [c.text for c in client.completions.create(**kwargs).choices]
    b = [c.text for c in client.completions.create(**kwargs).choices]
    assert len(a) == 3 and a == b  # the same seed gives the same choices
    assert len(set(a)) > 1  # seed, seed+1, seed+2: not three copies
    c = [c.text for c in client.completions.create(**{**kwargs, "seed": 99}).choices]
    assert c != a


def test_sixteen_concurrent_clients(rt, server, model):
    topics = [
        "cats",
        "dogs",
        "rain",
        "the sea",
        "bread",
        "music",
        "trees",
        "snow",
        "stars",
        "trains",
        "bees",
        "tea",
        "rivers",
        "clocks",
        "maps",
        "salt",
    ]
    barrier = threading.Barrier(16)

    def one(topic):
        client = openai.OpenAI(
            base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
        )
        barrier.wait()
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"A fact about {topic}."}],
            max_tokens=8,
            temperature=0,
            stream=True,
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    steps_before = rt.stats()["steps"]
    with ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(one, topics))
    assert all(texts)
    # batched together: far fewer engine steps than 16 requests x 8 tokens one by one
    assert rt.stats()["steps"] - steps_before < 16 * 8 / 2


def test_bad_requests_on_the_model(rt, client, server, model):
    too_long = "word " * 9000  # the context is 8192 tokens
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model, prompt=too_long, max_tokens=2)
    assert info.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": too_long}], max_tokens=2, stream=True
        )
    status, body = post_json(
        server.url, "/v1/completions", {"model": model, "prompt": [10**9], "max_tokens": 1}
    )
    assert_error(status, body, 400, param="prompt")
    status, body = post_json(
        server.url,
        "/v1/completions",
        {"model": model, "prompt": [1, 10**9], "echo": True, "logprobs": 1, "max_tokens": 0},
    )
    assert_error(status, body, 400, param="prompt")
    for path, payload in (  # a JSON escape of a lone surrogate: not text a tokenizer takes
        ("/v1/completions", {"model": model, "prompt": "hi \ud800", "max_tokens": 1}),
        ("/v1/chat/completions",
         {"model": model, "messages": [{"role": "user", "content": "x\udc80"}], "max_tokens": 1}),
    ):  # fmt: skip
        status, body = post_json(server.url, path, payload)
        err = assert_error(status, body, 400)
        assert "lone surrogate" in err["message"] and "TextEncodeInput" not in err["message"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="/etc/passwd", prompt="hi", max_tokens=1)
    assert client.completions.create(model=model, prompt="Hi", max_tokens=2).choices[0].text


def test_api_key_with_the_openai_client(rt):
    with Server(rt, api_key="k-123").start() as srv:
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="k-123", max_retries=0)
        assert [m.id for m in good.models.list()] == [srv.model_name]


def test_disconnect_mid_stream_frees_the_request(rt, server, model):
    body = json.dumps(
        {
            "model": model,
            "prompt": "Tell me a long story.",
            "max_tokens": 400,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    aborted = rt.stats()["requests_finished"]["abort"]
    generated = rt.stats()["generated_tokens"]  # the session's runtime: counted since it started
    sock = socket.create_connection((server.host, server.port))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    received = b""
    while received.count(b"data:") < 3:
        received += sock.recv(4096)
    assert b"200 OK" in received and rt.stats()["num_running"] == 1
    sock.close()
    deadline = time.monotonic() + 10
    while rt.stats()["num_running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = rt.stats()
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert stats["requests_finished"]["abort"] == aborted + 1
    assert stats["generated_tokens"] - generated < 400  # it did not run to its end
