"""lmprog renders chat templates exactly as transformers' apply_chat_template(tokenize=False):
the bundled model's template and other families' (tests/data/chat_templates/, written from
their public definitions), with system/user/assistant turns, tools, tool calls and results,
add_generation_prompt both ways."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmprog.core.chat import ChatTemplate, template_from_tokenizer
from lmprog.core.models import load_tokenizer, resolve_model

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city (<city> is a name, e.g. Zürich & Köln)",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "the city's name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Adds two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    },
]

USER = [{"role": "user", "content": "What is 2+2? <b>bold</b> \u00e9"}]
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Weather in Zürich?"},
]
NO_SYSTEM = CHAT[1:]
TOOL_ROUND = [
    {"role": "user", "content": "Weather in Zürich?"},
    {
        "role": "assistant",
        "content": None,  # dropped before rendering, as transformers does
        "tool_calls": [
            {
                "id": "call12345",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call12345", "content": '{"temp": 21, "sky": "<sunny>"}'},
    {"role": "assistant", "content": "21 degrees and sunny."},
    {"role": "user", "content": "And tomorrow?"},
]

# (template, conversations it takes, whether it renders tools)
CASES: dict[str, tuple[list[list[dict[str, Any]]], bool]] = {
    "qwen2.5.jinja": ([USER, CHAT, NO_SYSTEM, TOOL_ROUND], True),
    "llama3.2.jinja": ([USER, CHAT, NO_SYSTEM, TOOL_ROUND], True),
    "mistral-v0.3.jinja": ([USER, CHAT, NO_SYSTEM, TOOL_ROUND], True),
    # Gemma 3 folds the system message into the first user turn; it has no tool role
    "gemma-3.jinja": ([USER, CHAT, NO_SYSTEM], False),
}
SPECIAL = {
    "qwen2.5.jinja": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "llama3.2.jinja": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mistral-v0.3.jinja": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "gemma-3.jinja": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
}


def _hf_tokenizer(special: dict[str, str], template: str) -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(["<unk>", *special.values()]))}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")), **special
    )
    tok.chat_template = template
    return tok


def _both(tok: Any, ours: ChatTemplate, messages: list, **kw: Any) -> tuple[str, str]:
    theirs = tok.apply_chat_template(messages, tokenize=False, **kw)
    return ours.render(messages, **kw), theirs


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("with_tools", [False, True])
def test_family_templates_render_as_transformers(name: str, gen: bool, with_tools: bool) -> None:
    source = (TEMPLATES / name).read_text()
    tok = _hf_tokenizer(SPECIAL[name], source)
    ours = template_from_tokenizer(tok)
    conversations, renders_tools = CASES[name]
    for messages in conversations:
        kw: dict[str, Any] = {"add_generation_prompt": gen}
        if with_tools:
            kw["tools"] = TOOLS
        got, want = _both(tok, ours, messages, **kw)
        assert got == want, (name, messages)
        if with_tools and renders_tools:
            assert "get_weather" in got


def test_tools_reach_the_templates_unescaped() -> None:
    for name in (n for n, (_, renders_tools) in CASES.items() if renders_tools):
        tok = _hf_tokenizer(SPECIAL[name], (TEMPLATES / name).read_text())
        got = template_from_tokenizer(tok).render(USER, tools=TOOLS)
        assert "(<city> is a name, e.g. Zürich & Köln)" in got, name


def test_mistral_template_refuses_bad_turn_order_like_transformers() -> None:
    import jinja2

    source = (TEMPLATES / "mistral-v0.3.jinja").read_text()
    tok = _hf_tokenizer(SPECIAL["mistral-v0.3.jinja"], source)
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.TemplateError, match="must alternate") as theirs:
        tok.apply_chat_template(bad, tokenize=False)
    with pytest.raises(ValueError, match="must alternate") as ours:
        template_from_tokenizer(tok).render(bad)
    assert str(ours.value) == str(theirs.value)


@pytest.fixture(scope="module")
def bundled() -> Any:
    return load_tokenizer(resolve_model())


@pytest.mark.parametrize("gen", [True, False])
def test_bundled_model_template_renders_as_transformers(bundled: Any, gen: bool) -> None:
    ours = template_from_tokenizer(bundled)
    for messages in (USER, CHAT, NO_SYSTEM, [*CHAT, {"role": "assistant", "content": "Sunny."}]):
        for tools in (None, TOOLS):
            got, want = _both(bundled, ours, messages, add_generation_prompt=gen, tools=tools)
            assert got == want


def test_role_pieces_still_reproduce_family_renders() -> None:
    # Programs append messages one at a time with the derived prefixes and suffixes.
    tok = _hf_tokenizer(SPECIAL["qwen2.5.jinja"], (TEMPLATES / "qwen2.5.jinja").read_text())
    t = template_from_tokenizer(tok)
    text = "".join(
        t.role_prefix(m["role"], first=i == 0) + m["content"] + t.role_suffix(m["role"])
        for i, m in enumerate(CHAT)
    )
    assert text == tok.apply_chat_template(CHAT, tokenize=False)


def test_server_passes_a_requests_tools_to_the_template() -> None:
    from lmprog.serve.prompts import render_chat
    from lmprog.serve.schemas.chat import ChatMessage, Tool

    source = (TEMPLATES / "qwen2.5.jinja").read_text()
    tok = _hf_tokenizer(SPECIAL["qwen2.5.jinja"], source)
    tools = [Tool.model_validate(t) for t in TOOLS]
    messages = [ChatMessage.model_validate(m) for m in USER]
    got = render_chat(template_from_tokenizer(tok), messages, None, max_json_depth=64, tools=tools)
    assert got == tok.apply_chat_template(
        USER, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    plain = render_chat(template_from_tokenizer(tok), messages, None, max_json_depth=64)
    assert "<tools>" in got and "<tools>" not in plain


def test_named_gemma_3_template_is_gemmas_and_its_role_pieces_reproduce_it() -> None:
    from lmprog.core.chat import NAMED_TEMPLATES

    source = (TEMPLATES / "gemma-3.jinja").read_text()
    assert NAMED_TEMPLATES["gemma-3"] == source
    tok = _hf_tokenizer(SPECIAL["gemma-3.jinja"], source)
    t = ChatTemplate("gemma-3", special_tokens=SPECIAL["gemma-3.jinja"])
    text = "".join(
        t.role_prefix(m["role"], first=i == 0) + m["content"] + t.role_suffix(m["role"])
        for i, m in enumerate(NO_SYSTEM)
    )
    assert text == tok.apply_chat_template(NO_SYSTEM, tokenize=False)
    assert t.role_prefix("assistant") == "<start_of_turn>model\n"
