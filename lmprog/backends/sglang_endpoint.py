"""`lp.RuntimeEndpoint(url)`: lmprog programs on a server speaking SGLang's native HTTP
protocol: an SGLang server (`python -m sglang.launch_server`), or `lmprog serve`.

    lp.set_default_backend(lp.RuntimeEndpoint("http://127.0.0.1:30000"))

Standard-library HTTP; gen -> POST /generate, select -> prompt logprobs with token healing.
How each primitive maps to the protocol: docs/design/endpoints.md.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from lmprog.backends.checks import (
    check_generate_request,
    check_images,
    check_no_lora,
    check_score_request,
)
from lmprog.backends.shared import Counters, Once
from lmprog.core.chat import ChatTemplate, template_from_tokenizer
from lmprog.core.errors import BackendError, ContextLengthError, LmprogError
from lmprog.core.image_urls import data_url
from lmprog.core.protocol import (
    Backend,
    ChoiceScore,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    ScoreRequest,
    ScoreResult,
    StreamCallback,
    StreamPiece,
    TokenLogprob,
    TopLogprob,
)
from lmprog.core.sampling import SamplingParams

# Unconditional select scores follow a newline, as on the OpenAI endpoint backend: a
# prompt's first token has no logprob, and a BOS token cannot be sent as text.
UNCONDITIONAL_CONTEXT = "\n"
# Prompt tokens before the end of the prompt whose ids a select compares with each
# prompt + choice to find where their tokenizations part (token healing).
HEALING_WINDOW = 8


class RuntimeEndpoint(Backend):
    """A model behind SGLang's native HTTP API (SGLang's `RuntimeEndpoint`). Thread-safe.

    Args: base_url ("http://127.0.0.1:30000"); api_key (sent as a Bearer token); verify (CA
    bundle or False); chat_template / chat_template_name (default: what lmprog serve reports,
    else the tokenizer's, else a local lmprog model's; SGLang reports none); tokenizer;
    timeout; image_token (the model's, for lp.image(): default what lmprog serve reports,
    SGLang reports none). Server errors become BackendError (ContextLengthError when the prompt does not
    fit). Details: docs/design/endpoints.md.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: bool | str | None = None,
        chat_template_name: str | None = None,
        *,
        chat_template: str | None = None,
        tokenizer: Any = None,
        timeout: float = 600.0,
        image_token: str | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        for name, value in (
            ("api_key", api_key),
            ("chat_template", chat_template),
            ("chat_template_name", chat_template_name),
            ("image_token", image_token),
        ):
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{name} must be a non-empty str or None, got {value!r}")
        if chat_template is not None and chat_template_name is not None:
            raise TypeError("give the template once: chat_template=... or chat_template_name=...")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        parts = urlsplit(base_url.rstrip("/"))
        if not parts.hostname:
            raise ValueError(f"base_url has no host: {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host, self._port, self._root = parts.hostname, parts.port, parts.path
        self._ssl = _ssl_context(verify) if self._https else None
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = float(timeout)
        self._template_arg = chat_template or chat_template_name
        self._tokenizer_arg = tokenizer
        self._resolved = Once()
        self._counts = Counters(("requests", "generate_calls", "score_calls", "errors"))
        self._closed = False
        self.model_info: dict[str, Any] = self._get_json("/get_model_info")
        if not isinstance(self.model_info, dict):
            raise BackendError(f"{self.base_url}/get_model_info did not answer a JSON object")
        served = self.model_info.get("image_token")  # lmprog serve's; SGLang's says none
        self._image_token = image_token or (served if isinstance(served, str) and served else None)

    # ---- Backend protocol ------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """The server's model_path (SGLang's `get_model_name()`)."""
        return str(self.model_info.get("model_path", ""))

    def get_model_name(self) -> str:
        return self.model_name

    @property
    def chat_template(self) -> ChatTemplate:
        return self._resolved.get("template", self._find_template)

    @property
    def tokenizer(self) -> Any:
        return self._resolved.get("tokenizer", self._find_tokenizer)

    @property
    def image_token(self) -> str | None:
        """RuntimeEndpoint(image_token=...), else the one lmprog serve reports in
        /get_model_info (an SGLang server reports none: name its model's, e.g. "<image>")."""
        return self._image_token

    def generate(
        self, request: GenerateRequest, stream: StreamCallback | None = None
    ) -> GenerateResult:
        """One POST /generate; `stream` gets the text as the server sends it (SSE)."""
        self._check_open()
        check_generate_request(request, stream)
        check_images(request, self.image_token, f"RuntimeEndpoint({self.base_url!r})")
        body = self._prompt_field(request.prompt)
        body["sampling_params"] = sampling_fields(request.params, request.constraint)
        if request.images:  # SGLang's image_data: one per image token, as data URLs
            body["image_data"] = [data_url(image) for image in request.images]
        if request.params.lora_path is not None:  # SGLang's: the adapter's name
            body["lora_path"] = request.params.lora_path
        if request.params.return_logprob:
            body.update(return_logprob=True, return_text_in_logprobs=True)
            if request.params.top_logprobs_num:
                body["top_logprobs_num"] = request.params.top_logprobs_num
        self._counts.add(generate_calls=1)
        if stream is None:
            out = self._post("/generate", body)
        else:
            out = self._stream("/generate", {**body, "stream": True}, stream)
        return result_of(out, request.constraint)

    def score(self, request: ScoreRequest) -> ScoreResult:
        """Choice logprobs from prompt logprobs (docs/design/endpoints.md)."""
        self._check_open()
        check_score_request(request)
        check_no_lora(request, "RuntimeEndpoint (select)")
        if request.images:
            raise BackendError(
                "RuntimeEndpoint scores select choices from prompt logprobs of text prompts; "
                "after lp.image() use gen(json_schema={'enum': [...]}) (or regex=) instead"
            )
        self._counts.add(score_calls=1)
        scored, meta = self._healed_scores(request.prompt, request.choices)
        free = None
        if request.unconditional:
            free, _ = self._healed_scores(UNCONDITIONAL_CONTEXT, request.choices)
        choices = tuple(
            ChoiceScore(
                token_logprobs=lps,
                token_ids=ids,
                unconditional_token_logprobs=free[i][0] if free is not None else None,
            )
            for i, (lps, ids) in enumerate(scored)
        )
        return ScoreResult(
            choices=choices,
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            cached_tokens=int(meta.get("cached_tokens", 0) or 0),
        )

    def cache_prefix(self, prompt: str) -> None:
        """Prefill `prompt` with no output tokens; the server keeps its KV (radix cache)."""
        if not isinstance(prompt, str):
            raise TypeError(f"cache_prefix takes a str, got {type(prompt).__name__}")
        self._check_open()
        if prompt:
            self._post("/generate", {"text": prompt, **_PREFILL})

    def flush_cache(self) -> bool:
        """Empty the server's prefix cache; False when the server refused (requests running)."""
        self._check_open()
        try:
            self._request("POST", "/flush_cache", {"empty_cache": True})
        except BackendError as exc:
            if "HTTP 400" in str(exc):
                return False
            raise
        return True

    def get_server_info(self) -> dict[str, Any]:
        """The server's GET /server_info (SGLang's; /get_server_info on older servers)."""
        self._check_open()
        try:
            info = self._get_json("/server_info")
        except BackendError as exc:
            if "HTTP 404" not in str(exc):
                raise
            info = self._get_json("/get_server_info")
        if not isinstance(info, dict):
            raise BackendError(f"{self.base_url}/server_info did not answer a JSON object")
        return info

    def stats(self) -> dict[str, Any]:
        """HTTP requests made (requests; generate_calls, score_calls) and failed ones (errors)."""
        return self._counts.snapshot()

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self) -> None:
        self._closed = True

    # ---- select -----------------------------------------------------------------------------
    def _healed_scores(
        self, prompt: str, choices: tuple[str, ...]
    ) -> tuple[list[tuple[tuple[float, ...], tuple[int, ...]]], dict[str, Any]]:
        """(logprobs, token ids) of each choice's tokens after `prompt`: those from the
        first token where the tokenization of prompt + choice leaves the prompt's own; and
        the meta info of the prompt's own prefill (its length; it also caches the prompt)."""
        head = _meta(self._post("/generate", {"text": prompt, **_PREFILL})) if prompt else {}
        length = int(head.get("prompt_tokens", 0))
        start = max(length - HEALING_WINDOW, 0)
        texts = [prompt, *(prompt + c for c in choices)] if prompt else [*choices]
        rows = self._prompt_logprobs(texts, start)
        if not prompt:
            rows.insert(0, [])
        prompt_ids = [t for _, t in rows[0]][: length - start]
        out = []
        for i, choice in enumerate(choices):
            row = rows[i + 1]
            ids = [t for _, t in row]
            split = _first_difference(prompt_ids, ids)
            if split == 0 and start > 0:  # parted before the window: compare from the start
                full = self._prompt_logprobs([prompt, prompt + choice], 0)
                row = full[1]
                split = _first_difference([t for _, t in full[0]][:length], [t for _, t in row])
            picked = [(lp, t) for lp, t in row[split:] if lp is not None]
            if not picked:
                raise BackendError(
                    f"choice {choice!r} got no scored token from {self.base_url} (the first token "
                    "of a prompt has no logprob, and the prompt was empty)"
                )
            out.append((tuple(lp for lp, _ in picked), tuple(t for _, t in picked)))
        return out, head

    def _prompt_logprobs(
        self, texts: list[str], start: int
    ) -> list[list[tuple[float | None, int]]]:
        """(logprob, token id) of every prompt token from position `start`, per text."""
        body = {
            "text": texts,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": start,
        }
        outs = self._post("/generate", body)
        if not isinstance(outs, list) or len(outs) != len(texts):
            raise BackendError(f"{self.base_url}/generate did not answer one output per prompt")
        rows = []
        for out in outs:
            entries = _meta(out).get("input_token_logprobs")
            if not isinstance(entries, list):
                raise BackendError(
                    f"{self.base_url}/generate returned no input_token_logprobs, which select "
                    "needs; use gen(choices=...) with a regex instead"
                )
            rows.append([(None if e[0] is None else float(e[0]), int(e[1])) for e in entries])
        return rows

    # ---- HTTP ------------------------------------------------------------------------------
    def _prompt_field(self, prompt: str | tuple[int, ...]) -> dict[str, Any]:
        if isinstance(prompt, str):
            return {"text": prompt}
        return {"input_ids": list(prompt)}

    def _connection(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout, context=self._ssl
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

    def _open(self, method: str, path: str, body: Any) -> tuple[Any, Any]:
        """(connection, response) of one request; errors become BackendError."""
        data = None if body is None else json.dumps(body).encode()
        conn = self._connection()
        self._counts.add(requests=1)
        try:
            conn.request(method, self._root + path, body=data, headers=self._headers)
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            self._counts.add(errors=1)
            raise BackendError(
                f"cannot reach {self.base_url}{path}: {exc}; is the server running?"
            ) from None
        if response.status != 200:
            raw = response.read()
            conn.close()
            self._counts.add(errors=1)
            raise _server_error(self.base_url + path, response.status, raw)
        return conn, response

    def _request(self, method: str, path: str, body: Any = None) -> bytes:
        conn, response = self._open(method, path, body)
        try:
            return response.read()
        except (OSError, http.client.HTTPException) as exc:
            self._counts.add(errors=1)
            raise BackendError(f"{self.base_url}{path}: the answer broke off: {exc}") from None
        finally:
            conn.close()

    def _get_json(self, path: str) -> Any:
        return _json(self._request("GET", path), self.base_url + path)

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        return _json(self._request("POST", path, body), self.base_url + path)

    def _stream(self, path: str, body: dict[str, Any], stream: StreamCallback) -> dict[str, Any]:
        """Read SSE events (each with the text so far) until [DONE]; pieces go to `stream`.
        Each event's logprobs are its own tokens' (SGLang's streaming, with
        `output_token_logprobs_length` the count so far), or all so far (servers that send
        them whole); the last output gets them all. If `stream` raises (the program was
        cancelled), the connection is closed at once and the server aborts the request."""
        conn, response = self._open("POST", path, body)
        last: dict[str, Any] | None = None
        sent = 0
        entries: dict[str, list[Any]] = {"output_token_logprobs": [], "output_top_logprobs": []}
        pending: list[TokenLogprob] = []  # logprobs of tokens since the last piece
        per_event = False
        try:
            for event in _events(response, self.base_url + path):
                if "error" in event:
                    self._counts.add(errors=1)
                    raise _error_of(self.base_url + path, 200, event)
                text = event.get("text", "")
                if not isinstance(text, str):
                    raise BackendError(f"{self.base_url}{path} streamed a non-text 'text'")
                meta = _meta(event)
                if "output_token_logprobs_length" in meta:  # this event's own logprobs
                    per_event = True
                    for key, got in entries.items():
                        got.extend(meta.get(key) or [None] * len(meta["output_token_logprobs"]))
                    pending.extend(_output_logprobs(meta) or ())
                if len(text) > sent:
                    piece, sent = text[sent:], len(text)
                    done_tokens = meta.get("completion_tokens")
                    if not isinstance(done_tokens, int):
                        stream(piece)
                    elif per_event:
                        count = len(entries["output_token_logprobs"])
                        stream(StreamPiece(piece, done_tokens, tuple(pending), count))
                        pending = []
                    else:
                        stream(StreamPiece(piece, done_tokens))
                last = event
        finally:
            conn.close()
        if last is None or _meta(last).get("finish_reason") is None:
            raise BackendError(f"{self.base_url}{path}: the stream ended before its output did")
        if per_event:
            last = {**last, "meta_info": {**_meta(last), **entries}}
        return last

    # ---- what the server does not say ------------------------------------------------------
    def _find_template(self) -> ChatTemplate:
        if self._template_arg is not None:
            if self._tokenizer_arg is not None:
                return template_from_tokenizer(self.tokenizer, self._template_arg)
            return ChatTemplate(self._template_arg)
        if self._tokenizer_arg is not None:
            return template_from_tokenizer(self.tokenizer)
        served = self.model_info.get("lmprog")
        if isinstance(served, dict) and isinstance(served.get("chat_template"), str):
            specials = served.get("special_tokens")
            return ChatTemplate(
                served["chat_template"],
                special_tokens=specials if isinstance(specials, dict) else None,
            )
        local = self._local_tokenizer()
        if local is not None:
            return template_from_tokenizer(local)
        raise BackendError(
            f"{self.base_url} does not say how its model {self.model_name!r} renders role "
            "messages (an SGLang server does not): pass RuntimeEndpoint(..., chat_template=NAME "
            "or jinja2 source) or tokenizer=..."
        )

    def _find_tokenizer(self) -> Any:
        tok = self._tokenizer_arg
        if tok is None:
            tok = self._local_tokenizer()
            if tok is None:
                raise BackendError(
                    f"{self.base_url} serves {self.model_name!r}, whose tokenizer is not on this "
                    "machine: pass RuntimeEndpoint(..., tokenizer=...) (a Hugging Face tokenizer "
                    "or an lmprog model name)"
                )
            return tok
        if isinstance(tok, str):
            from lmprog.core.models import load_tokenizer, resolve_model

            return load_tokenizer(resolve_model(tok))
        return tok

    def _local_tokenizer(self) -> Any:
        """The tokenizer of the served model when it is an lmprog model here, else None."""
        if not self.model_name:
            return None
        from lmprog.core.models import load_tokenizer, resolve_model

        try:
            return load_tokenizer(resolve_model(self.model_name))
        except Exception:  # noqa: BLE001 - not a model of this machine
            return None

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError("this RuntimeEndpoint was shut down; create a new one")

    def __repr__(self) -> str:
        return f"RuntimeEndpoint({self.base_url!r}, model={self.model_name!r})"


_PREFILL = {"sampling_params": {"max_new_tokens": 0}}


def sampling_fields(params: SamplingParams, constraint: Any) -> dict[str, Any]:
    """SGLang's `sampling_params` for lmprog's SamplingParams and constraint."""
    fields: dict[str, Any] = {
        "max_new_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
    }
    for name, value, unset in (
        ("min_new_tokens", params.min_tokens, 0),
        ("min_p", params.min_p, 0.0),
        ("frequency_penalty", params.frequency_penalty, 0.0),
        ("presence_penalty", params.presence_penalty, 0.0),
        ("repetition_penalty", params.repetition_penalty, 1.0),
        ("ignore_eos", params.ignore_eos, False),
        ("sampling_seed", params.seed, None),
        ("skip_special_tokens", params.skip_special_tokens, True),  # markers kept (gpt-oss)
    ):
        if value != unset:
            fields[name] = value
    if params.stop:
        fields["stop"] = list(params.stop)
    if params.stop_token_ids:
        fields["stop_token_ids"] = list(params.stop_token_ids)
    if params.stop_regex:
        fields["stop_regex"] = list(params.stop_regex)
    if constraint is not None:
        if constraint.kind == "json_schema":
            fields["json_schema"] = constraint.source
        elif constraint.kind == "ebnf":
            fields["ebnf"] = constraint.source
        else:  # regex, dtype, choices: the regex lmprog compiled
            fields["regex"] = constraint.pattern
    return fields


_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def result_of(out: Any, constraint: Any = None) -> GenerateResult:
    """The GenerateResult of one /generate output ({"text", "meta_info", "output_ids"})."""
    if not isinstance(out, dict) or not isinstance(out.get("text"), str):
        raise BackendError(f"/generate answered {str(out)[:200]!r}, not an output")
    meta = _meta(out)
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    matched = finish.get("matched") if isinstance(finish, dict) else None
    reason = _FINISH.get(str(kind), "stop")
    text = out["text"]
    message = meta.get("message")
    if message is None and constraint is not None and not constraint.matches(text):
        message = (
            "generation stopped at max_tokens before the output was complete"
            if reason == "length"
            else f"the server's output does not match the {constraint.kind} constraint"
        )
    return GenerateResult(
        text=text,
        token_ids=tuple(int(t) for t in out.get("output_ids") or ()),
        finish_reason=reason,
        prompt_tokens=int(meta.get("prompt_tokens", 0) or 0),
        completion_tokens=int(meta.get("completion_tokens", 0) or 0),
        cached_tokens=int(meta.get("cached_tokens", 0) or 0),
        matched_stop=matched
        if isinstance(matched, (str, int)) and not isinstance(matched, bool)
        else None,
        logprobs=_output_logprobs(meta),
        message=message,
    )


def _output_logprobs(meta: dict[str, Any]) -> tuple[TokenLogprob, ...] | None:
    entries = meta.get("output_token_logprobs")
    if entries is None:
        return None
    tops = meta.get("output_top_logprobs") or [None] * len(entries)
    out = []
    for entry, top in zip(entries, tops):
        alts = tuple(TopLogprob(int(a[1]), a[2] or "", _logprob(a[0])) for a in (top or ()) if a)
        out.append(TokenLogprob(int(entry[1]), entry[2] or "", _logprob(entry[0]), alts))
    return tuple(out)


def _logprob(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _meta(out: Any) -> dict[str, Any]:
    meta = out.get("meta_info") if isinstance(out, dict) else None
    return meta if isinstance(meta, dict) else {}


def _first_difference(prompt_ids: list[int], ids: list[int]) -> int:
    """Index of the first position where `ids` leaves `prompt_ids` (len(prompt_ids) if never)."""
    for i, t in enumerate(prompt_ids):
        if i >= len(ids) or ids[i] != t:
            return i
    return len(prompt_ids)


def _events(response: Any, where: str) -> Iterator[dict[str, Any]]:
    """The JSON payloads of `data: ...` SSE lines, until `data: [DONE]`."""
    while True:
        try:
            line = response.readline()
        except (OSError, http.client.HTTPException) as exc:
            raise BackendError(f"{where}: the stream broke off: {exc}") from None
        if not line:
            return
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        event = _json(payload, where)
        if not isinstance(event, dict):
            raise BackendError(f"{where} streamed {payload[:200]!r}, not a JSON object")
        yield event


def _json(raw: bytes, where: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise BackendError(f"{where} answered {raw[:200]!r}, not JSON") from None


def _server_error(where: str, status: int, raw: bytes) -> LmprogError:
    try:
        body = json.loads(raw)
    except ValueError:
        body = raw.decode("utf-8", "replace")[:500]
    return _error_of(where, status, body)


def _error_of(where: str, status: int, body: Any) -> LmprogError:
    """SGLang's {"error": {"message": ...}} (lmprog serve adds type, param, code)."""
    error = body.get("error", body) if isinstance(body, dict) else body
    code = error.get("code") if isinstance(error, dict) else None
    message = error.get("message", error) if isinstance(error, dict) else error
    text = f"{where} answered HTTP {status}: {message}"
    if code == "context_length_exceeded":
        return ContextLengthError(text)
    return BackendError(text)


def _ssl_context(verify: bool | str | None) -> ssl.SSLContext:
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return ssl.create_default_context()
