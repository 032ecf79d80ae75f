"""Tool calling over HTTP on a toy backend that answers with fixed text: each family's
calls read back from its own syntax (whole and streamed, raw SSE), the prompt each template
gets, and bad tool input as 400s in OpenAI's error shape naming the field, the server
serving on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from fakes import FakeBackend
from serve_http import assert_error, post_json, request

from lmprog.serve import Server

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
END = "<END>"  # the toy's text ends with it: a stop string, so its choices finish with "stop"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Time in a timezone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}
USER = [{"role": "user", "content": "Weather in Oslo, and the time in CET?"}]
CALLS = [("get_weather", {"city": "Oslo"}), ("get_time", {"tz": "CET"})]
WRITTEN = {  # the two calls as each family's model writes them
    "qwen2.5.jinja": "\n".join(
        f'<tool_call>\n{{"name": "{n}", "arguments": {json.dumps(a)}}}\n</tool_call>'
        for n, a in CALLS
    ),
    "mistral-v0.3.jinja": "[TOOL_CALLS] ["
    + ", ".join(f'{{"name": "{n}", "arguments": {json.dumps(a)}}}' for n, a in CALLS)
    + "]",
    "chatml": "\n".join(f'{{"name": "{n}", "arguments": {json.dumps(a)}}}' for n, a in CALLS),
}


class Scripted:
    """What the toy backend answers next (one text for every choice)."""

    text = ""

    def __call__(self, _request: Any) -> str:
        return self.text + END


@pytest.fixture(scope="module", params=sorted(WRITTEN))
def served(request):
    name = request.param
    source = name if name == "chatml" else (TEMPLATES / name).read_text()
    script = Scripted()
    backend = FakeBackend(responder=script, template=source)
    with Server(backend, model_name="toy").start() as srv:
        yield name, srv.url, backend, script


def chat(url: str, **kw: Any) -> dict[str, Any]:
    body = {"model": "toy", "messages": USER, "tools": [WEATHER, TIME], "stop": [END], **kw}
    status, out = post_json(url, "/v1/chat/completions", body)
    assert status == 200, out
    return out


def events(url: str, **kw: Any) -> list[dict[str, Any]]:
    body = {
        "model": "toy",
        "messages": USER,
        "tools": [WEATHER, TIME],
        "stop": [END],
        "stream": True,
        **kw,
    }
    status, text = request(url, "POST", "/v1/chat/completions", json.dumps(body).encode())
    assert status == 200, text
    lines = [line[len("data: ") :] for line in text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_each_familys_calls_are_read_back(served):
    name, url, backend, script = served
    script.text = WRITTEN[name]
    out = chat(url, tool_choice="required")
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (n, a) for n, a in CALLS
    ]
    assert all(c["type"] == "function" for c in calls)
    if name.startswith("mistral"):
        assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in calls)
    prompt = str(backend.requests[-1].prompt)
    note = "You can call these functions" in prompt
    assert note == (name == "chatml")  # lmprog's note only where the template has no tool syntax
    assert "get_time" in prompt


def test_streamed_calls_arrive_as_openai_sends_them(served):
    name, url, _, script = served
    script.text = WRITTEN[name]
    chunks = events(url, tool_choice="required")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    firsts = [d["tool_calls"][0] for d in deltas if "id" in d["tool_calls"][0]]
    assert [f["function"] for f in firsts] == [
        {"name": "get_weather", "arguments": ""},
        {"name": "get_time", "arguments": ""},
    ]
    assert [f["index"] for f in firsts] == [0, 1] and all(f["type"] == "function" for f in firsts)
    arguments = ["", ""]
    for d in deltas:
        [tc] = d["tool_calls"]
        if "id" not in tc:
            assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
            arguments[tc["index"]] += tc["function"]["arguments"]
    assert [json.loads(a) for a in arguments] == [a for _, a in CALLS]
    assert chunks[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "tool_calls",
    }


def test_an_answer_under_auto_is_content(served):
    _, url, _, script = served
    script.text = "It is sunny in Oslo."
    choice = chat(url)["choices"][0]
    assert (
        choice["message"]["content"] == "It is sunny in Oslo." and choice["finish_reason"] == "stop"
    )
    assert "tool_calls" not in choice["message"]
    chunks = events(url)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "It is sunny in Oslo."
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) > 1


def test_a_cut_call_is_text_with_the_openai_client(served):
    """A call cut short is never a call (its arguments would not parse): its text is the
    content, finish_reason the backend's."""
    name, url, _, script = served
    script.text = WRITTEN[name][: WRITTEN[name].index("Oslo") + 2]  # then the toy stops
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(
        model="toy", messages=USER, tools=[WEATHER, TIME], stop=[END], tool_choice="required"
    )
    choice = r.choices[0]
    assert choice.message.content == script.text and choice.finish_reason == "stop"
    assert choice.message.tool_calls is None


# -- bad input ------------------------------------------------------------------------------


def still_serves(url: str) -> None:
    status, body = post_json(
        url, "/v1/chat/completions", {"model": "toy", "messages": USER, "max_tokens": 3}
    )
    assert status == 200, body


BAD = {"type": "function", "function": {"name": "bad", "parameters": {"type": "bogus"}}}


@pytest.mark.parametrize(
    "fields,param",
    [
        (
            {
                "tools": [WEATHER, BAD],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            },
            "tools[1].function.parameters",
        ),
        ({"tools": [WEATHER, BAD], "tool_choice": "none"}, "tools[1].function.parameters"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "x", "parameters": []}}]}, None),
        ({"tools": [{"type": "web_search"}]}, None),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_bad_tools_are_400s(served, fields, param):
    _, url, backend, _ = served
    before = len(backend.requests)
    status, body = post_json(
        url, "/v1/chat/completions", {"model": "toy", "messages": USER, **fields}
    )
    err = assert_error(status, body, 400, param=param)
    if param is None:
        assert err["param"] and err["param"].startswith("tools[0]"), err
    assert len(backend.requests) == before  # refused before reaching the backend
    still_serves(url)


def history(call_id: str, arguments: str, calls: int = 1) -> list[dict[str, Any]]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    return [
        *USER,
        {"role": "assistant", "tool_calls": [call] * calls},
        {"role": "tool", "tool_call_id": call_id, "content": "21 C"},
    ]


def test_bad_histories_are_400s(served):
    name, url, _, _ = served
    for messages, param in [
        (history("abcDEF123", "not json"), "messages[1].tool_calls"),
        (history("abcDEF123", "[1, 2"), "messages[1].tool_calls"),
    ]:
        status, body = post_json(
            url, "/v1/chat/completions", {"model": "toy", "messages": messages, "tools": [WEATHER]}
        )
        assert_error(status, body, 400, param=param)
    if name.startswith("mistral"):  # the template's own rule, as transformers raises it
        status, body = post_json(
            url,
            "/v1/chat/completions",
            {"model": "toy", "messages": history("call_1", "{}"), "tools": [WEATHER]},
        )
        err = assert_error(status, body, 400, param="messages")
        assert "length 9" in err["message"]
    still_serves(url)


def test_llama_templates_refuse_two_calls_in_one_message():
    source = (TEMPLATES / "llama3.2.jinja").read_text()
    with Server(FakeBackend(template=source), model_name="toy").start() as srv:
        two = history("c1", '{"city": "Oslo"}', calls=2)
        status, body = post_json(
            srv.url, "/v1/chat/completions", {"model": "toy", "messages": two, "tools": [WEATHER]}
        )
        err = assert_error(status, body, 400, param="messages")
        assert "single tool-calls" in err["message"]
        one = history("c1", '{"city": "Oslo"}')
        status, body = post_json(
            srv.url, "/v1/chat/completions", {"model": "toy", "messages": one, "tools": [WEATHER]}
        )
        assert status == 200, body
