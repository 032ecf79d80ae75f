"""Chat formatting from a model's own jinja2 chat template.

A program appends role messages one at a time, so lmprog needs each role's *prefix* and
*suffix* rather than a whole-conversation render. They are derived from the template by
rendering a sentinel message and diffing against the render without it:

    render([filler])                     = "<|im_start|>user\\nF<|im_end|>\\n"
    render([filler, {role, SENTINEL}])   = "<|im_start|>user\\nF<|im_end|>\\n<|im_start|>assistant\\nSENTINEL<|im_end|>\\n"
                                                                            ^ prefix         ^ suffix

The first message of a conversation gets its own prefix, so a template that adds a
default system prompt (SmolLM2's does) or a BOS marker still does so.
"""

from __future__ import annotations

from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

_SENTINEL = "\x00LMPROG_CONTENT\x00"
# Conversations a later message is appended to when deriving its format, tried in order.
_CONTEXTS = (
    ("user",),
    ("user", "assistant"),
    ("system",),
    ("assistant",),
    ("system", "user"),
    ("system", "user", "assistant"),
)

# Templates a user can name when a model ships none (or to override it).
NAMED_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "llama-3": (
        "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
        "'<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
    "plain": (
        "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
    ),
}


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


class ChatTemplate:
    """Renders role messages with a jinja2 chat template (the model's own, or a named one)."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        if source in NAMED_TEMPLATES:
            source = NAMED_TEMPLATES[source]
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"invalid chat template (line {e.lineno}): {e.message}") from e
        self.source = source
        self._vars = {"bos_token": bos_token, "eos_token": eos_token}
        self._cache: dict[tuple[str, bool], tuple[str, str]] = {}

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self._vars
        )

    def role_prefix(self, role: str, first: bool = False) -> str:
        """Text that opens a `role` message (`first`: it starts the conversation)."""
        return self._pieces(role, first)[0]

    def role_suffix(self, role: str) -> str:
        """Text that closes a `role` message."""
        return self._pieces(role, False)[1]

    def _pieces(self, role: str, first: bool) -> tuple[str, str]:
        key = (role, first)
        if key not in self._cache:
            if first:
                self._cache[key] = self._split(self.render([{"role": role, "content": _SENTINEL}]))
            else:
                self._cache[key] = self._later_message(role)
        return self._cache[key]

    def _later_message(self, role: str) -> tuple[str, str]:
        # Try earlier conversations until the template accepts one more `role` message
        # (some templates insist on user/assistant alternation).
        last_error: Exception | None = None
        for context_roles in _CONTEXTS:
            context = [{"role": r, "content": "F"} for r in context_roles]
            try:
                before = self.render(context)
                after = self.render(context + [{"role": role, "content": _SENTINEL}])
            except jinja2.exceptions.TemplateError as e:
                last_error = e
                continue
            if after.startswith(before):
                return self._split(after[len(before) :])
        raise ValueError(
            f"cannot derive the {role!r} message format from the chat template: {last_error}"
        )

    @staticmethod
    def _split(text: str) -> tuple[str, str]:
        prefix, sep, suffix = text.partition(_SENTINEL)
        if not sep:
            raise ValueError("the chat template drops message content; name a template instead")
        return prefix, suffix

    def __repr__(self) -> str:
        return f"ChatTemplate({self.source[:40]!r}...)"


def template_from_tokenizer(tokenizer: Any, override: str | None = None) -> ChatTemplate:
    """The chat template of a HF tokenizer, or the named/given `override`."""
    source = override or getattr(tokenizer, "chat_template", None)
    if not source:
        raise ValueError(
            "this model ships no chat template; pass chat_template=NAME to the backend "
            f"(one of {sorted(NAMED_TEMPLATES)}) or a jinja2 template string"
        )
    return ChatTemplate(
        source,
        bos_token=getattr(tokenizer, "bos_token", None) or "",
        eos_token=getattr(tokenizer, "eos_token", None) or "",
    )
