"""A reasoning model behind the server, without a model: a fake backend under a template
that opens a think block (tests/data/chat_templates/chatml-think.jinja) and the Qwen3 one.
reasoning_content whole and streamed (through the openai client), chat_template_kwargs and
reasoning_effort reaching the template, separate_reasoning false, the constraint that goes
to the backend (thinking, end marker, then the answer), the thinking budget's two calls,
tool calls after thinking, usage and metrics, and the 400s."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from fakes import FakeBackend, FakeTokenizer
from serve_http import assert_error, post_json, request

from lmprog.serve import Server

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
THINK = (TEMPLATES / "chatml-think.jinja").read_text()
QWEN3 = (TEMPLATES / "qwen3.jinja").read_text()
HI = [{"role": "user", "content": "Capital of France?"}]
THOUGHT = "The user asks for a capital.\nIt is Paris.\n</think>\n\n"


def answer_after_thinking(request) -> str:
    prompt = str(request.prompt)
    if prompt.endswith("</think>\n\n"):  # thinking off, or the budget's second call
        return '{"city": "Paris"}' if request.constraint is not None else "Paris."
    if prompt.endswith("<think>\n"):
        return THOUGHT + ('{"city": "Paris"}' if request.constraint is not None else "Paris.")
    return "<think>\nHmm.\n</think>\n\nParis."  # Qwen3: the model opens the block


@pytest.fixture(scope="module")
def fake():
    return FakeBackend(responder=answer_after_thinking, template=THINK)


@pytest.fixture(scope="module")
def srv(fake):
    with Server(fake, model_name="m").start() as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)


def test_reasoning_content_whole(client, fake):
    r = client.chat.completions.create(model="m", messages=HI)
    message = r.choices[0].message
    assert message.content == "Paris."
    assert message.reasoning_content == "The user asks for a capital.\nIt is Paris."
    assert r.usage.completion_tokens_details.reasoning_tokens > 0
    assert str(fake.generations()[-1].prompt).endswith("<|im_start|>assistant\n<think>\n")


def test_reasoning_content_streamed(client):
    chunks = list(client.chat.completions.create(model="m", messages=HI, stream=True))
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == "The user asks for a capital.\nIt is Paris."
    assert content == "Paris."
    kinds = [
        "r" if getattr(c.choices[0].delta, "reasoning_content", None) else "c"
        for c in chunks
        if c.choices
        and (c.choices[0].delta.content or getattr(c.choices[0].delta, "reasoning_content", None))
    ]
    assert kinds == sorted(kinds, reverse=True) and len(kinds) > 2  # reasoning first, in pieces


def test_thinking_off_through_chat_template_kwargs(client, fake):
    r = client.chat.completions.create(
        model="m", messages=HI, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert r.choices[0].message.content == "Paris."
    assert getattr(r.choices[0].message, "reasoning_content", None) is None
    assert str(fake.generations()[-1].prompt).endswith("<think>\n\n</think>\n\n")


def test_separate_reasoning_false_keeps_the_text_whole(client):
    r = client.chat.completions.create(
        model="m", messages=HI, extra_body={"separate_reasoning": False}
    )
    assert r.choices[0].message.content == THOUGHT + "Paris."
    assert getattr(r.choices[0].message, "reasoning_content", None) is None


def test_the_constraint_applies_after_the_thinking(client, fake):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    r = client.chat.completions.create(
        model="m",
        messages=HI,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    assert json.loads(r.choices[0].message.content) == {"city": "Paris"}
    assert r.choices[0].message.reasoning_content
    constraint = fake.generations()[-1].constraint
    assert "%lark" in constraint.lark
    assert constraint.matches(THOUGHT + '{"city": "Paris"}')
    assert not constraint.matches('{"city": "Paris"}')  # the prompt opened the block: think first


def test_the_thinking_budget_is_two_calls(client, fake):
    before = len(fake.generations())
    r = client.chat.completions.create(
        model="m",
        messages=HI,
        max_tokens=200,
        extra_body={"thinking_budget": 5, "json_schema": {"type": "object"}},
    )
    first, second = fake.generations()[before:]
    assert first.params.max_tokens == 5 and first.params.stop == ("</think>",)
    assert first.constraint is None
    assert str(second.prompt).endswith("It is Paris.\n</think>\n\n")
    assert second.constraint.kind == "json_schema"  # the answer's own, no thinking part
    assert second.params.max_tokens == 200 - len(THOUGHT.split("</think>")[0])
    assert r.choices[0].message.reasoning_content == "The user asks for a capital.\nIt is Paris."
    assert json.loads(r.choices[0].message.content) == {"city": "Paris"}


def test_tool_calls_after_thinking(srv):
    fake = FakeBackend(
        responder=lambda r: (
            'I should call it.</think>\n\n{"name": "weather", "arguments": {"city": "Paris"}}'
        ),
        template=THINK,
    )
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    with Server(fake, model_name="m").start() as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(
            model="m", messages=HI, tools=[tool], tool_choice="required"
        )
        message = r.choices[0].message
        assert message.reasoning_content == "I should call it."
        assert json.loads(message.tool_calls[0].function.arguments) == {"city": "Paris"}
        chunks = list(
            client.chat.completions.create(model="m", messages=HI, tools=[tool], stream=True)
        )
        calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        assert calls[0].function.name == "weather"
        assert (
            "".join(
                getattr(c.choices[0].delta, "reasoning_content", None) or ""
                for c in chunks
                if c.choices
            )
            == "I should call it."
        )
    assert fake.generations()[0].constraint.matches(
        'x</think>\n\n{"name": "weather", "arguments": {"city": "Paris"}}'
    )


def test_qwen3_template_the_model_opens_the_block():
    fake = FakeBackend(responder=answer_after_thinking, template=QWEN3)
    with Server(fake, model_name="m").start() as s:
        status, body = post_json(
            s.url,
            "/v1/chat/completions",
            {"model": "m", "messages": HI, "reasoning_effort": "low"},
        )
        assert status == 200, body
        message = body["choices"][0]["message"]
        assert (message["reasoning_content"], message["content"]) == ("Hmm.", "Paris.")
        status, body = post_json(
            s.url,
            "/v1/chat/completions",
            {"model": "m", "messages": HI, "chat_template_kwargs": {"enable_thinking": False}},
        )
        assert "reasoning_content" not in body["choices"][0]["message"]
        _, metrics = request(s.url, "GET", "/metrics")
        assert "lmprog_reasoning_tokens_total 4.0" in metrics  # "Hmm." once, a byte a token


def test_template_variables_reach_the_template():
    fake = FakeBackend(
        template="{{ messages[0]['content'] }} effort={{ reasoning_effort }} x={{ x }}",
        responder=lambda r: "ok",
    )
    with Server(fake, model_name="m").start() as s:
        status, _ = post_json(
            s.url,
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": HI,
                "reasoning_effort": "high",
                "chat_template_kwargs": {"x": 3},
            },
        )
        assert status == 200
    assert str(fake.generations()[-1].prompt) == "Capital of France? effort=high x=3"


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"thinking_budget": -1}, "thinking_budget"),
        ({"thinking_budget": "5"}, "thinking_budget"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
        (
            {"chat_template_kwargs": {"add_generation_prompt": False}},
            "chat_template_kwargs.add_generation_prompt",
        ),
        ({"reasoning_effort": "huge"}, "reasoning_effort"),
        ({"separate_reasoning": "yes"}, "separate_reasoning"),
    ],
)
def test_bad_reasoning_fields(srv, extra, param):
    status, body = post_json(
        srv.url, "/v1/chat/completions", {"model": "m", "messages": HI, **extra}
    )
    assert_error(status, body, 400, param=param)


def test_a_budget_needs_a_reasoning_model():
    with Server(FakeBackend(), model_name="m").start() as s:
        status, body = post_json(
            s.url, "/v1/chat/completions", {"model": "m", "messages": HI, "thinking_budget": 8}
        )
        err = assert_error(status, body, 400, param="thinking_budget")
        assert "reasoning" in err["message"]


def test_unknown_reasoning_parser():
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        Server(FakeBackend(), reasoning_parser="nope")
    srv = Server(FakeBackend(template=THINK), reasoning_parser="none")
    assert srv.reasoning is None


def test_an_earlier_turns_reasoning_goes_to_the_template():
    fake = FakeBackend(responder=answer_after_thinking, template=QWEN3)
    turns = [
        *HI,
        {"role": "assistant", "content": "Paris.", "reasoning_content": "Easy one."},
        {"role": "user", "content": "And Italy?"},
    ]
    with Server(fake, model_name="m").start() as s:
        status, body = post_json(s.url, "/v1/chat/completions", {"model": "m", "messages": turns})
        assert status == 200, body
    prompt = str(fake.generations()[-1].prompt)
    # Qwen3's template keeps the thinking of turns after the last user query only: here the
    # earlier answer is before it, so the template drops it, as transformers renders it
    assert "<|im_start|>assistant\nParis.<|im_end|>" in prompt
    tool_turns = [*turns[:2], {"role": "user", "content": "<tool_response>\nx\n</tool_response>"}]
    with Server(fake, model_name="m").start() as s:
        post_json(s.url, "/v1/chat/completions", {"model": "m", "messages": tool_turns})
    assert "<think>\nEasy one.\n</think>\n\nParis." in str(fake.generations()[-1].prompt)


def test_separate_reasoning_in_the_native_generate(srv, fake):
    prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    status, body = post_json(srv.url, "/generate", {"text": prompt, "separate_reasoning": True})
    assert status == 200, body
    assert body["reasoning_content"] == "The user asks for a capital.\nIt is Paris."
    assert body["text"] == "Paris."
    status, body = post_json(
        srv.url,
        "/generate",
        {
            "text": prompt,
            "separate_reasoning": True,
            "sampling_params": {"json_schema": '{"type": "object"}'},
        },
    )
    assert fake.generations()[-1].constraint.matches('x</think>\n{"a": 1}')
    status, raw = request(
        srv.url,
        "POST",
        "/generate",
        json.dumps({"text": prompt, "separate_reasoning": True, "stream": True}).encode(),
    )
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    assert events[-1]["text"] == "Paris." and events[-1]["reasoning_content"].endswith("Paris.")
    assert any(e["meta_info"]["finish_reason"] is None and e["text"] == "" for e in events)
    status, body = post_json(srv.url, "/generate", {"text": prompt})  # off by default
    assert body["text"] == THOUGHT + "Paris." and "reasoning_content" not in body


def test_separate_reasoning_needs_a_reasoning_model():
    with Server(FakeBackend(), model_name="m").start() as s:
        status, body = post_json(s.url, "/generate", {"text": "x", "separate_reasoning": True})
        assert_error(status, body, 400, param="separate_reasoning")


def test_responses_api_reasoning_items(srv, fake):
    r = client_for_responses(srv).responses.create(
        model="m", input="Capital of France?", reasoning={"effort": "low"}
    )
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message"]
    assert r.output[0].content[0].text == "The user asks for a capital.\nIt is Paris."
    assert r.output_text == "Paris."
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    # previous_response_id carries the reasoning item: the next turn's template gets it
    fake2 = FakeBackend(responder=answer_after_thinking, template=QWEN3)
    with Server(fake2, model_name="m").start() as s:
        client = client_for_responses(s)
        first = client.responses.create(model="m", input="Capital of France?")
        assert [i.type for i in first.output] == ["reasoning", "message"]
        client.responses.create(
            model="m",
            previous_response_id=first.id,
            input=[{"role": "user", "content": "<tool_response>\nx\n</tool_response>"}],
        )
        prompt = str(fake2.generations()[-1].prompt)
        assert "<think>\nHmm.\n</think>\n\nParis." in prompt
        events = list(client.responses.create(model="m", input="Capital?", stream=True))
        types = [e.type for e in events]
        assert "response.reasoning_text.delta" in types and "response.reasoning_text.done" in types
        done = events[-1].response
        assert [i.type for i in done.output] == ["reasoning", "message"]


def client_for_responses(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)


class _HarmonyTokenizer(FakeTokenizer):
    all_special_tokens = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>"]


class _HarmonyBackend(FakeBackend):
    @property
    def tokenizer(self):
        return _HarmonyTokenizer()


def test_markers_that_are_special_tokens_are_kept_in_the_output(fake, client):
    """gpt-oss's channel markers are special tokens, which detokenizing drops by default: the
    request then keeps them (skip_special_tokens=False), so its output splits."""
    harmony = _HarmonyBackend(
        responder=lambda _: (
            "<|channel|>analysis<|message|>Capitals.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Paris."
        )
    )
    with Server(harmony, model_name="m", reasoning_parser="gpt-oss").start() as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        message = c.chat.completions.create(model="m", messages=HI).choices[0].message
    assert (message.reasoning_content, message.content) == ("Capitals.", "Paris.")
    assert harmony.generations()[-1].params.skip_special_tokens is False
    client.chat.completions.create(model="m", messages=HI)  # <think> is no special token here
    assert fake.generations()[-1].params.skip_special_tokens is True
