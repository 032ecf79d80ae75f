"""Role messages for a chat endpoint: marked up in the program's text, split back out.

In chat mode the role prefix and suffix are plain markers (<|lmprog:user|> ...
<|lmprog:end|>); `split_messages` recovers the `messages` list. Text outside every role
raises BackendError. Design: docs/design/endpoints.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lmprog.core.chat import ChatTemplate
from lmprog.core.errors import BackendError

_END = "<|lmprog:end|>\n"  # closes every message
MARKER_TEMPLATE = (
    "{% for message in messages %}{{ '<|lmprog:' + message['role'] + '|>' + message['content'] + "
    "'<|lmprog:end|>\n' }}{% endfor %}"
)
_MARK = re.compile(r"<\|lmprog:(\w+)\|>")


def marker_template() -> ChatTemplate:
    """The chat template whose role prefixes/suffixes are the markers above."""
    return ChatTemplate(MARKER_TEMPLATE)


@dataclass(frozen=True)
class ChatPrompt:
    """A prompt split into closed messages and the message still open at its end."""

    messages: tuple[dict[str, str], ...]
    open_role: str | None
    open_content: str

    def for_generation(self) -> list[dict[str, str]]:
        """The `messages` of a chat request that generates the open assistant message.

        Raises BackendError unless the prompt ends with an assistant message that has no
        content yet: a chat API answers a conversation, it cannot continue a message.
        """
        if self.open_role is None:
            raise BackendError(
                "a chat endpoint generates assistant messages only: put the gen inside an "
                "assistant role, e.g. s += lp.assistant(lp.gen('answer'))"
            )
        if self.open_role != "assistant":
            raise BackendError(
                f"a gen inside a {self.open_role!r} message cannot run on a chat endpoint, which "
                "only generates assistant messages; move it into lp.assistant(...)"
            )
        if self.open_content:
            raise BackendError(
                "a chat endpoint cannot continue a partly written assistant message "
                f"(it already holds {self.open_content[:40]!r}): make the gen the first thing in "
                "the assistant role, use completion mode (chat=False), or use "
                "@lp.function(num_api_spec_tokens=N), which matches such text against one "
                "speculative reply (this error remains where the reply does not match it)"
            )
        return [dict(m) for m in self.messages]


def split_messages(prompt: str) -> ChatPrompt | None:
    """The messages marked up in `prompt`, or None when it has no role markers at all."""
    messages: list[dict[str, str]] = []
    open_role: str | None = None
    content_start = outside_start = 0
    for m in _MARK.finditer(prompt):
        role = m.group(1)
        if role != "end":
            if open_role is not None:
                raise BackendError(
                    f"a {role!r} message begins inside the open {open_role!r} message"
                )
            _check_outside(prompt[outside_start : m.start()])
            open_role, content_start = role, m.end()
        elif open_role is None or not prompt.startswith(_END, m.start()):
            raise BackendError(f"unbalanced role markers in the prompt at offset {m.start()}")
        else:
            messages.append({"role": open_role, "content": prompt[content_start : m.start()]})
            open_role, outside_start = None, m.start() + len(_END)
    if not messages and open_role is None:
        return None
    if open_role is None:
        _check_outside(prompt[outside_start:])
        return ChatPrompt(tuple(messages), None, "")
    return ChatPrompt(tuple(messages), open_role, prompt[content_start:])


def has_roles(prompt: str) -> bool:
    return _MARK.search(prompt) is not None


def _check_outside(text: str) -> None:
    if text:
        raise BackendError(
            f"text outside any role message ({text[:40]!r}) cannot be sent to a chat endpoint: "
            "put it inside lp.system/lp.user/lp.assistant, or use completion mode (chat=False)"
        )
