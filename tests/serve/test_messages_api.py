"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through the
`anthropic` client, unchanged, against `lmprog serve` on loopback: a fake backend for the
shapes (system, multi-turn, tool_use / tool_result, tool_choice, stop_sequences, thinking
blocks, streaming event types, errors in Anthropic's shape, the API key), then the bundled
model (the session's CPU runtime) for streaming, tools and thinking end to end."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest
from fakes import FakeBackend
from serve_http import post_json, request

from lmprog.serve import Server

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
THINK = (TEMPLATES / "chatml-think.jinja").read_text()
WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def client_for(srv, key="x") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key=key, max_retries=0, timeout=300)


def echo(request) -> str:
    prompt = str(request.prompt)
    if prompt.endswith("<think>\n"):
        return "Let me think.\n</think>\n\nThe answer. STOP here"
    if "get_weather" in prompt and "21 C" not in prompt:
        return '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    return "Hello from lmprog. STOP here"


@pytest.fixture(scope="module")
def fake():
    return FakeBackend(responder=echo)


@pytest.fixture(scope="module")
def srv(fake):
    with Server(fake, model_name="m", api_key="k").start() as s:
        yield s


def test_a_message_with_system_and_turns(srv, fake):
    client = client_for(srv, "k")
    m = client.messages.create(
        model="m",
        max_tokens=50,
        system="Be terse.",
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
            {"role": "user", "content": [{"type": "text", "text": "Again"}]},
        ],
        stop_sequences=["STOP"],
    )
    assert m.type == "message" and m.role == "assistant" and m.model == "m"
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == "Hello from lmprog. "
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "STOP")
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    prompt = str(fake.generations()[-1].prompt)
    assert "system\nBe terse." in prompt and "assistant\nHello." in prompt
    assert fake.generations()[-1].params.max_tokens == 50


def test_streaming_event_types(srv):
    client = client_for(srv, "k")
    with client.messages.stream(
        model="m", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    # the prompt's tokens in message_start (was 0), the whole usage at the end
    assert events[0].message.usage.input_tokens > 0
    assert final.usage.input_tokens == events[0].message.usage.input_tokens
    assert final.usage.output_tokens > 0
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert "message_delta" in kinds and kinds.count("content_block_delta") > 2
    assert final.content[0].text == "Hello from lmprog. STOP here"
    assert final.stop_reason in ("end_turn", "max_tokens")


def test_tools_round_trip(srv, fake):
    client = client_for(srv, "k")
    m = client.messages.create(
        model="m",
        max_tokens=80,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    [use] = [b for b in m.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    assert use.id.startswith("toolu_")  # stop_reason: the fake never ends on EOS (e2e below)
    follow = client.messages.create(
        model="m",
        max_tokens=80,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [u.model_dump() for u in m.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "21 C, sunny"},
                    {"type": "text", "text": "Thanks. Summarize."},
                ],
            },
        ],
    )
    assert follow.content[0].type == "text"
    prompt = str(fake.generations()[-1].prompt)
    assert '"city": "Paris"' in prompt and "21 C, sunny" in prompt
    assert prompt.index("21 C, sunny") < prompt.index("Thanks. Summarize.")
    with client.messages.stream(
        model="m",
        max_tokens=80,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
        final = stream.get_final_message()
    assert ("content_block_delta", "input_json_delta") in kinds
    assert final.content[-1].input == {"city": "Paris"}


def test_thinking_blocks():
    fake = FakeBackend(responder=echo, template=THINK)
    with Server(fake, model_name="m").start() as s:
        client = client_for(s)
        m = client.messages.create(
            model="m",
            max_tokens=60,
            thinking={"type": "enabled", "budget_tokens": 20},
            messages=[{"role": "user", "content": "Hi"}],
        )
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[0].thinking == "Let me think."
        assert m.content[1].text == "Hello from lmprog. STOP here"  # the answer call
        assert fake.generations()[-2].params.max_tokens == 20  # the budget's thinking call
        with client.messages.stream(
            model="m", max_tokens=60, messages=[{"role": "user", "content": "Hi"}]
        ) as stream:
            deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
            final = stream.get_final_message()
        assert "thinking_delta" in deltas and "signature_delta" in deltas
        assert [b.type for b in final.content] == ["thinking", "text"]
        # a thinking block sent back reaches the template as the turn's reasoning
        client.messages.create(
            model="m",
            max_tokens=20,
            thinking={"type": "disabled"},
            messages=[
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [b.model_dump() for b in m.content]},
                {"role": "user", "content": "More"},
            ],
        )
        assert str(fake.generations()[-1].prompt).endswith("<think>\n\n</think>\n\n")


def test_count_tokens(srv, fake):
    client = client_for(srv, "k")
    n = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "Hi"}])
    with_tools = client.messages.count_tokens(
        model="m", messages=[{"role": "user", "content": "Hi"}], tools=[WEATHER]
    )
    assert 0 < n.input_tokens < with_tools.input_tokens


def test_errors_in_anthropics_shape(srv):
    with pytest.raises(anthropic.AuthenticationError):
        client_for(srv, "wrong").messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
        )
    bad = [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0.source",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages.0.content.0.tool_use_id",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
        ({"tools": [{**WEATHER, "input_schema": {"type": "nope"}}]}, "tools.0.input_schema"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 10}},
            "thinking.budget_tokens",
        ),  # no format
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop_sequences": ["x" * 2000]}, "stop_sequences"),
        ({"tool_choice": {"type": "tool"}, "tools": [WEATHER]}, "tool_choice.name"),
    ]
    for extra, param in bad:
        payload = {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "Hi"}],
            **extra,
        }
        status, body = post_json(srv.url, "/v1/messages", payload, {"x-api-key": "k"})
        assert status == 400, (extra, body)
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        assert body["error"]["message"].startswith(param), (param, body)
    status, body = post_json(
        srv.url,
        "/v1/messages",
        {"model": "other", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        {"x-api-key": "k"},
    )
    assert status == 404 and body["error"]["type"] == "not_found_error"
    status, body = request(srv.url, "POST", "/v1/messages", b"{nope", {"x-api-key": "k"})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"


# -- the bundled model -----------------------------------------------------------------------


@pytest.mark.e2e
def test_the_bundled_model_through_the_anthropic_client(rt):
    from test_tools_e2e import Templated

    with Server(rt, model_name="smol").start() as s:
        client = client_for(s)
        m = client.messages.create(
            model="smol",
            max_tokens=20,
            extra_body={"temperature": 0},
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        assert "Paris" in m.content[0].text
        with client.messages.stream(
            model="smol",
            max_tokens=60,
            extra_body={"temperature": 0},
            tools=[WEATHER],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        ) as stream:
            final = stream.get_final_message()
        [use] = final.content
        assert use.type == "tool_use" and use.name == "get_weather" and "city" in use.input
        assert final.stop_reason == "tool_use"
    thinking = Templated(rt, THINK, {"eos_token": "<|im_end|>"})
    with Server(thinking, model_name="smol").start() as s:
        m = client_for(s).messages.create(
            model="smol",
            max_tokens=60,
            extra_body={"temperature": 0},
            thinking={"type": "enabled", "budget_tokens": 16},
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert json.dumps(m.model_dump())  # the client's own types hold the whole message
