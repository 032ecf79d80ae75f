"""/v1/responses: the request and response conversions on their own (no model), then the
official `openai` client against lmprog.serve.Server on the default model over loopback.

The Responses API runs through the chat pipeline, so its outputs are checked against the
same request sent to /v1/chat/completions: the same text, tool calls and token counts.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from types import SimpleNamespace
from typing import get_args
from urllib.parse import urlsplit

import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from serve_http import assert_error, post_json, request

from lmprog.serve import Server
from lmprog.serve.errors import APIError
from lmprog.serve.jsonbody import UnknownFields
from lmprog.serve.limits import ServerLimits
from lmprog.serve.openai.responses import ResponseStore, _renamed, to_chat
from lmprog.serve.openai.responses_output import ResponseOutput, ResponseReply
from lmprog.serve.schemas.responses import ResponsesRequest

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": CITY,
    "strict": True,
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _ctx(**limits):
    return SimpleNamespace(limits=ServerLimits(**limits), unknown_fields=UnknownFields())


def _body(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", **fields})


# -- without a model ------------------------------------------------------------------------
def test_items_become_chat_messages():
    body = _body(
        instructions="Be brief.",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather in "},
                    {"type": "input_text", "text": "Paris?"},
                ],
            },
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {
                "type": "function_call",
                "call_id": "c2",
                "name": "get_weather",
                "arguments": '{"city": "Lyon"}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "21 C"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "19 C"}],
            },
        ],
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        text={"format": {"type": "json_schema", "name": "p", "schema": PERSON}},
        max_output_tokens=7,
        seed=3,
    )
    chat = to_chat(body, (), _ctx())
    messages = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert messages[0]["content"] == "Be brief." and messages[1]["content"] == "Weather in Paris?"
    assistant = messages[2]  # the text and both calls: one assistant message
    assert assistant["content"] == "Let me look."
    assert [(c["id"], c["function"]["arguments"]) for c in assistant["tool_calls"]] == [
        ("c1", '{"city": "Paris"}'),
        ("c2", '{"city": "Lyon"}'),
    ]
    assert messages[3] == {"role": "tool", "content": "21 C", "tool_call_id": "c1"}
    assert messages[4]["content"] == "19 C"
    assert (
        chat.tools[0].function.name == "get_weather" and chat.tools[0].function.parameters == CITY
    )
    assert chat.tool_choice.function.name == "get_weather"
    assert chat.response_format.type == "json_schema"
    assert chat.response_format.json_schema.schema_ == PERSON
    assert chat.max_completion_tokens == 7 and chat.seed == 3 and not chat.stream


def test_a_stored_conversation_comes_first_and_instructions_are_not_kept():
    first = _body(input="Hi", instructions="Old instructions.")
    history = tuple(first.input) + tuple(
        _body(input=[{"role": "assistant", "content": "Hello!"}]).input
    )
    chat = to_chat(_body(input="And now?", instructions="New."), history, _ctx())
    assert [(m.role, m.content) for m in chat.messages] == [
        ("system", "New."),
        ("user", "Hi"),
        ("assistant", "Hello!"),
        ("user", "And now?"),
    ]


@pytest.mark.parametrize(
    ("item", "param", "code"),
    [
        (
            {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]},
            "input[0].content[0]",
            "unsupported_content",
        ),
        (
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{nope"},
            "input[0].arguments",
            "invalid_json",
        ),
        (
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]},
            "input[0].output.content[0]",
            "unsupported_content",
        ),
    ],
)
def test_bad_items_are_named(item, param, code):
    with pytest.raises(APIError) as info:
        to_chat(_body(input=[item]), (), _ctx())
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)


def test_unknown_keys_of_a_content_part():
    part = {"type": "input_text", "text": "hi", "cache_hint": 1}
    body = _body(input=[{"role": "user", "content": [part]}])
    ctx = _ctx()
    assert to_chat(body, (), ctx).messages[0].content == "hi"  # dropped, and logged once
    assert "input[].content[].cache_hint" in ctx.unknown_fields.seen
    with pytest.raises(APIError) as info:
        to_chat(body, (), _ctx(strict_requests=True))
    assert info.value.param == "input[0].content[0].cache_hint"
    assert info.value.code == "unknown_parameter"


def test_chat_fields_are_renamed_to_the_responses_fields():
    cases = {
        "messages": "input",
        "messages[3].content": "input",
        "response_format.json_schema.schema": "text.format.schema",
        "response_format": "text.format",
        "max_completion_tokens": "max_output_tokens",
        "max_tokens": "max_output_tokens",
        "tools[2].function.parameters": "tools[2].parameters",
        "tools[0].function.name": "tools[0].name",
        "tool_choice": "tool_choice",
        "top_k": "top_k",
    }
    for chat, responses in cases.items():
        exc = _renamed(APIError(400, f"{chat}: wrong", param=chat, code="c"))
        assert (exc.param, exc.message, exc.code) == (responses, f"{responses}: wrong", "c")


def test_the_store_keeps_the_most_recently_used():
    store = ResponseStore(capacity=2)
    for name in ("a", "b"):
        store.put({"id": name}, ())
    store.get("a")  # now b is the least recently used
    store.put({"id": "c"}, ())
    assert store.get("a")[0] == {"id": "a"} and store.get("c")[0] == {"id": "c"}
    with pytest.raises(APIError) as info:
        store.get("b")
    assert info.value.status == 404
    store.delete("a")
    with pytest.raises(APIError):
        store.get("a")


def test_output_items_and_their_events():
    out = ResponseOutput()
    events = out.text("Hel") + out.text("lo") + out.call(0, "call_1", "f", '{"a"')
    events += out.call(0, None, None, ": 1}") + out.call(1, "call_2", "g", "{}")
    events += out.close("completed", None)
    assert [i["type"] for i in out.items] == ["message", "function_call", "function_call"]
    assert out.items[0]["content"][0]["text"] == "Hello"
    assert out.items[1]["arguments"] == '{"a": 1}' and out.items[1]["call_id"] == "call_1"
    assert all(i["status"] == "completed" for i in out.items)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert [e["output_index"] for e in events if e["type"].endswith("item.added")] == [0, 1, 2]
    added = events[0]["item"]
    assert added["status"] == "in_progress" and added["content"] == []  # a copy, as it was then


def test_an_empty_output_is_one_empty_message_and_cut_items_are_incomplete():
    out = ResponseOutput()
    out.close("incomplete", None)
    assert len(out.items) == 1 and out.items[0]["content"][0]["text"] == ""
    assert out.items[0]["status"] == "incomplete"


def test_a_failure_after_the_stream_began_is_an_error_then_response_failed():
    """The chat reply's error event (a choice failed mid-stream) becomes Responses events."""

    class FailingChat:
        body = SimpleNamespace(logprobs=None)

        async def stream(self, group):
            yield b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
            yield b'data: {"error": {"message": "the model backend failed: boom", "type": "server_error", "param": null, "code": "backend_error"}}\n\n'
            yield b"data: [DONE]\n\n"

    kept = []
    reply = ResponseReply(
        SimpleNamespace(model_name="m"), _body(input="x"), FailingChat(), kept.append
    )

    async def events():
        return [chunk async for chunk in reply.stream(None)]

    payloads = [_sse_event(chunk) for chunk in asyncio.run(events())]
    kinds = [p["type"] for p in payloads]
    assert kinds[-2:] == ["error", "response.failed"]
    assert payloads[-2]["code"] == "backend_error" and "boom" in payloads[-2]["message"]
    failed = payloads[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert not kept  # a failed response is not stored
    for p in payloads:
        _validate_event(p)


# the openai package's event types by their `type` (its union is discriminated by the client)
_EVENT_TYPES = {
    get_args(t.model_fields["type"].annotation)[0]: t
    for t in get_args(get_args(ResponseStreamEvent)[0])
}


def _validate_event(payload: dict) -> None:
    """Validated (not just constructed) by the openai package's pydantic type of its kind."""
    _EVENT_TYPES[payload["type"]].model_validate(payload)


def _sse_event(chunk: bytes) -> dict:
    """One SSE event's data, checked against its `event:` line."""
    lines = chunk.decode().strip().split("\n")
    assert lines[0].startswith("event: ") and lines[1].startswith("data: "), lines
    data = json.loads(lines[1][len("data: ") :])
    assert data["type"] == lines[0][len("event: ") :]
    return data


def _raw_stream(url: str, payload: dict) -> list[dict]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        conn.request(
            "POST",
            "/v1/responses",
            body=json.dumps({**payload, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
        text = resp.read()
    finally:
        conn.close()
    return [_sse_event(e + b"\n\n") for e in text.split(b"\n\n") if e.strip()]


# -- on the model -----------------------------------------------------------------------------
@pytest.mark.e2e
def test_text_matches_chat(client, model):
    r = client.responses.create(
        model=model,
        instructions="Be terse.",
        input="Name a color.",
        max_output_tokens=12,
        temperature=0,
    )
    c = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Name a color."},
        ],
        max_tokens=12,
        temperature=0,
    )
    assert r.id.startswith("resp_") and r.object == "response" and r.model == model
    assert r.output_text == c.choices[0].message.content and r.output_text
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant"
    assert r.usage.input_tokens == c.usage.prompt_tokens
    assert r.usage.output_tokens == c.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    cut = c.choices[0].finish_reason == "length"
    assert r.status == ("incomplete" if cut else "completed")
    assert r.instructions == "Be terse." and r.max_output_tokens == 12


@pytest.mark.e2e
def test_max_output_tokens_makes_it_incomplete(client, model):
    r = client.responses.create(model=model, input="Tell me a long story.", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete" and r.usage.output_tokens == 3


@pytest.mark.e2e
def test_streaming_events(client, model):
    kwargs = dict(model=model, input="Count to five.", max_output_tokens=10, temperature=0)
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(**kwargs, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{whole.status}",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 3 and "".join(deltas) == whole.output_text  # really streamed
    done = events[-1].response
    assert done.output_text == whole.output_text and done.id == events[0].response.id
    assert events[-2].item.id == done.output[0].id == events[2].item.id
    assert done.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.e2e
@pytest.mark.parametrize("tools", [False, True])
def test_bodies_and_events_are_valid_openai_types(server, model, tools):
    """Validated (not just constructed) by the openai package's own pydantic types."""
    payload = {"model": model, "input": "Weather in Oslo?", "max_output_tokens": 40}
    if tools:
        payload |= {"tools": [WEATHER], "tool_choice": "required"}
    status, body = post_json(server.url, "/v1/responses", payload)
    assert status == 200
    Response.model_validate(body)
    events = _raw_stream(server.url, payload)
    for event in events:
        _validate_event(event)
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    Response.model_validate(events[-1]["response"])


@pytest.mark.e2e
def test_previous_response_id_continues_the_conversation(client, model):
    first = client.responses.create(
        model=model, input="My name is Ada.", max_output_tokens=8, temperature=0
    )
    second = client.responses.create(
        model=model,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=8,
        temperature=0,
    )
    chat = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        max_tokens=8,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.output_text == chat.choices[0].message.content
    # a chain: the third turn sees both earlier turns
    third = client.responses.create(
        model=model, input="Thanks.", previous_response_id=second.id, max_output_tokens=4
    )
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    # stored responses can be read back and deleted
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


@pytest.mark.e2e
def test_store_false_is_not_kept(client, model, server):
    r = client.responses.create(model=model, input="Hi", max_output_tokens=2, store=False)
    assert r.store is False
    status, body = post_json(
        server.url,
        "/v1/responses",
        {"model": model, "input": "Again", "previous_response_id": r.id},
    )
    assert_error(
        status, body, 400, param="previous_response_id", code="previous_response_not_found"
    )


@pytest.mark.e2e
def test_tool_calls_match_chat_and_results_go_back(client, model):
    question = {"role": "user", "content": "What is the weather in Paris?"}
    r = client.responses.create(
        model=model,
        input=[question],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=40,
        temperature=0,
    )
    chat_tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    c = client.chat.completions.create(
        model=model,
        messages=[question],
        tools=[chat_tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=40,
        temperature=0,
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and r.status == "completed"
    assert [(o.name, o.arguments) for o in calls] == [
        (t.function.name, t.function.arguments) for t in c.choices[0].message.tool_calls
    ]
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), CITY)
        assert call.id.startswith("fc_") and call.call_id and call.status == "completed"
    # the call and its output go back as items; the model answers (tool_choice none)
    follow = [question, *[o.model_dump(exclude_none=True) for o in calls]]
    follow += [
        {"type": "function_call_output", "call_id": o.call_id, "output": "21 C, sunny"}
        for o in calls
    ]
    answer = client.responses.create(
        model=model,
        input=follow,
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=20,
        temperature=0,
    )
    calls_message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [t.model_dump() for t in c.choices[0].message.tool_calls],
    }
    results = [
        {"role": "tool", "tool_call_id": t.id, "content": "21 C, sunny"}
        for t in c.choices[0].message.tool_calls
    ]
    chat_answer = client.chat.completions.create(
        model=model,
        messages=[question, calls_message, *results],
        tools=[chat_tool],
        tool_choice="none",
        max_tokens=20,
        temperature=0,
    )
    assert [o.type for o in answer.output] == ["message"] and answer.output_text
    assert answer.output_text == chat_answer.choices[0].message.content
    assert answer.usage.input_tokens == chat_answer.usage.prompt_tokens


@pytest.mark.e2e
def test_tool_calls_stream(client, model):
    stream = client.responses.create(
        model=model,
        input="Weather in Oslo?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
        stream=True,
    )
    events = list(stream)
    done = events[-1].response
    calls = [o for o in done.output if o.type == "function_call"]
    assert calls
    for index, call in enumerate(done.output):
        if call.type != "function_call":
            continue
        deltas = [
            e.delta
            for e in events
            if e.type == "response.function_call_arguments.delta" and e.output_index == index
        ]
        assert "".join(deltas) == call.arguments
        (added,) = [
            e for e in events if e.type == "response.output_item.added" and e.output_index == index
        ]
        assert added.item.type == "function_call" and added.item.name == "get_weather"
        (args_done,) = [
            e
            for e in events
            if e.type == "response.function_call_arguments.done" and e.output_index == index
        ]
        assert args_done.arguments == call.arguments and args_done.item_id == call.id
    if done.status == "completed":
        jsonschema.validate(json.loads(calls[-1].arguments), CITY)


@pytest.mark.e2e
def test_text_format(client, model):
    r = client.responses.create(
        model=model,
        input="Describe a person as JSON.",
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}},
        max_output_tokens=60,
        temperature=0,
    )
    assert r.status == "completed" and r.text.format.type == "json_schema"
    jsonschema.validate(json.loads(r.output_text), PERSON)
    r = client.responses.create(
        model=model,
        input="Describe a cat as JSON with keys name and color.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=60,
        temperature=0,
    )
    assert r.status == "completed" and isinstance(json.loads(r.output_text), dict)


@pytest.mark.e2e
def test_logprobs(client, model):
    r = client.responses.create(
        model=model,
        input="Say yes or no.",
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        max_output_tokens=8,
        temperature=0,
    )
    logprobs = r.output[0].content[0].logprobs
    assert logprobs and "".join(t.token for t in logprobs) == r.output_text
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in logprobs)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("patch", "param", "code"),
    [
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
            "input[0].arguments",
            None,
        ),
        ({"input": [{"type": "item_reference", "id": "r"}]}, "input[0]", None),
        ({"input": [{"type": "reasoning", "summary": "no"}]}, "input[0].summary", None),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role", None),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}
                ]
            },
            "input[0].content[0]",
            "unsupported_content",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
            "input[0].arguments",
            "invalid_json",
        ),
        ({"input": []}, "input", None),
        (
            {"previous_response_id": "resp_nope"},
            "previous_response_id",
            "previous_response_not_found",
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
            "text.format.schema",
            "invalid_schema",
        ),
        ({"text": {"format": {"type": "json_schema", "schema": PERSON}}}, "text.format", None),
        ({"max_output_tokens": 10**6}, "max_output_tokens", "max_tokens_too_large"),
        ({"tools": [{**WEATHER, "name": "bad name"}]}, "tools[0].name", None),
        (
            {"tools": [{**WEATHER, "parameters": {"type": "nope"}}]},
            "tools[0].parameters",
            "invalid_schema",
        ),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", None),
        ({"tool_choice": "required"}, "tool_choice", None),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"reasoning": {"effort": "huge"}}, "reasoning.effort", None),
        ({"truncation": "auto"}, "truncation", "unsupported_parameter"),
        ({"temperature": "hot"}, "temperature", None),
        ({"top_k": "many"}, "top_k", None),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server, model, patch, param, code):
    status, body = post_json(server.url, "/v1/responses", {"model": model, "input": "Hi", **patch})
    assert_error(status, body, 400, param=param, code=code)


@pytest.mark.e2e
def test_errors_reach_the_client_and_the_server_keeps_serving(client, model, server):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=model, input="Hi", previous_response_id="resp_missing")
    assert info.value.param == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="other-model", input="Hi")
    status, body = request(server.url, "POST", "/v1/responses", b"{not json")
    assert_error(status, body, 400, code="invalid_json")
    assert (
        client.responses.create(model=model, input="Hi", max_output_tokens=2).usage.output_tokens
        == 2
    )


@pytest.mark.e2e
def test_strict_requests_refuse_unknown_fields(rt):
    with Server(rt, strict_requests=True).start() as srv:
        payload = {
            "model": srv.model_name,
            "input": [{"role": "user", "content": "x", "colour": 1}],
        }
        status, body = post_json(srv.url, "/v1/responses", payload)
        assert_error(status, body, 400, param="input[0].colour", code="unknown_parameter")
    with Server(rt).start() as srv:  # by default: dropped
        payload = {**payload, "model": srv.model_name, "max_output_tokens": 2}
        status, body = post_json(srv.url, "/v1/responses", payload)
        assert status == 200 and body["status"] == "incomplete"
