"""Tool calling end to end on the bundled model (lp.Runtime on the CPU) over loopback, with
the real clients: the official `openai` client (whole and streamed) and LangChain's
ChatOpenAI. The bundled model's template has no tool syntax (the generic format); the same
model served with the Qwen 2.5, Llama 3.2 and Mistral templates (tests/data/chat_templates/)
runs each family's native format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from lmprog.core.chat import ChatTemplate
from lmprog.core.protocol import Backend
from lmprog.serve import Server

pytestmark = pytest.mark.e2e

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "maxLength": 24}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}
TOOLS = {"get_weather": WEATHER, "get_time": TIME}
TWO_CITIES = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]


def check_call(call: Any) -> None:
    assert call.type == "function" and call.id
    tool = TOOLS[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def streamed(client, **kw) -> tuple[list[Any], str, list[dict[str, Any]]]:
    """(chunks, content, calls) of a streamed request, checking the deltas' shapes as
    OpenAI sends them: a call's first delta has its index, id, type, name and arguments "",
    the later ones only argument fragments (each call's count of them in "fragments")."""
    chunks = list(client.chat.completions.create(stream=True, **kw))
    return (chunks, *accumulated(chunks))


def accumulated(chunks: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    content, calls = "", []
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                if tc.index == len(calls):
                    assert tc.id and tc.type == "function" and tc.function.name
                    assert tc.function.arguments == ""
                    calls.append(
                        {"id": tc.id, "name": tc.function.name, "arguments": "", "fragments": 0}
                    )
                else:
                    assert tc.index == len(calls) - 1 and tc.id is None
                    assert tc.function.name is None and tc.function.arguments
                    calls[tc.index]["arguments"] += tc.function.arguments
                    calls[tc.index]["fragments"] += 1
    return content, calls


def helper_streamed(client, **kw) -> tuple[str, list[dict[str, Any]], list[Any], Any]:
    """The openai client's own stream accumulation (`chat.completions.stream`, strict tools:
    it parses each call's arguments so far with jiter's partial mode): (content, calls from
    the raw chunks, the arguments.delta events, the final completion it assembled)."""
    tools = [{**t, "function": {**t["function"], "strict": True}} for t in kw.pop("tools")]
    with client.chat.completions.stream(tools=tools, **kw) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    content, calls = accumulated([e.chunk for e in events if e.type == "chunk"])
    deltas = [e for e in events if e.type == "tool_calls.function.arguments.delta"]
    return content, calls, deltas, final


def check_streamed_arguments(client, kw: dict[str, Any], call: Any) -> None:
    """A call's arguments stream in several fragments, the client's partial parses of them
    growing into the arguments the same request returns whole."""
    content, [streamed_call], deltas, final = helper_streamed(client, **kw)
    assert content == "" and without_ids([streamed_call]) == without_ids(as_dicts([call]))
    assert streamed_call["fragments"] > 1  # the helper's events: one more, the name's
    whole = json.loads(call.function.arguments)
    parsed = [d.parsed_arguments for d in deltas if d.arguments_delta]  # after the name's
    assert parsed[-1] == whole and all(set(p) <= set(whole) for p in parsed)
    assert len({json.dumps(p) for p in parsed}) > 1  # known before the call ended
    [assembled] = final.choices[0].message.tool_calls
    assert assembled.function.arguments == call.function.arguments
    assert assembled.function.parsed_arguments == whole


def as_dicts(calls: list[Any]) -> list[dict[str, Any]]:
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in calls]


def without_ids(calls: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(c["name"], c["arguments"]) for c in calls]


def last_reason(chunks: list[Any]) -> str | None:
    return [c.choices[0].finish_reason for c in chunks if c.choices][-1]


def test_several_calls_in_one_choice(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=TWO_CITIES,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls) >= 1
    for call in choice.message.tool_calls:
        check_call(call)
    assert len({c.id for c in choice.message.tool_calls}) == len(choice.message.tool_calls)
    chunks, content, calls = streamed(
        client,
        model=model,
        messages=TWO_CITIES,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
        stream_options={"include_usage": True},
    )
    assert content == "" and last_reason(chunks) == "tool_calls"
    assert without_ids(calls) == without_ids(as_dicts(choice.message.tool_calls))
    fragments = sum(len(c.choices[0].delta.tool_calls or []) for c in chunks if c.choices)
    assert fragments > 2 * len(calls)  # the arguments arrive piece by piece
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_parallel_tool_calls_false_gives_one_call(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=TWO_CITIES,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
    )
    [call] = r.choices[0].message.tool_calls
    check_call(call)
    assert r.choices[0].finish_reason == "tool_calls"


def test_a_call_cut_by_max_tokens_is_text_never_a_call(client, model):
    """Issue 28: a call cut short is not returned as a call (its arguments would not parse):
    the whole calls before it are, and finish_reason says "length"."""
    kw: dict[str, Any] = dict(
        model=model,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=12,
        temperature=0,
    )
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content.startswith('{"name": "get_weather", "arguments": {')
    chunks, content, calls = streamed(client, **kw)  # streamed as written, then "length"
    assert content == "" and last_reason(chunks) == "length"
    assert [c["name"] for c in calls] == ["get_weather"]
    assert choice.message.content.endswith(calls[0]["arguments"])
    # whole calls, then one cut short: the bundled model repeats this call until max_tokens
    # (it returned two calls here, the second with arguments "")
    city = json.loads(json.dumps(WEATHER))
    city["function"]["parameters"]["properties"].pop("unit")
    city["function"]["parameters"]["required"] = ["city"]
    question = [{"role": "user", "content": "What's the weather in Paris?"}]
    r = client.chat.completions.create(
        **{**kw, "messages": question, "tools": [city], "max_tokens": 30}
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.message.content is None or choice.message.content.startswith('{"name": ')


def test_tool_arguments_hold_only_the_listed_keys(client, model):
    """Issue 28: a parameters schema without additionalProperties gets no invented keys."""
    weather = json.loads(json.dumps(WEATHER))
    del weather["function"]["parameters"]["additionalProperties"]
    r = client.chat.completions.create(
        model=model,
        messages=TWO_CITIES,
        tools=[weather],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
    )
    [call] = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert set(json.loads(call.function.arguments)) <= {"city", "unit"}


def test_named_call_and_a_second_turn(client, model):
    messages: list[Any] = [{"role": "user", "content": "What time is it in Tokyo?"}]
    r = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[WEATHER, TIME],
        max_tokens=40,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,  # (this model repeats the call otherwise)
        temperature=0,
    )
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    check_call(calls[0])
    messages.append(r.choices[0].message.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": "09:30"} for c in calls]
    r2 = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[WEATHER, TIME],
        tool_choice="none",
        max_tokens=12,
        temperature=0,
    )
    assert r2.choices[0].message.content and not r2.choices[0].message.tool_calls
    assert not r2.choices[0].message.content.startswith("{")  # "none": an answer, never a call


def test_auto_gives_calls_or_an_answer(client, model):
    for question in ("What is the weather in Rome, in celsius?", "Hello! How are you?"):
        kw: dict[str, Any] = dict(
            model=model,
            messages=[{"role": "user", "content": question}],
            tools=[WEATHER],
            max_tokens=30,
            temperature=0,
        )
        message = client.chat.completions.create(**kw).choices[0].message
        chunks, content, calls = streamed(client, **kw)
        if message.tool_calls:
            for c in message.tool_calls:
                check_call(c)
            assert without_ids(calls) == without_ids(as_dicts(message.tool_calls))
        else:
            assert message.content and not message.content.startswith("{")
            assert content == message.content and not calls
            # an answer streams as it is written, not in one piece at the end
            assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 3


# -- the families' native formats on the same model ------------------------------------------


class Templated(Backend):
    """The session's runtime served under another chat template (the prompts it got kept)."""

    def __init__(self, rt: Backend, source: str, special: dict[str, str]) -> None:
        self.rt = rt
        self._template = ChatTemplate(source, special_tokens=special)
        self.prompts: list[str] = []

    def generate(self, request, stream=None):
        self.prompts.append(str(request.prompt))
        return self.rt.generate(request, stream=stream)

    def score(self, request):
        return self.rt.score(request)

    @property
    def chat_template(self) -> ChatTemplate:
        return self._template

    @property
    def tokenizer(self) -> Any:
        return self.rt.tokenizer

    def stats(self) -> dict[str, Any]:
        return self.rt.stats()

    def shutdown(self) -> None:  # the runtime is the session's
        pass


FAMILIES = {
    "qwen2.5.jinja": ({"eos_token": "<|im_end|>"}, "<tool_call>\n{"),
    "llama3.2.jinja": ({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, None),
    "mistral-v0.3.jinja": ({"bos_token": "<s>", "eos_token": "</s>"}, "[TOOL_CALLS] ["),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_native_formats_on_the_bundled_model(rt, name):
    special, opener = FAMILIES[name]
    backend = Templated(rt, (TEMPLATES / name).read_text(), special)
    with Server(backend, model_name="m").start() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        kw: dict[str, Any] = dict(
            model="m",
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER, TIME],
            tool_choice="required",
            max_tokens=120,
            temperature=0,
        )
        r = client.chat.completions.create(**kw)
        chunks, content, calls = streamed(client, **kw)
        prompt = backend.prompts[0]
        assert "get_weather" in prompt and "You can call these functions" not in prompt
        message = r.choices[0].message
        assert message.content is None and r.choices[0].finish_reason == "tool_calls"
        for c in message.tool_calls:
            check_call(c)
            if name.startswith("mistral"):
                assert len(c.id) == 9 and c.id.isalnum()  # what its template requires
        assert without_ids(calls) == without_ids(as_dicts(message.tool_calls))
        assert content == "" and last_reason(chunks) == "tool_calls"
        # the calls and their results go back through the template in the next turn
        history = [
            *kw["messages"],
            message.model_dump(exclude_none=True),
            *(
                {"role": "tool", "tool_call_id": c.id, "content": "21 C"}
                for c in message.tool_calls
            ),
        ]
        if name.startswith("llama"):  # its template renders one call per message
            history[1]["tool_calls"] = history[1]["tool_calls"][:1]
            history = history[:3]
        r2 = client.chat.completions.create(
            **{**kw, "messages": history, "tool_choice": "none", "max_tokens": 8}
        )
        assert r2.choices[0].message.content and not r2.choices[0].message.tool_calls
        if opener is not None:
            assert opener in backend.prompts[-1]
        args = json.loads(message.tool_calls[0].function.arguments)
        assert json.dumps(args, ensure_ascii=False) in backend.prompts[-1]  # as an object


# -- LangChain --------------------------------------------------------------------------------


def test_langchain_tool_loop(server, model):
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        base_url=server.url + "/v1",
        api_key="unused",
        model=model,
        temperature=0,
        max_tokens=80,
        max_retries=0,
    )
    bound = llm.bind_tools([WEATHER, TIME], tool_choice="required")
    question = [HumanMessage("What is the weather in Paris and in Rome?")]
    ai = bound.invoke(question)
    assert ai.tool_calls and not ai.invalid_tool_calls
    for c in ai.tool_calls:
        tool = TOOLS[c["name"]]
        jsonschema.validate(c["args"], tool["function"]["parameters"])
    merged = None
    for chunk in bound.stream(question):
        merged = chunk if merged is None else merged + chunk
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [
        (c["name"], c["args"]) for c in ai.tool_calls
    ]
    results = [ToolMessage("21 C", tool_call_id=c["id"]) for c in ai.tool_calls]
    answer = llm.bind_tools([WEATHER, TIME], tool_choice="none").invoke([*question, ai, *results])
    assert isinstance(answer.content, str) and answer.content and not answer.tool_calls


def test_qwen3_coder_xml_calls_on_the_bundled_model(rt):
    """Qwen3-Coder's template as published: the model writes its XML layout under the
    constraint, each call reads back with arguments its schema accepts, streamed too."""
    backend = Templated(
        rt, (TEMPLATES / "qwen3-coder.jinja").read_text(), {"eos_token": "<|im_end|>"}
    )
    with Server(backend, model_name="m").start() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        kw: dict[str, Any] = dict(
            model="m",
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER, TIME],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=80,
            temperature=0,
        )
        r = client.chat.completions.create(**kw)
        [call] = r.choices[0].message.tool_calls
        check_call(call)
        assert r.choices[0].finish_reason == "tool_calls"
        check_streamed_arguments(client, kw, call)
    assert "<parameter=" in backend.prompts[0]  # the template taught the layout


def test_pythonic_calls_on_the_bundled_model(rt):
    """Llama 3.2's pythonic template (vLLM's example): the model writes a Python list of
    calls under the constraint, read back with arguments its schema accepts."""
    backend = Templated(
        rt,
        (TEMPLATES / "llama3.2-pythonic.jinja").read_text(),
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"},
    )
    with Server(backend, model_name="m").start() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        kw: dict[str, Any] = dict(
            model="m",
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER, TIME],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=60,
            temperature=0,
        )
        r = client.chat.completions.create(**kw)
        [call] = r.choices[0].message.tool_calls
        check_call(call)
        check_streamed_arguments(client, kw, call)


def test_gpt_oss_calls_after_thinking_on_the_bundled_model(rt):
    """gpt-oss's template as published (harmony channels): with a thinking budget the model
    thinks in the analysis channel, the server closes it (`<|end|><|start|>assistant`), and
    the call comes on the commentary channel to functions.NAME, read back valid (streamed:
    test_tools_gemma_gptoss.py); the call and its result go back through the template, and an
    answer under tool_choice none comes under the final channel, whose header content leaves
    out."""
    backend = Templated(rt, (TEMPLATES / "gpt-oss.jinja").read_text(), {"eos_token": "<|im_end|>"})
    with Server(backend, model_name="m").start() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        kw: dict[str, Any] = dict(
            model="m",
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER, TIME],
            tool_choice="required",
            max_tokens=60,
            temperature=0,
            extra_body={"thinking_budget": 8},
        )
        r = client.chat.completions.create(**kw)
        message = r.choices[0].message
        [call] = message.tool_calls
        check_call(call)
        assert message.content is None and r.choices[0].finish_reason == "tool_calls"
        assert message.reasoning_content and "<|end|>" not in message.reasoning_content
        answered = backend.prompts[-1]
        assert answered.endswith("<|end|><|start|>assistant")  # the budget closed the thinking
        history = [
            *kw["messages"],
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "21 C"},
        ]
        r2 = client.chat.completions.create(
            **{**kw, "messages": history, "tool_choice": "none", "max_tokens": 40}
        )
        assert r2.choices[0].message.content and not r2.choices[0].message.tool_calls
        assert "<|channel|>" not in r2.choices[0].message.content
    prompt = backend.prompts[-1]
    assert f"to=functions.{call.function.name}<|channel|>commentary json<|message|>" in prompt
    assert "<|start|>functions." in prompt and "21 C" in prompt


def test_gemma3_calls_on_the_bundled_model(rt):
    """Gemma 3's template as published (no tool syntax): lmprog's note asks for Google's
    Python-list layout, the model writes it under the constraint, the calls read back valid,
    and calls and results go back through the template (user and model turns alternating)."""
    backend = Templated(
        rt, (TEMPLATES / "gemma-3.jinja").read_text(), {"bos_token": "", "eos_token": "<|im_end|>"}
    )
    with Server(backend, model_name="m").start() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        kw: dict[str, Any] = dict(
            model="m",
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER, TIME],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=60,
            temperature=0,
        )
        r = client.chat.completions.create(**kw)
        [call] = r.choices[0].message.tool_calls
        check_call(call)
        assert "Python list" in backend.prompts[0]  # lmprog's note
        history = [
            *kw["messages"],
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "21 C"},
        ]
        r2 = client.chat.completions.create(
            **{**kw, "messages": history, "tool_choice": "none", "max_tokens": 8}
        )
        assert r2.choices[0].message.content and not r2.choices[0].message.tool_calls
    assert "```tool_output\n21 C\n```" in backend.prompts[-1]
