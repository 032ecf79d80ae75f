"""lp.separate_reasoning without a model: a fake backend under a template that opens a think
block (tests/data/chat_templates/chatml-think.jinja). SGLang's semantics (the variable holds
the answer, `<name>_reasoning_content` the thinking, the state's text only the answer) and
lmprog's additions: the constraint applies after the thinking, streaming of both variables,
a thinking budget, a select that thinks first, and the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import FakeBackend

import lmprog as lp

THINK = (
    Path(__file__).parent.parent / "data" / "chat_templates" / "chatml-think.jinja"
).read_text()
THOUGHT = "The user wants the capital. It is Paris.\n</think>\n\n"


def responder(request):
    if str(request.prompt).endswith("</think>\n\n"):  # the budget's answer call
        return '{"city": "Paris"}'
    if request.constraint is not None and "yes" in request.constraint.lark:
        return THOUGHT + "yes"
    if request.constraint is not None:
        return THOUGHT + '{"city": "Paris"}'
    return THOUGHT + "Paris is the capital."


@lp.function
def ask(s, **kw):
    s += lp.user("Capital of France?")
    s += lp.assistant(lp.separate_reasoning(lp.gen("answer", max_tokens=64, **kw)))


def test_the_answer_and_the_thinking_are_two_variables():
    backend = FakeBackend(responder=responder, template=THINK)
    state = ask.run(backend=backend)
    assert state["answer"] == "Paris is the capital."
    assert state["answer_reasoning_content"] == "The user wants the capital. It is Paris."
    assert "It is Paris" not in state.text()  # the state's text keeps the answer only
    assert state.text().endswith("<|im_start|>assistant\nParis is the capital.<|im_end|>\n")
    # the template's generation prompt opened the block for the gen (not in the text)
    assert str(backend.generations()[-1].prompt).endswith("<|im_start|>assistant\n<think>\n")
    assert state.messages()[-1] == {"role": "assistant", "content": "Paris is the capital."}


def test_both_stream():
    backend = FakeBackend(responder=responder, template=THINK)
    state = ask.run(backend=backend, stream=True)
    thinking = list(state.text_iter("answer_reasoning_content"))
    answer = list(state.text_iter("answer"))
    assert "".join(thinking) == "The user wants the capital. It is Paris."
    assert "".join(answer) == "Paris is the capital."
    assert len(thinking) > 3 and len(answer) > 2
    whole = "".join(state.text_iter())
    assert whole == state.text() and "It is Paris" not in whole


def test_the_constraint_applies_after_the_thinking():
    backend = FakeBackend(responder=responder, template=THINK)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    state = ask.run(backend=backend, json_schema=schema)
    assert json.loads(state["answer"]) == {"city": "Paris"}
    assert state.parsed("answer") == {"city": "Paris"}
    constraint = backend.generations()[-1].constraint
    assert constraint.matches(THOUGHT + '{"city": "Paris"}')
    assert not constraint.matches('{"city": "Paris"}')


def test_a_select_thinks_then_chooses():
    @lp.function
    def yes_no(s):
        s += lp.user("Is Paris the capital?")
        s += lp.assistant(lp.separate_reasoning(lp.select("verdict", ["yes", "no"])))

    backend = FakeBackend(responder=responder, template=THINK)
    state = yes_no.run(backend=backend)
    assert state["verdict"] == "yes"
    assert state["verdict_reasoning_content"].startswith("The user wants")


def test_a_thinking_budget_forces_the_end_marker():
    @lp.function
    def budgeted(s):
        s += lp.user("Capital of France?")
        s += lp.assistant(
            lp.separate_reasoning(
                lp.gen("answer", max_tokens=64, json_schema={"type": "object"}),
                thinking_budget=8,
            )
        )

    backend = FakeBackend(responder=responder, template=THINK)
    state = budgeted.run(backend=backend)
    first, second = backend.generations()
    assert first.params.max_tokens == 8 and first.params.stop == ("</think>",)
    assert str(second.prompt).endswith("It is Paris.\n</think>\n\n")
    assert second.constraint is not None and second.constraint.kind == "json_schema"
    assert state.parsed("answer") == {"city": "Paris"}
    assert state["answer_reasoning_content"] == "The user wants the capital. It is Paris."


def test_a_named_format_on_a_plain_template():
    backend = FakeBackend(responder=lambda r: "<think>hm</think>ok", template="chatml")
    with pytest.raises(ValueError, match="no reasoning format"):
        ask.run(backend=backend)  # chatml shows no format

    @lp.function
    def named(s):
        s += lp.user("Hi")
        s += lp.assistant(lp.separate_reasoning(lp.gen("answer", max_tokens=8), "qwen3"))

    state = named.run(backend=backend)
    assert (state["answer"], state["answer_reasoning_content"]) == ("ok", "hm")


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        lp.separate_reasoning(lp.gen("a"), model_type="nope")
    with pytest.raises(TypeError, match="gen or a select"):
        lp.separate_reasoning(lp.user("hi"))
    with pytest.raises(ValueError, match="thinking_budget"):
        lp.separate_reasoning(lp.gen("a"), thinking_budget=-3)
    with pytest.raises(ValueError, match="named gen"):
        lp.separate_reasoning(lp.gen())


def test_qwen3_thinks_in_the_dsl():
    """Qwen3's template renders an answer with an empty think block (thinking off); a
    separate_reasoning gen gets the generation prompt instead, where the model may think."""
    qwen3 = (Path(__file__).parent.parent / "data" / "chat_templates" / "qwen3.jinja").read_text()
    backend = FakeBackend(responder=lambda r: "<think>\nHm.\n</think>\n\nParis.", template=qwen3)
    state = ask.run(backend=backend)
    assert (state["answer"], state["answer_reasoning_content"]) == ("Paris.", "Hm.")
    assert str(backend.generations()[-1].prompt).endswith("<|im_start|>assistant\n")


QWEN3 = (Path(__file__).parent.parent / "data" / "chat_templates" / "qwen3.jinja").read_text()
CLOSED = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # Qwen3's prompt with thinking off


def test_enable_thinking_reaches_the_template_per_run_and_per_program():
    """chat_template_kwargs (the server's field) in the DSL: the template renders the role
    markers and the generation prompt under them, so Qwen3's enable_thinking=False closes
    the block and the whole output is the answer."""
    backend = FakeBackend(responder=lambda r: "Paris.", template=QWEN3)
    state = ask.run(backend=backend, chat_template_kwargs={"enable_thinking": False})
    assert str(backend.generations()[-1].prompt).endswith(CLOSED)
    assert (state["answer"], state["answer_reasoning_content"]) == ("Paris.", "")
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    ask.run(backend=backend, json_schema=schema, chat_template_kwargs={"enable_thinking": False})
    constraint = backend.generations()[-1].constraint
    assert constraint.matches('{"city": "Paris"}')  # no thinking before the answer
    assert not constraint.matches('<think>\nHm.\n</think>\n\n{"city": "Paris"}')

    off = lp.function(ask.func, chat_template_kwargs={"enable_thinking": False})
    off.run(backend=backend)
    assert str(backend.generations()[-1].prompt).endswith(CLOSED)
    off.run(backend=backend, chat_template_kwargs={"enable_thinking": True})  # the run's win
    assert str(backend.generations()[-1].prompt).endswith("<|im_start|>assistant\n")
    off.bind().run(backend=backend)  # a bound copy keeps them
    assert str(backend.generations()[-1].prompt).endswith(CLOSED)


def test_enable_thinking_per_batch_item():
    backend = FakeBackend(responder=lambda r: "<think>\nHm.\n</think>\n\nParis.", template=QWEN3)
    states = ask.run_batch(
        [{"chat_template_kwargs": {"enable_thinking": False}}, {}], backend=backend
    )
    closed = [str(g.prompt).endswith(CLOSED) for g in backend.generations()]
    assert sorted(closed) == [False, True]
    # thinking on: the model's block is split off; off: the template closed it
    assert states[1]["answer_reasoning_content"] == "Hm."
    assert states[0]["answer_reasoning_content"] == ""


def test_bad_chat_template_kwargs():
    with pytest.raises(ValueError, match="cannot set 'tools'"):
        lp.function(ask.func, chat_template_kwargs={"tools": []})
    with pytest.raises(TypeError, match="must be a dict"):
        ask.run(backend=FakeBackend(), chat_template_kwargs="enable_thinking=False")
    with pytest.raises(ValueError, match="cannot set 'add_generation_prompt'"):
        ask.run(backend=FakeBackend(), chat_template_kwargs={"add_generation_prompt": False})


def test_chat_template_kwargs_on_an_endpoint_in_chat_mode():
    """lp.OpenAI in chat mode sends messages its server renders: the variables would be
    lost, so the run fails naming where they go."""
    endpoint = lp.OpenAI(base_url="http://127.0.0.1:9/v1", model="m", api_key="x")
    with pytest.raises(ValueError, match="extra_body"):
        ask.run(backend=endpoint, chat_template_kwargs={"enable_thinking": False})
