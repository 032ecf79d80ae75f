"""/tokenize, /detokenize and /version (vLLM's shapes) on the bundled model's tokenizer (the
session's CPU runtime), with the 400s naming the field."""

from __future__ import annotations

from serve_http import assert_error, post_json, request

import lmprog


def test_tokenize_detokenize_version(server, rt):
    status, body = post_json(server.url, "/tokenize", {"prompt": "Hello world"})
    assert status == 200, body
    assert body["tokens"] == list(rt.tokenizer.encode("Hello world"))
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] > 0
    status, back = post_json(server.url, "/detokenize", {"tokens": body["tokens"]})
    assert (status, back) == (200, {"prompt": "Hello world"})
    messages = [{"role": "user", "content": "Hi"}]
    status, chat = post_json(
        server.url, "/tokenize", {"model": server.model_name, "messages": messages}
    )
    prompt = rt.chat_template.render(messages, add_generation_prompt=True)
    assert chat["tokens"] == list(rt.tokenizer.encode(prompt, add_special_tokens=False))
    status, plain = post_json(
        server.url, "/tokenize", {"messages": messages, "add_generation_prompt": False}
    )
    assert plain["count"] < chat["count"]
    assert request(server.url, "GET", "/version") == (200, {"version": lmprog.__version__})


def test_bad_token_input(server):
    status, body = post_json(server.url, "/detokenize", {"tokens": [1, 10**9]})
    assert_error(status, body, 400, param="tokens[1]")
    status, body = post_json(server.url, "/detokenize", {"tokens": "abc"})
    assert_error(status, body, 400, param="tokens")
    status, body = post_json(server.url, "/tokenize", {})
    assert_error(status, body, 400, param="prompt")
    status, body = post_json(server.url, "/tokenize", {"prompt": "x", "model": "other"})
    assert_error(status, body, 404, param="model")
