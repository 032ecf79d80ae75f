"""Role prefixes and suffixes derived from jinja2 chat templates."""

import pytest

from lmprog.core.chat import NAMED_TEMPLATES, ChatTemplate, template_from_tokenizer

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_pieces_reproduce_whole_conversation_renders():
    t = ChatTemplate(SMOLLM2)
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ]
    pieces = "".join(
        t.role_prefix(m["role"], first=i == 0) + m["content"] + t.role_suffix(m["role"])
        for i, m in enumerate(msgs)
    )
    assert pieces == t.render(msgs)
    assert "SmolLM" in t.role_prefix("user", first=True)  # the template's default system prompt
    assert t.role_prefix("system", first=True) == "<|im_start|>system\n"
    assert t.role_prefix("assistant") == "<|im_start|>assistant\n"


def test_alternation_enforcing_template_and_bos():
    strict = (
        "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
        "{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% else %}{{ m['content'] }}</s>{% endif %}"
        "{% endfor %}"
    )
    t = ChatTemplate(strict, bos_token="<s>")
    assert t.role_prefix("user", first=True) == "<s>[INST] "
    assert t.role_suffix("user") == " [/INST]"
    assert t.role_prefix("assistant") == "" and t.role_suffix("assistant") == "</s>"


def test_named_templates_and_errors():
    assert set(NAMED_TEMPLATES) >= {"chatml", "llama-3", "plain"}
    assert ChatTemplate("chatml").role_prefix("user") == "<|im_start|>user\n"
    with pytest.raises(ValueError, match="invalid chat template"):
        ChatTemplate("{% for %}")
    with pytest.raises(ValueError, match="drops message content"):
        ChatTemplate("{% for m in messages %}x{% endfor %}").role_prefix("user")

    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="ships no chat template"):
        template_from_tokenizer(NoTemplate())
    assert template_from_tokenizer(NoTemplate(), "plain").role_prefix("user") == "User: "


# ---- the Jinja environment and variables transformers renders with ----------------------


def _render(source: str, messages=(), **kw) -> str:
    return ChatTemplate(source).render(list(messages), **kw)


def test_strftime_now_is_today():
    from datetime import datetime

    before = datetime.now().strftime("%Y-%m-%d %H")
    got = _render("{{ strftime_now('%Y-%m-%d %H') }}")
    assert got in {before, datetime.now().strftime("%Y-%m-%d %H")}


def test_loop_controls():
    msgs = [{"role": "user", "content": c} for c in "abcd"]
    src = (
        "{% for m in messages %}{% if m.content == 'b' %}{% continue %}{% endif %}"
        "{% if m.content == 'd' %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
    )
    assert _render(src, msgs) == "ac"


def test_tojson_does_not_escape_html_and_takes_options():
    data = {"b": "<tag> & 'q' é", "a": [1, 2]}
    assert _render("{{ x | tojson }}", x=data) == '{"b": "<tag> & \'q\' é", "a": [1, 2]}'
    assert _render("{{ x | tojson(indent=2, sort_keys=True) }}", x={"b": 1, "a": 2}) == (
        '{\n  "a": 2,\n  "b": 1\n}'
    )
    assert _render("{{ x | tojson(ensure_ascii=True) }}", x="é") == '"\\u00e9"'


def test_raise_exception_is_a_clear_lmprog_error_at_render():
    from lmprog.core.chat import ChatTemplateError

    t = ChatTemplate("{{ raise_exception('only user turns, please') }}")  # compiles fine
    with pytest.raises(ChatTemplateError, match="^only user turns, please$"):
        t.render([{"role": "user", "content": "x"}])
    assert issubclass(ChatTemplateError, ValueError)


def test_tools_documents_and_special_tokens_reach_the_template():
    src = (
        "{{ bos_token }}|{{ tools is none }}|{{ documents is none }}|"
        "{% for t in tools or [] %}{{ t.function.name }};{% endfor %}"
        "{% for d in documents or [] %}{{ d.title }}:{{ d.text }};{% endfor %}"
        "{{ add_generation_prompt }}|{{ pad_token is defined }}|{{ extra }}"
    )
    t = ChatTemplate(src, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})
    assert t.render([]) == "<s>|True|True|False|False|"
    tools = [{"type": "function", "function": {"name": "f"}}]
    docs = [{"title": "T", "text": "body"}]
    got = t.render([], add_generation_prompt=True, tools=tools, documents=docs, extra=1)
    assert got == "<s>|False|False|f;T:body;True|False|1"
    with pytest.raises(TypeError, match="documents"):
        t.render([], documents=["not a dict"])


def test_messages_as_transformers_passes_them():
    # None-valued keys are dropped (templates test presence), reasoning has both names, and
    # {% generation %} blocks (assistant masks) render their body.
    src = (
        "{% for m in messages %}{{ 'tool_calls' in m }}/{{ m.thinking }}/{{ m.reasoning_content }}"
        "{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
    )
    msg = {"role": "assistant", "content": "x", "tool_calls": None, "reasoning": "hmm"}
    assert _render(src, [msg]) == "False/hmm/hmm[x]"
