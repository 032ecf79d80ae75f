"""Tool calls without a model: each family's call format chosen from its chat template
(tests/data/chat_templates/, written from the public definitions), the constraint of its
calls, the calls read back from text in the family's syntax (whole and streamed), calls cut
short, and earlier calls rendered through the template as transformers renders them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from lmprog.core.chat import ChatTemplate, template_from_tokenizer
from lmprog.serve.constraints import output_constraint
from lmprog.serve.errors import APIError
from lmprog.serve.prompts import render_chat
from lmprog.serve.schemas.chat import ChatMessage, NamedToolChoice, Tool
from lmprog.serve.schemas.completions import ResponseFormat
from lmprog.serve.tools.formats import (
    DEEPSEEK,
    GENERIC,
    HERMES,
    LLAMA3,
    MISTRAL,
    ToolFormat,
    json_value_end,
    tool_format,
)
from lmprog.serve.tools.plan import plan_tools

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
SPECIAL = {
    "qwen2.5.jinja": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "hermes-3.jinja": {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"},
    "llama3.1.jinja": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3.2.jinja": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mistral-v0.3.jinja": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "mistral-nemo.jinja": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "deepseek-r1-distill-qwen.jinja": {
        "bos_token": "<｜begin▁of▁sentence｜>",
        "eos_token": "<｜end▁of▁sentence｜>",
    },
}
FAMILY = {
    "qwen2.5.jinja": "hermes",
    "hermes-3.jinja": "hermes",
    "llama3.1.jinja": "llama3",
    "llama3.2.jinja": "llama3",
    "mistral-v0.3.jinja": "mistral",
    "mistral-nemo.jinja": "mistral",
}

CITY = Tool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
)
NOARGS = Tool.model_validate(
    {"type": "function", "function": {"name": "ping", "description": "Is the server up?"}}
)
FORMATS = [GENERIC, HERMES, LLAMA3, MISTRAL, DEEPSEEK]


def call(name: str, args: Any) -> str:
    return '{"name": ' + json.dumps(name) + ', "arguments": ' + json.dumps(args) + "}"


def template(name: str) -> ChatTemplate:
    special = SPECIAL[name]
    return ChatTemplate((TEMPLATES / name).read_text(), special_tokens=special)


# -- the generic format (templates without a tool-call syntax: the bundled model's) ---------


def test_required_calls_match_their_tools_schema():
    plan = plan_tools([CITY, NOARGS], "required", None)
    assert plan.constraint.matches(call("weather", {"city": "Oslo"}))
    assert plan.constraint.matches(call("ping", {}))
    assert plan.constraint.matches(call("ping", {}) + "\n" + call("weather", {"city": "Oslo"}))
    assert not plan.constraint.matches(call("weather", {"town": "Oslo"}))  # not in the schema
    assert not plan.constraint.matches(call("ping", {"x": 1}))
    assert not plan.constraint.matches(call("other", {}))
    assert not plan.constraint.matches("It is sunny.")
    [tool_call] = plan.parse(call("weather", {"city": "Oslo"})).tool_calls
    assert tool_call["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert tool_call["type"] == "function" and re.fullmatch(r"call_[0-9a-f]{24}", tool_call["id"])
    assert (
        "weather" in plan.prompt
        and '"city"' in plan.prompt
        and "one such object per line" in plan.prompt
    )


def test_parallel_tool_calls_false_allows_one_call():
    two = call("ping", {}) + "\n" + call("ping", {})
    plan = plan_tools([CITY, NOARGS], "required", None, parallel=False)
    assert plan.constraint.matches(call("ping", {})) and not plan.constraint.matches(two)
    assert "per line" not in plan.prompt
    reader = plan.parse(two)  # not under the constraint: the one call is kept, the rest dropped
    assert [c["function"]["name"] for c in reader.tool_calls] == ["ping"] and reader.cut


def test_named_choice_allows_only_that_tool():
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "ping"}})
    plan = plan_tools([CITY, NOARGS], named, None)
    assert plan.constraint.matches(call("ping", {}))
    assert not plan.constraint.matches(call("weather", {"city": "Oslo"}))
    assert plan.names == {"ping"}


def test_auto_allows_calls_or_an_answer():
    plan = plan_tools([CITY], "auto", None)
    assert plan.constraint.matches(call("weather", {"city": "Rome"}))
    assert plan.constraint.matches("Sunny, 20 degrees.\nAnything else?")
    assert not plan.constraint.matches('{"answer": 1}') and not plan.constraint.matches("")
    answer = plan.parse("Sunny.")
    assert answer.content == "Sunny." and answer.tool_calls == []
    json_answers = plan_tools(
        [CITY], "auto", output_constraint(ResponseFormat(type="json_object"), None)
    )
    assert json_answers.constraint.matches('{"answer": 1}')
    assert json_answers.parse('{"answer": 1}').content == '{"answer": 1}'
    [c] = json_answers.parse(call("weather", {"city": "Rome"})).tool_calls
    assert c["function"]["name"] == "weather"


def test_none_and_no_tools():
    plan = plan_tools([CITY], "none", None)
    assert plan.calls is None and plan.prompt is None
    assert plan.constraint.matches("Plain words.")
    assert not plan.constraint.matches(call("weather", {"city": "x"}))
    assert plan_tools(None, None, None) == plan_tools([], None, None)
    assert plan_tools(None, None, None).constraint is None
    with pytest.raises(APIError, match="tool_choice needs tools"):
        plan_tools(None, "auto", None)
    with pytest.raises(APIError, match="two tools"):
        plan_tools([CITY, CITY], "auto", None)


def test_arguments_and_response_formats_are_strict_unless_they_say_false():
    """Issue 28: no invented keys where the schema lists its keys; `strict: false` asks for
    JSON Schema's reading (unlisted keys allowed)."""
    open_params = {"type": "object", "properties": {"city": {"type": "string"}}}
    for strict, ok in ((None, False), (True, False), (False, True)):
        function = {"name": "weather", "parameters": open_params}
        if strict is not None:
            function["strict"] = strict
        tool = Tool.model_validate({"type": "function", "function": function})
        plan = plan_tools([tool], "required", None)
        assert plan.constraint.matches(call("weather", {"city": "Oslo"}))
        assert plan.constraint.matches(call("weather", {"city": "Oslo", "x": 1})) is ok
        fmt = {"name": "f", "schema": open_params}
        if strict is not None:
            fmt["strict"] = strict
        rf = output_constraint(
            ResponseFormat.model_validate({"type": "json_schema", "json_schema": fmt})
        )
        assert rf.matches('{"city": "Oslo", "x": 1}') is ok and rf.strict is not ok
    assert output_constraint(ResponseFormat(type="json_object")).matches('{"any": {"key": 1}}')


def test_every_tools_schema_is_checked_whatever_the_choice():
    bad = Tool.model_validate(
        {"type": "function", "function": {"name": "bad", "parameters": {"type": "bogus"}}}
    )
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "ping"}})
    for choice in ("auto", "none", "required", named):
        with pytest.raises(APIError) as err:
            plan_tools([NOARGS, bad], choice, None)
        assert err.value.param == "tools[1].function.parameters", choice
        assert err.value.status == 400 and err.value.code == "invalid_schema"


# -- each family's format, from its template -----------------------------------------------


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_format_is_chosen_from_the_template(name):
    fmt = tool_format(template(name))
    assert fmt.family == FAMILY[name] and fmt.native
    plan = plan_tools([CITY], "auto", None, fmt)
    assert plan.prompt is None  # the template describes the tools: no lmprog note


def test_mistral_opener_follows_the_template():
    assert tool_format(template("mistral-v0.3.jinja")).opener == "[TOOL_CALLS] ["
    assert tool_format(template("mistral-nemo.jinja")).opener == "[TOOL_CALLS]["


def test_templates_without_a_call_syntax_get_the_generic_format():
    for source in ("chatml", "llama-3", "plain"):
        assert tool_format(ChatTemplate(source)) is GENERIC
    from lmprog.core.models import load_tokenizer, resolve_model

    bundled = template_from_tokenizer(load_tokenizer(resolve_model()))
    assert tool_format(bundled) is GENERIC
    assert plan_tools([CITY], "auto", None, tool_format(bundled)).prompt is not None


def history_call_text(name: str) -> str:
    """What the template writes for an assistant's earlier call, the text the model is
    taught to produce (between the generation prompt and the end of the turn)."""
    t = template(name)
    user = [{"role": "user", "content": "Weather in Oslo?"}]
    asked = t.render(user, add_generation_prompt=True, tools=[CITY.model_dump()])
    answered = t.render(
        [
            *user,
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "abcDEF123",
                        "type": "function",
                        "function": {"name": "weather", "arguments": {"city": "Oslo"}},
                    }
                ],
            },
        ],
        tools=[CITY.model_dump()],
    )
    assert answered.startswith(asked)
    text = answered[len(asked) :]
    return text[: text.rindex(SPECIAL[name]["eos_token"])]


@pytest.mark.parametrize(
    "name", ["qwen2.5.jinja", "hermes-3.jinja", "llama3.1.jinja", "llama3.2.jinja"]
)
def test_what_the_template_teaches_is_what_is_constrained_and_read(name):
    fmt = tool_format(template(name))
    text = history_call_text(name).lstrip("\n")  # Qwen's turn opens "assistant" + "\n"
    plan = plan_tools([CITY, NOARGS], "required", None, fmt)
    assert plan.constraint.matches(text), (name, text)
    reader = plan.parse(text)
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reader.tool_calls
    ] == [("weather", {"city": "Oslo"})]
    assert reader.content is None and not reader.cut


@pytest.mark.parametrize("name", ["mistral-v0.3.jinja", "mistral-nemo.jinja"])
def test_mistral_calls_are_the_templates_layout_without_the_id(name):
    fmt = tool_format(template(name))
    # The template writes the history's call ids too; the model writes only name and arguments.
    written = history_call_text(name)
    assert (
        written
        == fmt.opener + '{"name": "weather", "arguments": {"city": "Oslo"}, "id": "abcDEF123"}]'
    )
    plan = plan_tools([CITY, NOARGS], "required", None, fmt)
    text = (
        fmt.opener
        + '{"name": "weather", "arguments": {"city": "Oslo"}}, {"name": "ping", "arguments": {}}]'
    )
    assert plan.constraint.matches(text)
    calls = plan.parse(text).tool_calls
    assert [c["function"]["name"] for c in calls] == ["weather", "ping"]
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c["id"]) for c in calls)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.family)
def test_each_format_constrains_calls_and_answers(fmt: ToolFormat):
    one = fmt.calls_text([("weather", {"city": "Oslo"})])
    two = fmt.calls_text([("weather", {"city": "Oslo"}), ("ping", {})])
    auto = plan_tools([CITY, NOARGS], "auto", None, fmt)
    assert auto.constraint.matches(one) and auto.constraint.matches("Hello there")
    assert auto.constraint.matches(two) == (fmt.max_calls is None)
    assert not auto.constraint.matches(
        fmt.marker + " not a call"
    )  # an answer never opens like a call
    assert not auto.constraint.matches(fmt.calls_text([("weather", {"town": "Oslo"})]))
    if len(fmt.marker) > 1:  # a proper prefix of the marker is an answer
        assert auto.constraint.matches(fmt.marker[:-1])
    none = plan_tools([CITY, NOARGS], "none", None, fmt)
    assert none.constraint.matches("Hello there") and not none.constraint.matches(one)


# -- reading calls as the text grows -------------------------------------------------------


def replay(plan, text: str, size: int) -> tuple[list[dict[str, Any]], Any]:
    reader = plan.reader()
    deltas: list[dict[str, Any]] = []
    for i in range(0, len(text), size):
        deltas += reader.feed(text[i : i + size])
    deltas += reader.finish()
    return deltas, reader


def assemble(deltas: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The message a client builds from the deltas, checking OpenAI's delta shapes."""
    content, calls = "", []
    for d in deltas:
        assert set(d) in ({"content"}, {"tool_calls"}), d
        content += d.get("content", "")
        for tc in d.get("tool_calls", []):
            if tc["index"] == len(calls):  # a call's first delta: id, type, name, arguments ""
                assert set(tc) == {"index", "id", "type", "function"} and tc["type"] == "function"
                assert tc["function"]["arguments"] == ""
                calls.append({"id": tc["id"], "type": "function", "function": dict(tc["function"])})
            else:  # then argument fragments only
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                assert tc["index"] == len(calls) - 1 and tc["function"]["arguments"]
                calls[tc["index"]]["function"]["arguments"] += tc["function"]["arguments"]
    return content, calls


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.family)
@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_streamed_deltas_build_the_same_calls(fmt: ToolFormat, size: int):
    calls = [("weather", {"city": 'Oslo {x} "y"'}), ("ping", {})]
    text = fmt.calls_text(calls[:1] if fmt.max_calls == 1 else calls)
    plan = plan_tools([CITY, NOARGS], "auto", None, fmt)
    deltas, reader = replay(plan, text, size)
    content, streamed = assemble(deltas)
    assert content == "" and reader.content is None and not reader.cut
    assert streamed == reader.tool_calls
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed] == [
        (n, a) for n, a in calls[: len(streamed)]
    ]
    assert len(streamed) == (1 if fmt.max_calls == 1 else 2)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.family)
def test_answers_stream_as_content_once_they_cannot_be_calls(fmt: ToolFormat):
    plan = plan_tools([CITY], "auto", None, fmt)
    reader = plan.reader()
    held = fmt.marker[:-1]
    assert reader.feed(held) == []  # could still open a call
    assert reader.feed("!") == [{"content": held + "!"}]
    assert reader.feed(" more") == [{"content": " more"}]
    assert reader.finish() == [] and reader.content == held + "! more"
    if held:
        short = plan.reader()
        assert short.feed(held) == [] and short.finish() == [{"content": held}]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.family)
def test_a_call_cut_short_streams_as_written_but_is_never_returned_as_a_call(fmt: ToolFormat):
    """Issue 28: max_tokens inside a call's name or arguments leaves text, not a call (its
    arguments would not parse); the calls before it are whole and stay calls."""
    text = fmt.calls_text([("weather", {"city": "Oslo"})])
    plan = plan_tools([CITY], "auto", None, fmt)
    cut_in_arguments = text[: text.index("Oslo") + 2]
    deltas, reader = replay(plan, cut_in_arguments, 4)
    assert reader.cut and reader.tool_calls == []
    assert reader.content == cut_in_arguments  # no whole call: the whole text
    content, [streamed] = assemble(deltas)  # streamed as it was written
    assert content == "" and streamed["function"] == {
        "name": "weather",
        "arguments": '{"city": "Os',
    }
    for cut in (text[: text.index("weather") + 3], text[: text.index("{", 1) + 1]):
        reader = plan.parse(cut)  # in the name, or the arguments just opened
        assert reader.cut and reader.tool_calls == [] and reader.content == cut
    cut_in_tail = text[:-1]  # the arguments are whole: a call
    reader = plan.parse(cut_in_tail)
    assert reader.cut and reader.content is None
    assert json.loads(reader.tool_calls[0]["function"]["arguments"]) == {"city": "Oslo"}


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f.max_calls is None], ids=lambda f: f.family)
def test_whole_calls_before_a_cut_one_stay_calls(fmt: ToolFormat):
    text = fmt.calls_text([("weather", {"city": "Oslo"}), ("weather", {"city": "Rome"})])
    plan = plan_tools([CITY], "required", None, fmt)
    key = fmt.args_key.strip(", ")  # '"arguments":', '"parameters":', "```json"
    for cut in (text[: text.index("Rome")], text[: text.rindex(key) + 2]):
        reader = plan.parse(cut)
        [call] = reader.tool_calls
        assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
        second = cut.rindex(fmt.head)
        assert reader.cut and reader.content == cut[second:]


def test_json_value_end():
    assert json_value_end('{"a": "}"}} tail', 0, False) == (10, True)
    assert json_value_end("x[1, [2]]]", 1, False) == (9, True)
    assert json_value_end('"a\\"b"}', 0, False) == (6, True)
    assert json_value_end('{"a": {', 0, False) == (7, False)
    assert json_value_end("12", 0, False) == (0, False)  # a number may go on
    assert json_value_end("12", 0, True) == (2, True)
    assert json_value_end("12}", 0, False) == (2, True)


def test_json_value_end_resumes_where_it_stopped():
    text = 'x{"a": "\\"}]", "b": [1, {"c": "\\\\"}], "d": "é{"} tail'
    memo: dict[int, list[int]] = {}
    for n in range(1, len(text) + 1):  # the text grows one character at a time
        assert json_value_end(text[:n], 1, False, memo) == json_value_end(text[:n], 1, False)
    assert json_value_end(text, 1, False, memo) == (text.index(" tail"), True)


# -- earlier calls through the template, as transformers renders them ------------------------

HISTORY = [
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "abcDEF123",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "abcDEF123", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "21 degrees."},
    {"role": "user", "content": "And Rome?"},
]


def _hf_tokenizer(special: dict[str, str], source: str) -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(["<unk>", *special.values()]))}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")), **special
    )
    tok.chat_template = source
    return tok


def _with_dict_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as transformers' documentation writes them: arguments as dicts."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        if "tool_calls" in m:
            m["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    },
                }
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_history_renders_as_transformers_renders_it(name):
    source = (TEMPLATES / name).read_text()
    tok = _hf_tokenizer(SPECIAL[name], source)
    ours = template_from_tokenizer(tok)
    fmt = tool_format(ours)
    tools = [CITY]  # (Hermes 3's template needs every tool's parameters, as in transformers)
    messages = [ChatMessage.model_validate(m) for m in HISTORY]
    got = render_chat(ours, messages, None, max_json_depth=64, tools=tools, tool_format=fmt)
    want = tok.apply_chat_template(
        _with_dict_arguments(HISTORY),
        tools=[t.model_dump(exclude_none=True) for t in tools],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert got == want
    assert (
        '"city": "Oslo"' in got and '"{\\"city' not in got
    )  # arguments as an object, not a string
    assert "You can call these functions" not in got  # no lmprog note besides the template's


def test_generic_history_writes_calls_in_the_generic_layout():
    t = ChatTemplate("chatml")
    messages = [ChatMessage.model_validate(m) for m in HISTORY]
    plan = plan_tools([CITY], "auto", None, tool_format(t))
    got = render_chat(t, messages, plan.prompt, max_json_depth=64, tools=[CITY])
    assert "<|im_start|>assistant\n" + call("weather", {"city": "Oslo"}) + "<|im_end|>" in got
    assert got.startswith("<|im_start|>system\nYou can call these functions")


def test_mistral_call_ids_pass_its_template():
    fmt = tool_format(template("mistral-v0.3.jinja"))
    plan = plan_tools([CITY], "required", None, fmt)
    [c] = plan.parse(fmt.calls_text([("weather", {"city": "Oslo"})])).tool_calls
    history = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [c]},
        {"role": "tool", "tool_call_id": c["id"], "content": "21"},
    ]
    messages = [ChatMessage.model_validate(m) for m in history]
    got = render_chat(
        template("mistral-v0.3.jinja"), messages, None, max_json_depth=64, tool_format=fmt
    )
    assert f'"call_id": "{c["id"]}"' in got


def test_deepseek_r1_calls_from_its_template():
    """DeepSeek-R1's template (as published for its distills) renders earlier calls between
    its markers, the name as it is and the arguments as the JSON text they were sent as; its
    layout is what is constrained and read back, and, as the template lists no tools,
    lmprog's note describes them and the layout."""
    t = template("deepseek-r1-distill-qwen.jinja")
    fmt = tool_format(t)
    assert fmt is DEEPSEEK
    plan = plan_tools([CITY, NOARGS], "required", None, fmt)
    assert "weather" in plan.prompt and "<｜tool▁sep｜>NAME" in plan.prompt
    history = [
        ChatMessage.model_validate({"role": "user", "content": "Weather in Oslo?"}),
        ChatMessage.model_validate(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            }
        ),
        ChatMessage.model_validate({"role": "tool", "tool_call_id": "c1", "content": "Sunny"}),
    ]
    prompt = render_chat(t, history, plan.prompt, max_json_depth=64, tool_format=fmt)
    written = prompt.split("<｜Assistant｜>")[1].split("<｜end▁of▁sentence｜>")[0]
    assert written == fmt.calls_text([("weather", {"city": "Oslo"})])
    assert plan.constraint.matches(written)
    [read] = plan.parse(written).tool_calls
    assert (read["function"]["name"], json.loads(read["function"]["arguments"])) == (
        "weather",
        {"city": "Oslo"},
    )
    assert "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>Sunny" in prompt


# -- Qwen3-Coder's XML calls -------------------------------------------------------------------

FORECAST = Tool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "forecast",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                    "unit": {"enum": ["c", "f"]},
                    "code": {"type": "string", "pattern": "^[A-Z]{2}$"},
                },
                "required": ["city", "days"],
            },
        },
    }
)


def test_qwen3_coder_calls_from_its_template():
    from lmprog.serve.tools.formats import QWEN3_CODER

    t = ChatTemplate((TEMPLATES / "qwen3-coder.jinja").read_text())
    fmt = tool_format(t)
    assert fmt is QWEN3_CODER
    history = [
        ChatMessage.model_validate({"role": "user", "content": "Oslo, 3 days?"}),
        ChatMessage.model_validate(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {
                            "name": "forecast",
                            "arguments": '{"city": "Oslo\\nNorway", "days": 3}',
                        },
                    }
                ],
            }
        ),
    ]
    rendered = render_chat(t, history, None, max_json_depth=64, tools=[FORECAST], tool_format=fmt)
    written = rendered.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert written == fmt.call_text("forecast", {"city": "Oslo\nNorway", "days": 3})
    plan = plan_tools([FORECAST, NOARGS], "required", None, fmt)
    assert plan.prompt is None  # the template lists the tools and the layout
    assert plan.constraint.matches(written)
    assert not plan.constraint.matches(
        written.replace("<parameter=days>\n3", "<parameter=days>\nx")
    )
    assert not plan.constraint.matches(fmt.call_text("forecast", {"city": "Oslo"}))  # days required
    unit = fmt.call_text("forecast", {"city": "Oslo", "days": 2, "unit": "f"})
    assert plan.constraint.matches(unit)
    [read] = plan.parse(unit).tool_calls
    assert json.loads(read["function"]["arguments"]) == {"city": "Oslo", "days": 2, "unit": "f"}
    # a string with a pattern is written as a JSON string, so its pattern is checked
    coded = unit.replace("</function>", '<parameter=code>\n"NO"\n</parameter>\n</function>')
    assert plan.constraint.matches(coded)
    assert not plan.constraint.matches(coded.replace('"NO"', '"Norway"'))
    [read] = plan.parse(coded).tool_calls
    assert json.loads(read["function"]["arguments"])["code"] == "NO"


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_qwen3_coder_calls_stream_and_read_back(size):
    from lmprog.serve.tools.formats import QWEN3_CODER

    calls = [("forecast", {"city": "Rome </param", "days": 5}), ("ping", {})]
    text = QWEN3_CODER.calls_text(calls)
    plan = plan_tools([FORECAST, NOARGS], "auto", None, QWEN3_CODER)
    assert plan.constraint.matches(text) and plan.constraint.matches("Just an answer.")
    deltas, reader = replay(plan, text, size)
    content, streamed = assemble(deltas)
    assert content == "" and reader.content is None and not reader.cut
    assert streamed == reader.tool_calls
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed
    ] == calls
    answer = plan.parse("Just an answer.")
    assert answer.content == "Just an answer." and answer.tool_calls == []
    cut = plan.parse(text[: text.index("5")])
    assert cut.cut and cut.tool_calls == [] and cut.content == text[: text.index("5")]
    one = plan_tools([FORECAST], "required", None, QWEN3_CODER, parallel=False)
    assert not one.constraint.matches(QWEN3_CODER.calls_text([calls[0], calls[0]]))


def test_qwen3_coder_refuses_a_parameter_it_cannot_write():
    from lmprog.serve.tools.formats import QWEN3_CODER

    bad = Tool.model_validate(
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"a b": {"type": "string"}}},
            },
        }
    )
    with pytest.raises(APIError) as info:
        plan_tools([NOARGS, bad], "auto", None, QWEN3_CODER)
    assert info.value.param == "tools[1].function.parameters"


# -- pythonic calls (Llama 3.2's pythonic template) -----------------------------------------

FLAGS = Tool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "exact": {"type": "boolean"},
                },
                "required": ["query"],
            },
        },
    }
)


def test_pythonic_calls_from_the_template_that_asks_for_them():
    from lmprog.serve.tools.formats import PYTHONIC

    t = ChatTemplate(
        (TEMPLATES / "llama3.2-pythonic.jinja").read_text(),
        special_tokens={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    )
    assert tool_format(t) is PYTHONIC
    assert tool_format(template("llama3.2.jinja")).family == "llama3"  # Meta's asks for JSON
    plan = plan_tools([FLAGS, NOARGS], "required", None, PYTHONIC)
    assert plan.prompt is None  # the template lists the tools and the layout
    text = '[search(query="cats \\"and\\" (dogs)", exact=True), ping()]'
    assert plan.constraint.matches(text)
    assert plan.constraint.matches('[search(query="x", limit=3)]')
    assert not plan.constraint.matches("[search(limit=3)]")  # query is required
    assert not plan.constraint.matches('[search(exact=True, query="x")]')  # the schema's order
    assert not plan.constraint.matches('[search(query="x", exact=true)]')  # Python's literals
    calls = plan.parse(text).tool_calls
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("search", {"query": 'cats "and" (dogs)', "exact": True}),
        ("ping", {}),
    ]


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_pythonic_calls_stream_and_read_back(size):
    from lmprog.serve.tools.formats import PYTHONIC

    calls = [("search", {"query": "a, b) c", "limit": 2}), ("ping", {})]
    text = PYTHONIC.calls_text(calls)
    assert text == '[search(query="a, b) c", limit=2), ping()]'
    plan = plan_tools([FLAGS, NOARGS], "auto", None, PYTHONIC)
    assert plan.constraint.matches(text) and plan.constraint.matches("No call needed.")
    deltas, reader = replay(plan, text, size)
    content, streamed = assemble(deltas)
    assert content == "" and reader.content is None and not reader.cut
    assert streamed == reader.tool_calls
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed
    ] == calls
    cut = plan.parse(text[: text.index("limit")])
    assert cut.cut and cut.tool_calls == [] and cut.content == text[: text.index("limit")]
    answer = plan.parse("No call needed.")
    assert answer.content == "No call needed." and answer.tool_calls == []


# -- arguments as they become known (issue 36, section 4) ----------------------------------


def grown(deltas: list[dict[str, Any]], index: int) -> list[str]:
    """A call's arguments as a client has them after each of its argument fragments."""
    out, text = [], ""
    for d in deltas:
        for tc in d.get("tool_calls", []):
            if tc["index"] == index and tc["function"].get("arguments"):
                text += tc["function"]["arguments"]
                out.append(text)
    return out


@pytest.mark.parametrize("size", [1, 5])
def test_qwen3_coder_arguments_stream_as_each_parameter_is_written(size):
    """A string parameter's text streams as it is written (what may begin its end tag held
    back), any other once whole: OpenAI's argument fragments, not one at the call's end."""
    from lmprog.serve.tools.formats import QWEN3_CODER

    calls = [("forecast", {"city": "Rome </param\nend", "days": 5}), ("ping", {})]
    plan = plan_tools([FORECAST, NOARGS], "required", None, QWEN3_CODER)
    deltas, reader = replay(plan, QWEN3_CODER.calls_text(calls), size)
    first, second = grown(deltas, 0), grown(deltas, 1)
    final = json.dumps(calls[0][1])
    assert first[-1] == final and second == ["{", "{}"]
    assert all(final.startswith(known) for known in first)  # each fragment extends the last
    assert '{"city": "Rome </param\\nend"' in first  # whole before days is written
    assert any(
        k.startswith('{"city": "Ro') and len(k) < len('{"city": "Rome </param') for k in first
    )
    assert not any(k.endswith('"days": ') for k in first)  # a number only once whole
    assert [c["function"]["arguments"] for c in reader.tool_calls] == [final, "{}"]


def test_pythonic_arguments_stream_as_each_argument_is_written():
    from lmprog.serve.tools.formats import PYTHONIC

    calls = [("search", {"query": "a, b) c", "limit": 2}), ("ping", {})]
    plan = plan_tools([FLAGS, NOARGS], "required", None, PYTHONIC)
    deltas, reader = replay(plan, PYTHONIC.calls_text(calls), 1)
    assert grown(deltas, 0) == ["{", '{"query": "a, b) c"', '{"query": "a, b) c", "limit": 2}']
    assert grown(deltas, 1) == ["{", "{}"]
    cut = plan.parse('[search(query="x", lim')  # cut short: streamed as far as known, no call
    assert cut.tool_calls == [] and cut.cut
