"""The endpoint backend: lmprog programs on any OpenAI-compatible server.

    lp.OpenAI("gpt-4o-mini")                                   # api.openai.com, OPENAI_API_KEY
    lp.OpenAI(model="m", base_url="http://127.0.0.1:30000/v1", api_key="...")   # vLLM, SGLang, lmprog serve

Requests go through the official `openai` client (the `openai` extra). How each primitive
maps to the API: docs/design/endpoints.md.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from lmprog.backends.checks import check_generate_request, check_images, check_score_request
from lmprog.backends.openai_convert import (
    ReplyBuilder,
    constraint_fields,
    endpoint_error,
    request_fields,
)
from lmprog.backends.openai_messages import (
    IMAGE_MARK,
    has_roles,
    marker_template,
    split_messages,
)
from lmprog.backends.openai_score import UNCONDITIONAL_CONTEXT, score_choices
from lmprog.backends.shared import Counters, Once
from lmprog.core.chat import ChatTemplate, template_from_tokenizer
from lmprog.core.errors import BackendError
from lmprog.core.protocol import (
    ApiSpeculation,
    Backend,
    GenerateRequest,
    GenerateResult,
    ScoreRequest,
    ScoreResult,
    StreamCallback,
)

try:
    import openai as _openai
except ImportError as exc:  # pragma: no cover - the extra is part of the test setup
    raise ImportError("lp.OpenAI needs the openai package: pip install 'lmprog[openai]'") from exc

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAI(Backend):
    """A model behind an OpenAI-compatible HTTP API. Thread-safe (one shared client).

    Args: model (None: the first of /v1/models); base_url ($OPENAI_BASE_URL, else
    api.openai.com; "/v1" added to a bare host); api_key ($OPENAI_API_KEY, else "EMPTY");
    chat (True: role segments become chat `messages`; False: rendered with `chat_template` or
    `tokenizer` for /v1/completions; None: False when either is given); chat_template;
    tokenizer (an HF tokenizer or lmprog model name); regex_field ("regex" for SGLang and
    lmprog, "guided_regex" for vLLM; None: regex constraints raise); extra_body; timeout,
    max_retries. Endpoint errors become BackendError (ContextLengthError for a too-long
    prompt); token ids in results are -1. Details: docs/design/endpoints.md.
    """

    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        chat: bool | None = None,
        chat_template: str | None = None,
        tokenizer: Any = None,
        regex_field: str | None = None,
        extra_body: dict[str, Any] | None = None,
        timeout: float = 600.0,
        max_retries: int = 2,
    ) -> None:
        _check_args(model, chat, chat_template, regex_field, extra_body)
        self.base_url = _api_root(base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL)
        self.chat = chat if chat is not None else (chat_template is None and tokenizer is None)
        if self.chat and chat_template is not None:
            raise ValueError(
                "chat_template renders roles as text, which only completion mode does: "
                "pass chat=False with it (chat mode uses the server's template)"
            )
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self._client = _openai.OpenAI(
            base_url=self.base_url, api_key=key, timeout=timeout, max_retries=max_retries
        )
        self._model = model
        self._template_source = chat_template
        self._tokenizer_arg = tokenizer
        self._resolved = Once()
        self._regex_field = regex_field
        self._extra_body = dict(extra_body or {})
        self._counts = Counters(
            (
                "api_calls",
                "completion_calls",
                "chat_calls",
                "score_calls",
                "prompt_tokens",
                "completion_tokens",
                "errors",
            )
        )
        self._closed = False

    # ---- Backend protocol ------------------------------------------------------------------
    @property
    def chat_template(self) -> ChatTemplate:
        """Chat mode: markers that `generate` splits into messages; completion mode: the
        named/given template or the tokenizer's (BackendError if there is neither)."""
        if self.chat:
            return self._resolved.get("template", marker_template)
        return self._resolved.get("template", self._text_template)

    @property
    def tokenizer(self) -> Any:
        return self._resolved.get("tokenizer", self._load_tokenizer)

    @property
    def image_token(self) -> str | None:
        """Chat mode: a marker `generate` turns into an `image_url` content part (whether
        the served model reads images is the endpoint's to say); completion mode: None
        (/v1/completions takes text only)."""
        return IMAGE_MARK if self.chat else None

    @property
    def api_speculation(self) -> ApiSpeculation:
        return "message" if self.chat else "text"

    @property
    def model_name(self) -> str:
        return self._resolved.get("model", self._find_model) if self._model is None else self._model

    def generate(
        self, request: GenerateRequest, stream: StreamCallback | None = None
    ) -> GenerateResult:
        """One completion or chat completion; `stream` gets the text as the server sends it."""
        self._check_open()
        check_generate_request(request, stream)
        check_images(request, self.image_token, "OpenAI(chat=False)")
        chat = (
            split_messages(request.prompt, request.images)
            if isinstance(request.prompt, str)
            else None
        )
        kwargs, extra = request_fields(request.params, chat=chat is not None)
        extra.update(constraint_fields(request.constraint, self._regex_field))
        if request.params.lora_path is not None:  # a LoRA adapter is a model of the server's
            kwargs["model"] = request.params.lora_path
        if chat is not None:
            kwargs["messages"] = chat.for_generation()
        else:
            kwargs["prompt"] = (
                request.prompt if isinstance(request.prompt, str) else list(request.prompt)
            )
        kind = "chat" if chat is not None else "completion"
        reply = ReplyBuilder(chat=chat is not None)
        if stream is None:
            self._read_whole(kind, kwargs, extra, reply)
        else:
            self._read_stream(kind, kwargs, extra, reply, stream)
        result = reply.result(request.constraint)
        self._counts.add(
            prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens
        )
        return result

    def score(self, request: ScoreRequest) -> ScoreResult:
        """Choice logprobs from the prompt logprobs a completions endpoint echoes (one request,
        echo=True, logprobs=0, max_tokens=0). No token healing; chat-mode role prompts raise
        BackendError. Details: docs/design/endpoints.md.
        """
        self._check_open()
        check_score_request(request)
        check_images(request, self.image_token, "OpenAI(chat=False)")
        if request.images:
            raise BackendError(
                "select needs prompt logprobs, which only /v1/completions returns, and it takes "
                "no images: use gen(json_schema={'enum': [...]}) (or regex=) instead of select "
                "after lp.image()"
            )
        if self.chat and has_roles(request.prompt):
            raise BackendError(
                "select needs prompt logprobs, which only /v1/completions returns (echo=True); this "
                "prompt has role messages, which OpenAI(chat=True) can only send to "
                "/v1/chat/completions. Use chat=False with chat_template=... (or tokenizer=...), or "
                "gen(json_schema={'enum': [...]}) instead of select"
            )
        prompts = [request.prompt + c for c in request.choices]
        if request.unconditional:
            prompts += [UNCONDITIONAL_CONTEXT + c for c in request.choices]
        kwargs = {
            "prompt": prompts,
            "echo": True,
            "logprobs": 0,
            "max_tokens": 0,
            "temperature": 0.0,
        }
        response = self._request("score", kwargs, {})
        choices = sorted(response.choices, key=lambda c: c.index)
        if len(choices) != len(prompts):
            raise BackendError(
                f"{self.base_url} returned {len(choices)} choices for {len(prompts)} prompts"
            )
        scores, prompt_tokens = score_choices(
            choices, request.prompt, request.choices, request.unconditional
        )
        return ScoreResult(choices=tuple(scores), prompt_tokens=prompt_tokens)

    def stats(self) -> dict[str, Any]:
        """Calls made (api_calls; by kind: completion_calls, chat_calls, score_calls), tokens
        the server reported (prompt_tokens, completion_tokens) and failed calls (errors)."""
        return self._counts.snapshot()

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()

    # ---- requests ---------------------------------------------------------------------------
    def _read_whole(
        self, kind: str, kwargs: dict[str, Any], extra: dict[str, Any], reply: ReplyBuilder
    ) -> None:
        response = self._request(kind, kwargs, extra)
        if not response.choices:
            raise BackendError(f"{self.base_url} returned no choices")
        reply.add_choice(response.choices[0])
        reply.usage = response.usage

    def _read_stream(
        self,
        kind: str,
        kwargs: dict[str, Any],
        extra: dict[str, Any],
        reply: ReplyBuilder,
        stream: StreamCallback,
    ) -> None:
        kwargs = {**kwargs, "stream": True, "stream_options": {"include_usage": True}}
        response = self._request(kind, kwargs, extra)
        try:
            with self._errors(kind):  # errors can arrive mid-stream too
                for chunk in response:
                    for choice in chunk.choices or ():
                        piece = reply.add_choice(choice)
                        if piece:
                            stream(piece)
                    if getattr(chunk, "usage", None) is not None:
                        reply.usage = chunk.usage
        finally:
            response.close()  # the callback raised: the server frees the request

    def _request(self, kind: str, kwargs: dict[str, Any], extra: dict[str, Any]) -> Any:
        """One API call (`kind`: completion, chat or score); endpoint errors become lmprog's."""
        api = self._client.chat.completions if kind == "chat" else self._client.completions
        body = {**self._extra_body, **extra}
        self._counts.add(api_calls=1, **{f"{kind}_calls": 1})
        with self._errors(kind):
            model = kwargs.pop("model", None) or self.model_name
            return api.create(model=model, extra_body=body or None, **kwargs)

    @contextlib.contextmanager
    def _errors(self, kind: str) -> Iterator[None]:
        try:
            yield
        except _openai.OpenAIError as exc:
            self._counts.add(errors=1)
            where = f"{self.base_url}/{'chat/completions' if kind == 'chat' else 'completions'}"
            raise endpoint_error(exc, where) from None

    # ---- what an endpoint does not provide -----------------------------------------------------
    def _load_tokenizer(self) -> Any:
        tok = self._tokenizer_arg
        if tok is None:
            raise BackendError(
                "an OpenAI-compatible endpoint does not expose its tokenizer: pass "
                "OpenAI(tokenizer=...) (a Hugging Face tokenizer or an lmprog model name)"
            )
        if isinstance(tok, (str, os.PathLike)):
            from lmprog.core.models import load_tokenizer, resolve_model

            return load_tokenizer(resolve_model(tok))
        return tok

    def _text_template(self) -> ChatTemplate:
        if self._tokenizer_arg is not None:
            return template_from_tokenizer(self.tokenizer, self._template_source)
        if self._template_source is None:
            raise BackendError(
                "OpenAI(chat=False) renders role messages into the prompt text and needs a chat "
                "template, which an endpoint does not expose: pass chat_template='chatml' (or "
                "another name or jinja2 source) or tokenizer=..., or use chat=True"
            )
        return ChatTemplate(self._template_source)

    def _find_model(self) -> str:
        try:
            models = list(self._client.models.list())
        except _openai.OpenAIError as exc:
            raise endpoint_error(exc, f"{self.base_url}/models") from None
        if not models:
            raise BackendError(f"{self.base_url}/models lists no model; pass OpenAI(model=...)")
        return models[0].id

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError("this OpenAI backend was shut down; create a new one")

    def __repr__(self) -> str:
        return f"OpenAI(model={self._model!r}, base_url={self.base_url!r}, chat={self.chat})"


def _api_root(url: str) -> str:
    """`url` without a trailing slash, with "/v1" added when it has no path at all."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must be an http(s) URL, got {url!r}")
    url = url.rstrip("/")
    return url + "/v1" if urlsplit(url).path in ("", "/") else url


def _check_args(
    model: Any, chat: Any, chat_template: Any, regex_field: Any, extra_body: Any
) -> None:
    for name, value in (
        ("model", model),
        ("chat_template", chat_template),
        ("regex_field", regex_field),
    ):
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"{name} must be a non-empty str or None, got {value!r}")
    if chat is not None and not isinstance(chat, bool):
        raise TypeError(f"chat must be True, False or None, got {chat!r}")
    if extra_body is not None and not isinstance(extra_body, dict):
        raise TypeError(f"extra_body must be a dict, got {type(extra_body).__name__}")
