"""A reasoning template behind `lmprog serve` on the bundled model (the session's CPU
runtime), through the `openai` client over loopback: reasoning_content whole and streamed, a
JSON schema after a budgeted thinking (every answer valid), thinking switched off through
chat_template_kwargs."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from lmprog.serve import Server

pytestmark = pytest.mark.e2e

THINK = (
    Path(__file__).parent.parent / "data" / "chat_templates" / "chatml-think.jinja"
).read_text()
SCHEMA = {
    "type": "object",
    "properties": {"capital": {"enum": ["Paris", "Rome"]}},
    "required": ["capital"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(rt):
    from test_tools_e2e import Templated

    backend = Templated(rt, THINK, {"eos_token": "<|im_end|>"})
    with Server(backend, model_name="m").start() as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)


def test_reasoning_content_and_a_budgeted_schema(client):
    for seed in range(3):
        r = client.chat.completions.create(
            model="m",
            messages=ASK,
            max_tokens=80,
            seed=seed,
            temperature=0.8,
            response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
            extra_body={"thinking_budget": 16},
        )
        message = r.choices[0].message
        jsonschema.validate(json.loads(message.content), SCHEMA)
        assert message.reasoning_content and "</think>" not in message.reasoning_content
        assert r.usage.completion_tokens_details.reasoning_tokens <= 16 + 2
        assert r.choices[0].finish_reason == "stop"


def test_streamed_reasoning_then_content(client):
    kw = dict(
        model="m", messages=ASK, max_tokens=60, temperature=0, extra_body={"thinking_budget": 12}
    )
    whole = client.chat.completions.create(**kw).choices[0].message
    chunks = list(client.chat.completions.create(stream=True, **kw))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert (reasoning, content) == (whole.reasoning_content, whole.content)


def test_thinking_off(client):
    r = client.chat.completions.create(
        model="m",
        messages=ASK,
        max_tokens=20,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert getattr(r.choices[0].message, "reasoning_content", None) is None
    assert r.choices[0].message.content


def test_deepseek_r1_template_tool_calls_after_thinking(rt):
    """The DeepSeek-R1-Distill template as published (it opens <think> and writes calls
    between its markers) on the bundled model: the call comes after the thinking, in
    DeepSeek's layout, and reads back as a call whose arguments match the tool."""
    from test_tools_e2e import Templated

    source = (
        Path(__file__).parent.parent / "data" / "chat_templates" / "deepseek-r1-distill-qwen.jinja"
    ).read_text()
    backend = Templated(rt, source, {"bos_token": "", "eos_token": "<|im_end|>"})
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    with Server(backend, model_name="r1").start() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)
        for budget in (None, 12):
            extra = {} if budget is None else {"thinking_budget": budget}
            r = client.chat.completions.create(
                model="r1",
                messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                tools=[tool],
                tool_choice="required",
                parallel_tool_calls=False,
                max_tokens=120 if budget else 160,
                temperature=0,
                extra_body=extra,
            )
            choice = r.choices[0]
            if budget is None and choice.finish_reason == "length":
                continue  # still thinking at max_tokens without a budget
            [call] = choice.message.tool_calls
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
            assert choice.message.reasoning_content
    # the budget's answer call: the thinking closed by the server, then the call
    assert any(p.endswith("</think>\n\n") for p in backend.prompts)
