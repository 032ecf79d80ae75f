"""Role messages for a chat endpoint: marked up in the program's text, split back out.

In chat mode the role prefix and suffix are plain markers (<|lmprog:user|> ...
<|lmprog:end|>) and an image is <|lmprog:image|>; `split_messages` recovers the `messages`
list, a message with images as content parts (text and `image_url` data URLs, in order).
Text outside every role raises BackendError. Design: docs/design/endpoints.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmprog.core.chat import ChatTemplate
from lmprog.core.errors import BackendError
from lmprog.core.image_urls import data_url
from lmprog.core.images import ImageInput

_END = "<|lmprog:end|>\n"  # closes every message
MARKER_TEMPLATE = (
    "{% for message in messages %}{{ '<|lmprog:' + message['role'] + '|>' + message['content'] + "
    "'<|lmprog:end|>\n' }}{% endfor %}"
)
_MARK = re.compile(r"<\|lmprog:(\w+)\|>")
IMAGE_MARK = "<|lmprog:image|>"  # the chat-mode image token: an image_url part there


def marker_template() -> ChatTemplate:
    """The chat template whose role prefixes/suffixes are the markers above."""
    return ChatTemplate(MARKER_TEMPLATE)


@dataclass(frozen=True)
class ChatPrompt:
    """A prompt split into closed messages and the message still open at its end."""

    messages: tuple[dict[str, Any], ...]
    open_role: str | None
    open_content: str

    def for_generation(self) -> list[dict[str, Any]]:
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


def split_messages(prompt: str, images: Sequence[ImageInput] = ()) -> ChatPrompt | None:
    """The messages marked up in `prompt`, or None when it has no role markers at all;
    `images`: one per image marker, in order (a message holding some has content parts)."""
    messages: list[dict[str, Any]] = []
    open_role: str | None = None
    content_start = outside_start = 0
    pending = list(images)
    for m in _MARK.finditer(prompt):
        role = m.group(1)
        if role == "image":
            if open_role is None:
                raise BackendError(
                    "an image outside any role message cannot be sent to a chat endpoint: "
                    "put lp.image() inside lp.user(...)"
                )
            continue
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
            content = _content(prompt[content_start : m.start()], pending)
            messages.append({"role": open_role, "content": content})
            open_role, outside_start = None, m.start() + len(_END)
    if not messages and open_role is None:
        return None
    if open_role is None:
        _check_outside(prompt[outside_start:])
        return ChatPrompt(tuple(messages), None, "")
    open_content = prompt[content_start:]
    if IMAGE_MARK in open_content:
        raise BackendError(
            "an image in the message being generated cannot be sent to a chat endpoint: put "
            "lp.image() in a user message before the gen"
        )
    return ChatPrompt(tuple(messages), open_role, open_content)


def _content(text: str, images: list[ImageInput]) -> str | list[dict[str, Any]]:
    """A message's content: its text, or with image markers the OpenAI content parts
    (text, then each image as an `image_url` data URL, in the order written); takes the
    images it uses from the front of `images`."""
    if IMAGE_MARK not in text:
        return text
    parts: list[dict[str, Any]] = []
    pieces = text.split(IMAGE_MARK)
    for i, piece in enumerate(pieces):
        if piece:
            parts.append({"type": "text", "text": piece})
        if i < len(pieces) - 1:
            if not images:
                raise BackendError("the prompt holds more image markers than images")
            url = data_url(images.pop(0))
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def has_roles(prompt: str) -> bool:
    return _MARK.search(prompt) is not None


def _check_outside(text: str) -> None:
    if text:
        raise BackendError(
            f"text outside any role message ({text[:40]!r}) cannot be sent to a chat endpoint: "
            "put it inside lp.system/lp.user/lp.assistant, or use completion mode (chat=False)"
        )
