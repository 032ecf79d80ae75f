"""The reasoning parsers (lmprog.core.reasoning): each family's format chosen from its real
chat template (tests/data/chat_templates/), hand-written model outputs split whole and
streamed in two chunks cut at every position (markers split anywhere), and in single
characters."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmprog.core.chat import ChatTemplate
from lmprog.core.reasoning import FORMATS, named_format, reasoning_format

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"
HI = [{"role": "user", "content": "hi"}]


def template(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / name).read_text())


def streamed(fmt, state, pieces):
    s = fmt.splitter(state)
    parts = {"reasoning": "", "answer": ""}
    for kind, text in [p for piece in pieces for p in s.feed(piece)] + s.finish():
        parts[kind] += text
    return (parts["reasoning"] if s.reasoned else None), parts["answer"]


def every_cut(fmt, state, text):
    """Whole, in two pieces cut at every position, in three, and one character at a time:
    the same split each way."""
    whole = fmt.split(text, state)
    for i in range(len(text) + 1):
        assert streamed(fmt, state, [text[:i], text[i:]]) == whole, i
        for j in range(i, len(text) + 1, 3):
            assert streamed(fmt, state, [text[:i], text[i:j], text[j:]]) == whole, (i, j)
    assert streamed(fmt, state, list(text)) == whole
    return whole


def test_the_format_comes_from_the_template():
    qwen3 = template("qwen3.jinja")
    assert reasoning_format(qwen3.source).name == "qwen3"
    r1 = template("deepseek-r1-distill-qwen.jinja")
    assert reasoning_format(r1.source).name == "deepseek-r1"
    assert reasoning_format(template("chatml-think.jinja").source).name == "qwen3"
    for plain in ("qwen2.5.jinja", "llama3.2.jinja", "gemma-3.jinja", "mistral-v0.3.jinja"):
        assert reasoning_format(template(plain).source) is None, plain
    assert reasoning_format(qwen3.source, "none") is None
    assert reasoning_format(qwen3.source, "deepseek_r1").name == "deepseek-r1"


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown reasoning parser 'nope'.*deepseek-r1"):
        named_format("nope")


def test_prompt_state_from_the_real_templates():
    qwen3, fmt = template("qwen3.jinja"), FORMATS["qwen3"]
    assert fmt.prompt_state(qwen3.render(HI, add_generation_prompt=True)) == "none"
    off = qwen3.render(HI, add_generation_prompt=True, enable_thinking=False)
    assert fmt.prompt_state(off) == "closed"
    r1 = template("deepseek-r1-distill-qwen.jinja")
    assert fmt.prompt_state(r1.render(HI, add_generation_prompt=True)) == "open"


OUTPUTS = [
    # (format, prompt state, output, reasoning, answer)
    (
        "qwen3",
        "none",
        "<think>\nLet me see.\n\nYes.\n</think>\n\nParis.",
        "Let me see.\n\nYes.",
        "Paris.",
    ),
    ("qwen3", "none", "Paris, without thinking.", None, "Paris, without thinking."),
    ("qwen3", "none", "<think>\nstill thinking when cut", "still thinking when cut", ""),
    ("qwen3", "none", "<thin", None, "<thin"),
    ("qwen3", "open", 'Hmm </thi nk> </think>\n\n{"a": 1}', "Hmm </thi nk>", '{"a": 1}'),
    ("qwen3", "closed", "</think> is text here", None, "</think> is text here"),
    ("deepseek-r1", "open", "Okay, so 2+2.\n</think>\n\n4", "Okay, so 2+2.", "4"),
    ("deepseek-r1", "none", "<think>\nOkay.\n</think>\n\n4", "Okay.", "4"),
    ("deepseek-r1", "none", "no markers at all", "no markers at all", ""),
    ("magistral", "none", "[THINK]a<b[/THINK]Answer", "a<b", "Answer"),
    (
        "gpt-oss",
        "none",
        "<|channel|>analysis<|message|>User says hi.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello!",
        "User says hi.",
        "Hello!",
    ),
]


@pytest.mark.parametrize("name,state,text,reasoning,answer", OUTPUTS)
def test_outputs_split_whole_and_streamed(name, state, text, reasoning, answer):
    assert every_cut(FORMATS[name], state, text) == (reasoning, answer)


def test_split_reverses_the_qwen3_template():
    """What the Qwen3 template writes back for an earlier turn splits into the same parts."""
    qwen3 = template("qwen3.jinja")
    turn = {"role": "assistant", "content": "Paris.", "reasoning_content": "The capital."}
    rendered = qwen3.render([*HI, turn])
    written = rendered.split("<|im_start|>assistant\n")[1].removesuffix("<|im_end|>\n")
    assert FORMATS["qwen3"].split(written) == ("The capital.", "Paris.")
