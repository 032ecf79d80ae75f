"""Tool calls in Gemma 3's and gpt-oss's own formats, without a model: the format chosen from
each template as published (tests/data/chat_templates/gemma-3.jinja, gpt-oss.jinja), the
constraint of the calls (with gpt-oss's thinking before them), hand-written outputs read back
whole and streamed with a split at every position, earlier calls and results rendered
through the template, and the server through the openai client on a scripted backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from fakes import FakeBackend
from test_tools import CITY, NOARGS, _hf_tokenizer, _with_dict_arguments, assemble

from lmprog.core.chat import ChatTemplate, template_from_tokenizer
from lmprog.core.reasoning import FORMATS
from lmprog.serve import Server
from lmprog.serve.prompts import render_chat
from lmprog.serve.reasoning import OutputSplit, ReasoningPlan
from lmprog.serve.schemas.chat import ChatMessage
from lmprog.serve.tools.formats import GEMMA3, HARMONY, PYTHONIC, tool_format
from lmprog.serve.tools.plan import plan_tools

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
GEMMA = ChatTemplate((TEMPLATES / "gemma-3.jinja").read_text(), special_tokens={"bos_token": ""})
GPT_OSS = ChatTemplate((TEMPLATES / "gpt-oss.jinja").read_text())
GPT_OSS_REASONING = FORMATS["gpt-oss"]

# what gpt-oss writes after its generation prompt `<|start|>assistant` (OpenAI's harmony docs)
HARMONY_CALL = (
    "<|channel|>commentary to=functions.weather <|constrain|>json<|message|>"
    '{"city": "Oslo \\"old\\" <|end|>"}<|call|>'
)
THOUGHT = "<|channel|>analysis<|message|>The user wants Oslo's weather.<|end|><|start|>assistant"
ANSWER = "<|channel|>final<|message|>It is 21 degrees in Oslo."


def test_formats_chosen_from_the_published_templates():
    assert tool_format(GEMMA) is GEMMA3
    assert tool_format(GPT_OSS) is HARMONY
    vllm_gemma = "{{ bos_token }}<start_of_turn>... [func_name1(params_name1=params_value1, ...)]"
    assert tool_format(ChatTemplate(vllm_gemma)) is PYTHONIC  # a template that asks for them


def every_split(plan, text: str, thinking: ReasoningPlan | None = None) -> list[Any]:
    """The output streamed as two pieces split at every position (and whole): the server's
    path (reasoning split, then the call reader), each giving the same message."""
    outs = []
    for i in range(len(text) + 1):
        split, reader = OutputSplit(thinking), plan.reader()
        deltas: list[dict[str, Any]] = []
        reasoning = ""
        for piece in (text[:i], text[i:]):
            r, a = split.feed(piece)
            reasoning += r
            deltas += reader.feed(a) if a else []
        r, a = split.finish()
        reasoning += r
        deltas += (reader.feed(a) if a else []) + reader.finish()
        content, calls = assemble(deltas)
        assert calls == reader.tool_calls, (i, calls)
        assert (content or None) == reader.content, i
        outs.append((reasoning or None, reader.content, _named(calls), reader.cut))
    assert all(o == outs[0] for o in outs), text
    return outs[0]


def _named(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


# -- gpt-oss: harmony ------------------------------------------------------------------------


def test_gpt_oss_calls_are_constrained_after_its_thinking():
    plan = plan_tools([CITY, NOARGS], "auto", None, HARMONY)
    assert plan.prompt is None and plan.headed  # the template lists the tools and channels
    whole = ReasoningPlan(GPT_OSS_REASONING, "none").constrain(plan.constraint, headed=True)
    ping = "<|channel|>commentary to=functions.ping <|constrain|>json<|message|>{}<|call|>"
    for text in (HARMONY_CALL, THOUGHT + HARMONY_CALL, ANSWER, THOUGHT + ANSWER, ping):
        assert whole.matches(text), text
    bad = [
        HARMONY_CALL.replace("weather", "forecast"),  # no such tool
        HARMONY_CALL.replace('"city"', '"town"'),  # arguments off its schema
        HARMONY_CALL + HARMONY_CALL,  # one call per message: <|call|> ends it
        HARMONY_CALL[: -len("<|call|>")],  # the call must end
        "It is 21 degrees.",  # an answer opens the final channel
        THOUGHT + "<|channel|>analysis<|message|>more<|end|>" + ANSWER,  # one thinking block
        THOUGHT.replace("<|start|>assistant", "") + HARMONY_CALL,  # the next message's role
    ]
    for text in bad:
        assert not whole.matches(text), text
    required = plan_tools([CITY], "required", None, HARMONY).constraint
    assert required.matches(HARMONY_CALL) and not required.matches(ANSWER)
    none = plan_tools([CITY], "none", None, HARMONY)
    assert none.headed and none.constraint.matches(ANSWER)
    assert not none.constraint.matches(HARMONY_CALL)


def test_gpt_oss_answer_constraint_comes_under_the_final_channel():
    """A response_format after gpt-oss's thinking: the answer gets the final channel's
    header (the template's answers have it), and splits back to the bare JSON."""
    from lmprog.fsm import Constraint

    schema = Constraint.from_json_schema(
        {"type": "object", "properties": {"a": {"type": "integer"}}}
    )
    whole = ReasoningPlan(GPT_OSS_REASONING, "none").constrain(schema)
    text = THOUGHT + '<|channel|>final<|message|>{"a": 1}'
    assert whole.matches(text) and not whole.matches(THOUGHT + '{"a": 1}')
    assert GPT_OSS_REASONING.split(text) == ("The user wants Oslo's weather.", '{"a": 1}')


@pytest.mark.parametrize("thought", ["", THOUGHT])
def test_gpt_oss_calls_read_back_with_a_split_anywhere(thought):
    plan = plan_tools([CITY, NOARGS], "auto", None, HARMONY)
    thinking = ReasoningPlan(GPT_OSS_REASONING, "none")
    reasoning, content, calls, cut = every_split(plan, thought + HARMONY_CALL, thinking)
    assert reasoning == ("The user wants Oslo's weather." if thought else None)
    assert content is None and not cut
    assert calls == [("weather", {"city": 'Oslo "old" <|end|>'})]
    reasoning, content, calls, cut = every_split(plan, thought + ANSWER, thinking)
    assert (content, calls, cut) == ("It is 21 degrees in Oslo.", [], False)
    # without the reasoning parser the reader drops the final channel's header itself
    assert every_split(plan, ANSWER)[1:] == ("It is 21 degrees in Oslo.", [], False)


def test_gpt_oss_call_without_its_stop_token_and_cut_calls():
    plan = plan_tools([CITY], "required", None, HARMONY)
    # <|call|> is a stop token: a backend may leave it out of the text
    read = plan.parse(HARMONY_CALL[: -len("<|call|>")])
    assert _named(read.tool_calls) == [("weather", {"city": 'Oslo "old" <|end|>'})]
    assert not read.cut and read.content is None
    for cut in (HARMONY_CALL[: HARMONY_CALL.index("Oslo")], HARMONY_CALL[:30]):
        read = plan.parse(cut)
        assert read.tool_calls == [] and read.cut and read.content == cut


def test_gpt_oss_history_renders_as_transformers_renders_it():
    """An earlier call (its thinking as the template's `thinking`) and its result through the
    template as published, as transformers renders the same messages."""
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Call the weather tool.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ]
    tok = _hf_tokenizer({"eos_token": "<|return|>"}, (TEMPLATES / "gpt-oss.jinja").read_text())
    ours = template_from_tokenizer(tok)
    messages = [ChatMessage.model_validate(m) for m in history]
    got = render_chat(ours, messages, None, max_json_depth=64, tools=[CITY], tool_format=HARMONY)
    want_messages = _with_dict_arguments(history)
    want_messages[1] = {**want_messages[1], "thinking": "Call the weather tool."}
    del want_messages[1]["reasoning_content"]
    want = tok.apply_chat_template(
        want_messages,
        tools=[CITY.model_dump(exclude_none=True)],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert got == want
    assert (
        "<|start|>assistant<|channel|>analysis<|message|>Call the weather tool.<|end|>"
        '<|start|>assistant to=functions.weather<|channel|>commentary json<|message|>{"city": "Oslo"}'
        "<|call|><|start|>functions.weather to=assistant<|channel|>commentary<|message|>"
    ) in got
    assert got.endswith("<|start|>assistant")


# -- Gemma 3: pythonic calls by lmprog's note ------------------------------------------------

GEMMA_CALLS = '[weather(city="Oslo, \\"old\\" ]"), ping()]'


def test_gemma3_calls_are_constrained_and_described_by_the_note():
    plan = plan_tools([CITY, NOARGS], "auto", None, GEMMA3)
    assert plan.prompt is not None and "Python list" in plan.prompt and '"weather"' in plan.prompt
    assert plan.constraint.matches(GEMMA_CALLS) and plan.constraint.matches("No call needed.")
    required = plan_tools([CITY, NOARGS], "required", None, GEMMA3).constraint
    assert required.matches(GEMMA_CALLS)
    for bad in (
        '[weather(town="Oslo")]',  # off the schema
        "[weather(city='Oslo')]",  # strings as JSON writes them
        '```tool_code\nweather(city="Oslo")\n```',  # the one layout the note asks for
        "[forecast()]",
    ):
        assert not required.matches(bad), bad
    assert not plan.constraint.matches("[forecast()]")  # under auto, nor as an answer
    one = plan_tools([CITY, NOARGS], "auto", None, GEMMA3, parallel=False).constraint
    assert one.matches("[ping()]") and not one.matches("[ping(), ping()]")


def test_gemma3_calls_read_back_with_a_split_anywhere():
    plan = plan_tools([CITY, NOARGS], "auto", None, GEMMA3)
    _, content, calls, cut = every_split(plan, GEMMA_CALLS)
    assert content is None and not cut
    assert calls == [("weather", {"city": 'Oslo, "old" ]'}), ("ping", {})]
    assert every_split(plan, "Sunny, 21 degrees.")[1:] == ("Sunny, 21 degrees.", [], False)
    cut = GEMMA_CALLS[: GEMMA_CALLS.index("ping")]
    read = plan.parse(cut)
    assert _named(read.tool_calls) == [("weather", {"city": 'Oslo, "old" ]'})] and read.cut


def test_gemma3_history_passes_its_template():
    """Gemma's template knows only alternating user and model turns: earlier calls are the
    model's text, results a user turn in a tool_output block (two results and the user's
    next words one turn)."""
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                },
                {"id": "b", "type": "function", "function": {"name": "ping", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "21 C"},
        {"role": "tool", "tool_call_id": "b", "content": "up"},
        {"role": "user", "content": "Thanks. And tomorrow?"},
    ]
    plan = plan_tools([CITY, NOARGS], "auto", None, GEMMA3)
    messages = [ChatMessage.model_validate(m) for m in history]
    got = render_chat(GEMMA, messages, plan.prompt, max_json_depth=64, tool_format=GEMMA3)
    assert got.startswith("<start_of_turn>user\nBe brief.\n\nYou have access to functions")
    assert '<start_of_turn>model\n[weather(city="Oslo"), ping()]<end_of_turn>\n' in got
    assert (
        "<start_of_turn>user\n```tool_output\n21 C\n```\n\n```tool_output\nup\n```\n\n"
        "Thanks. And tomorrow?<end_of_turn>\n<start_of_turn>model\n"
    ) in got


# -- through the server and the openai client -------------------------------------------------


END = "<END>"  # the scripted text ends with it, a stop string: the choice finishes "stop"


def _serve(template: str, text: str) -> Any:
    return FakeBackend(responder=lambda _request: text + END, template=template)


TOOLS = [CITY.model_dump(exclude_none=True), NOARGS.model_dump(exclude_none=True)]
ASK = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.mark.parametrize(
    "name,text,calls",
    [
        ("gpt-oss.jinja", THOUGHT + HARMONY_CALL, [("weather", {"city": 'Oslo "old" <|end|>'})]),
        ("gemma-3.jinja", GEMMA_CALLS, [("weather", {"city": 'Oslo, "old" ]'}), ("ping", {})]),
    ],
)
def test_calls_through_the_openai_client(name, text, calls):
    backend = _serve((TEMPLATES / name).read_text(), text)
    with Server(backend, model_name="m").start() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, stop=[END])
        message, choice = r.choices[0].message, r.choices[0]
        assert choice.finish_reason == "tool_calls" and message.content is None
        assert _named([c.model_dump() for c in message.tool_calls]) == calls
        assert backend.requests[-1].constraint.matches(text)  # what the model was held to
        chunks = list(
            client.chat.completions.create(
                model="m", messages=ASK, tools=TOOLS, stop=[END], stream=True
            )
        )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed: dict[int, list[str]] = {}
    for d in deltas:
        for tc in d.tool_calls or ():
            entry = streamed.setdefault(tc.index, ["", ""])
            entry[0] += tc.function.name or ""
            entry[1] += tc.function.arguments or ""
    assert [(n, json.loads(a)) for n, a in streamed.values()] == calls
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    if name == "gpt-oss.jinja":
        assert message.reasoning_content == "The user wants Oslo's weather."
        reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        assert reasoning == message.reasoning_content


def test_gpt_oss_markers_are_its_special_tokens():
    """Where the tokenizer has harmony's markers as special tokens, the call's constraint
    takes their ids (gpt-oss writes them so), forces them by id, and still reads the text."""
    from lmprog.fsm.compose import special_markers
    from lmprog.fsm.index import TokenIndex
    from lmprog.fsm.jump import jump_forward
    from tests.fsm.fsm_toys import special_tokenizer

    names = ("<|channel|>", "<|message|>", "<|call|>", "<|end|>", "<|start|>", "<|constrain|>")
    tok = special_tokenizer(names)
    fmt = GPT_OSS_REASONING
    markers = (*HARMONY.fixed_texts, fmt.start, fmt.end, fmt.after_end, fmt.answer_prefix)
    specials = special_markers(tok, markers)
    assert set(specials) == set(names)
    plan = plan_tools([CITY, NOARGS], "auto", None, HARMONY, specials=specials)
    whole = ReasoningPlan(fmt, "none").constrain(plan.constraint, headed=True, specials=specials)
    call = HARMONY_CALL.replace(" <|end|>", "")
    for text in (call, THOUGHT + call, ANSWER, THOUGHT + ANSWER, THOUGHT + HARMONY_CALL):
        assert whole.matches(text), text  # `<|end|>` in the arguments' string: its text
    assert not whole.matches(call + call)
    guide = TokenIndex.get(whole, tok).new_guide()
    assert set(guide.allowed_token_ids().tolist()) == {specials["<|channel|>"]}
    head = tok.encode("<|channel|>commentary to=functions.weather", add_special_tokens=False)
    guide.advance_all(head)
    result = jump_forward(guide, head, tok)
    assert specials["<|constrain|>"] in result.new_token_ids  # by id, not spelled
    assert specials["<|message|>"] in result.new_token_ids
    out = result.apply(head)
    rest = tok.decode(out)[len(tok.decode(head)) :]
    assert rest.startswith(" <|constrain|>json<|message|>")
    args = tok.encode('{"city": "Oslo"}<|call|>', add_special_tokens=False)
    guide.rollback(guide.num_tokens)
    ids = tok.encode(call.replace('Oslo \\"old\\"', "Oslo"), add_special_tokens=False)
    assert ids[-len(args) :] == args and specials["<|call|>"] == ids[-1]
    guide.advance_all(ids)
    assert guide.can_stop()
