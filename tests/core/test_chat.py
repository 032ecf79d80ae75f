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
