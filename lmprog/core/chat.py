"""Chat formatting from a model's own jinja2 chat template.

    template = template_from_tokenizer(tokenizer)
    template.role_prefix("user", first=True), template.role_suffix("user")

A program appends role messages one at a time, so each role's prefix and suffix are derived
from the template, by rendering a sentinel message and diffing against the render without
it. Templates render as transformers' `apply_chat_template` renders them
(tests/core/test_chat_parity.py requires equal strings). Design: docs/design/foundations.md.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
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
    # Gemma 3's (google/gemma-3-*-it): a system message opens the first user turn
    "gemma-3": (
        "{{ bos_token }}\n"
        "{%- if messages[0]['role'] == 'system' -%}\n"
        "    {%- if messages[0]['content'] is string -%}\n"
        "        {%- set first_user_prefix = messages[0]['content'] + '\n"
        "\n"
        "' -%}\n"
        "    {%- else -%}\n"
        "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n"
        "\n"
        "' -%}\n"
        "    {%- endif -%}\n"
        "    {%- set loop_messages = messages[1:] -%}\n"
        "{%- else -%}\n"
        '    {%- set first_user_prefix = "" -%}\n'
        "    {%- set loop_messages = messages -%}\n"
        "{%- endif -%}\n"
        "{%- for message in loop_messages -%}\n"
        "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
        '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
        "    {%- endif -%}\n"
        "    {%- if (message['role'] == 'assistant') -%}\n"
        '        {%- set role = "model" -%}\n'
        "    {%- else -%}\n"
        "        {%- set role = message['role'] -%}\n"
        "    {%- endif -%}\n"
        "    {{ '<start_of_turn>' + role + '\n"
        '\' + (first_user_prefix if loop.first else "") }}\n'
        "    {%- if message['content'] is string -%}\n"
        "        {{ message['content'] | trim }}\n"
        "    {%- elif message['content'] is iterable -%}\n"
        "        {%- for item in message['content'] -%}\n"
        "            {%- if item['type'] == 'image' -%}\n"
        "                {{ '<start_of_image>' }}\n"
        "            {%- elif item['type'] == 'text' -%}\n"
        "                {{ item['text'] | trim }}\n"
        "            {%- endif -%}\n"
        "        {%- endfor -%}\n"
        "    {%- else -%}\n"
        '        {{ raise_exception("Invalid content type") }}\n'
        "    {%- endif -%}\n"
        "    {{ '<end_of_turn>\n"
        "' }}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}\n"
        "    {{'<start_of_turn>model\n"
        "'}}\n"
        "{%- endif -%}\n"
    ),
    "plain": (
        "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
    ),
}


class ChatTemplateError(jinja2.exceptions.TemplateError, ValueError):
    """The chat template refused the messages (its `raise_exception(...)`); the message is
    the template's own."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' tojson: plain json.dumps (jinja2's own escapes <, >, & and ' for HTML).
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers marks assistant text with it for
    its assistant-token masks): renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Callable[[], str]) -> str:
        return caller()


def _environment() -> ImmutableSandboxedEnvironment:
    """The Jinja environment transformers renders chat templates in."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# Names a message's reasoning comes under; templates read the first (Qwen3) or "thinking"
# (gpt-oss). transformers fills both from whichever is set.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _template_data(value: Any) -> Any:
    """Plain JSON-like data for the template (pydantic models dumped, str subclasses plain)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_template_data(k): _template_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_template_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_template_data(v) for v in value)
    if callable(getattr(value, "model_dump", None)):
        return _template_data(value.model_dump())
    return f"<{type(value).__name__}>"


def _template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    # As transformers: keys whose value is None are dropped (templates test for presence), and
    # the reasoning is available under both names templates read.
    m = {k: v for k, v in _template_data(message).items() if v is not None}
    reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
    if reasoning is not None:
        m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    return m


# the variables a caller's template variables cannot set (the renderer sets them)
RESERVED_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


def check_template_variables(variables: object, name: str = "chat_template_kwargs") -> None:
    """ValueError (TypeError for a non-dict) naming a variable a caller may not set."""
    if not isinstance(variables, Mapping):
        raise TypeError(f"{name} must be a dict of template variables, got {variables!r}")
    for key in variables:
        if not isinstance(key, str) or key in RESERVED_VARIABLES or not key.isidentifier():
            raise ValueError(
                f"{name} cannot set {key!r} (messages, tools, documents and "
                "add_generation_prompt are set by the renderer; keys are identifiers)"
            )


class ChatTemplate:
    """Renders role messages with a jinja2 chat template (the model's own, or a named one)."""

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        special_tokens: Mapping[str, str] | None = None,
    ) -> None:
        """`special_tokens`: the template's token variables (a tokenizer's special_tokens_map,
        as transformers passes it); without it, `bos_token` and `eos_token`."""
        if source in NAMED_TEMPLATES:
            source = NAMED_TEMPLATES[source]
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"invalid chat template (line {e.lineno}): {e.message}") from e
        self.source = source
        if special_tokens is None:
            special_tokens = {"bos_token": bos_token, "eos_token": eos_token}
        self._vars = {k: str(v) for k, v in special_tokens.items() if v is not None}
        self.variables: dict[str, Any] = {}  # template variables of every render (with_variables)
        self._cache: dict[tuple[str, bool], tuple[str, str]] = {}
        self._generation: str | None = None

    def with_variables(self, variables: Mapping[str, Any]) -> ChatTemplate:
        """This template with `variables` passed to every render, as transformers'
        `apply_chat_template(..., **variables)` (`enable_thinking=False` for Qwen3's,
        `reasoning_effort` for gpt-oss's): role markers and the generation prompt are then
        derived under them. ValueError for a variable the renderer sets itself (messages,
        tools, documents, add_generation_prompt) or a key that is no identifier."""
        check_template_variables(variables)
        if not variables:
            return self
        out = copy.copy(self)
        out.variables = {**self.variables, **_template_data(dict(variables))}
        out._cache, out._generation = {}, None
        return out

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = False,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **variables: Any,
    ) -> str:
        """The whole conversation, as transformers' `apply_chat_template(messages, tools=...,
        documents=..., add_generation_prompt=..., tokenize=False, **variables)` renders it.
        A template's `raise_exception(...)` raises ChatTemplateError."""
        if documents is not None and not all(isinstance(d, Mapping) for d in documents):
            raise TypeError("documents must be a list of dicts (with 'title' and 'text' keys)")
        return self._template.render(
            messages=[_template_message(m) for m in messages],
            tools=_template_data(list(tools)) if tools is not None else None,
            documents=_template_data(list(documents)) if documents is not None else None,
            add_generation_prompt=add_generation_prompt,
            **{**self._vars, **self.variables, **_template_data(variables)},
        )

    def role_prefix(self, role: str, first: bool = False) -> str:
        """Text that opens a `role` message (`first`: it starts the conversation)."""
        return self._pieces(role, first)[0]

    def role_suffix(self, role: str) -> str:
        """Text that closes a `role` message."""
        return self._pieces(role, False)[1]

    def generation_prompt(self) -> str:
        """What `add_generation_prompt` writes after a user turn. It may differ from the
        assistant prefix: a template that opens a reasoning block there ("<think>\\n" after
        it: DeepSeek-R1's distills), or one whose rendered answers carry an empty block
        that the generation prompt leaves out (Qwen3)."""
        if self._generation is None:
            turn = [{"role": "user", "content": "F"}]
            try:
                before = self.render(turn)
                self._generation = self.render(turn, add_generation_prompt=True)[len(before) :]
            except jinja2.exceptions.TemplateError:
                self._generation = ""
        return self._generation

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
    if isinstance(source, Mapping):  # several named templates: the default one, as transformers
        source = source.get("default")
    if not source:
        raise ValueError(
            "this model ships no chat template; pass chat_template=NAME to the backend "
            f"(one of {sorted(NAMED_TEMPLATES)}) or a jinja2 template string"
        )
    special = getattr(tokenizer, "special_tokens_map", None)
    if isinstance(special, Mapping):  # what transformers passes (bos_token, eos_token, ...)
        return ChatTemplate(source, special_tokens=special)
    return ChatTemplate(
        source,
        bos_token=getattr(tokenizer, "bos_token", None) or "",
        eos_token=getattr(tokenizer, "eos_token", None) or "",
    )
