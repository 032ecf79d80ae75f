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
