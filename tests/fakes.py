"""A deterministic toy backend for interpreter tests, and small test helpers.

`FakeBackend` implements `lmprog.core.protocol.Backend` without a model:
- generate: words drawn from a fixed vocabulary by hashing the prompt (temperature 0) or
  the prompt plus a counter (temperature > 0, no seed), one word per "token"; stop
  strings cut the text; `responder(request) -> str` replaces the toy model;
- score: one "token" per character of each choice, logprobs from `scorer(prompt, choice)
  -> list[float]` (default: a deterministic hash-based value per character);
- records every request (`requests`, `prefixes`) and can sleep `latency` seconds per call
  and `token_latency` per streamed token (sleeping releases the GIL, like a real backend);
- synchronizes instead of timing, for tests of concurrency and streaming: with
  `rendezvous=n` calls wait at a barrier until n of them are in flight at once; with
  `gate=Gate()` every call is held before it finishes (a streaming generate sends all its
  pieces but the last) until the test opens the gate. Both fail the call with a
  BackendError after `SYNC_TIMEOUT` seconds instead of hanging the test;
- counts for cancellation tests: `pieces_sent` (stream callback calls) and `aborted` (calls
  whose stream callback raised: the caller cancelled, so the call stopped there, as the
  real backends abort their request).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from lmprog.backends.checks import check_images
from lmprog.core.chat import ChatTemplate
from lmprog.core.errors import BackendError
from lmprog.core.protocol import (
    Backend,
    ChoiceScore,
    GenerateRequest,
    GenerateResult,
    ScoreRequest,
    ScoreResult,
    StreamCallback,
)

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")
SYNC_TIMEOUT = 10.0  # seconds a call waits at a rendezvous or a gate before it fails


class Gate:
    """Holds the fake backend's calls until the test opens it, so a test can check what
    happens while a call is in flight without measuring time. A call still held after
    `timeout` seconds fails with a BackendError (the code under test waited for the held
    call: it would deadlock), so the test fails instead of hanging."""

    def __init__(self, timeout: float = SYNC_TIMEOUT) -> None:
        self.timeout = timeout
        self._open = threading.Event()
        self._lock = threading.Lock()
        self.held = 0  # calls waiting at the gate now

    def open(self) -> None:
        self._open.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def pass_through(self) -> None:
        with self._lock:
            self.held += 1
        try:
            if not self._open.wait(self.timeout):
                raise BackendError(
                    f"fake backend: held at a gate not opened within {self.timeout:g} s"
                )
        finally:
            with self._lock:
                self.held -= 1


class FakeTokenizer:
    """Bytes as tokens."""

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode(errors="replace")


def _hash(*parts: object) -> int:
    return int.from_bytes(
        hashlib.sha1("\x00".join(map(str, parts)).encode()).digest()[:8], "little"
    )


class FakeBackend(Backend):
    def __init__(
        self,
        *,
        latency: float = 0.0,
        token_latency: float = 0.0,
        responder: Callable[[GenerateRequest], str] | None = None,
        scorer: Callable[[str, str], list[float]] | None = None,
        template: str = "chatml",
        fail_on: str | None = None,
        rendezvous: int = 0,
        gate: Gate | None = None,
        image_token: str | None = None,
    ) -> None:
        self._image_token = image_token  # a vision model's (requests' images checked)
        self.latency = latency
        self.token_latency = token_latency
        self.responder = responder
        self.scorer = scorer
        self.fail_on = fail_on  # generate/score raise BackendError when the prompt contains it
        # calls wait until `rendezvous` of them are in flight at once (each group of that many)
        self._barrier = threading.Barrier(rendezvous, timeout=SYNC_TIMEOUT) if rendezvous else None
        self.gate = gate
        self._template = ChatTemplate(template)
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self.requests: list[GenerateRequest | ScoreRequest] = []
        self.prefixes: list[str] = []
        self.active = 0  # requests in flight now
        self.max_active = 0  # most requests ever in flight at once
        self.pieces_sent = 0  # stream callback calls, over all generates
        self.aborted = 0  # generates stopped because their stream callback raised

    # ---- protocol ----------------------------------------------------------------

    def generate(
        self, request: GenerateRequest, stream: StreamCallback | None = None
    ) -> GenerateResult:
        check_images(request, self._image_token, "FakeBackend")
        self._begin(request)
        try:
            self._meet()
            if self.latency:
                time.sleep(self.latency)
            text = self.responder(request) if self.responder else self._toy(request)
            text, finish, matched = _apply_stop(text, request.params.stop)
            pieces = _pieces(text) if stream is not None else []
            for i, piece in enumerate(pieces):
                if i == len(pieces) - 1:
                    self._hold()  # the last piece waits at the gate
                if self.token_latency:
                    time.sleep(self.token_latency)
                with self._lock:
                    self.pieces_sent += 1
                try:
                    stream(piece)
                except BaseException:
                    with self._lock:
                        self.aborted += 1
                    raise
            if not pieces:
                self._hold()
            completion = len(text.split()) if not self.responder else max(1, len(text))
            return GenerateResult(
                text=text,
                token_ids=tuple(FakeTokenizer().encode(text)),
                finish_reason=finish,
                prompt_tokens=len(str(request.prompt)),
                completion_tokens=completion,
                cached_tokens=self._cached(str(request.prompt)),
                matched_stop=matched,
            )
        finally:
            self._end()

    def score(self, request: ScoreRequest) -> ScoreResult:
        check_images(request, self._image_token, "FakeBackend")
        self._begin(request)
        try:
            self._meet()
            if self.latency:
                time.sleep(self.latency)
            self._hold()
            choices = []
            for choice in request.choices:
                logprobs = (
                    self.scorer(request.prompt, choice)
                    if self.scorer
                    else self._toy_score(request.prompt, choice)
                )
                uncond = tuple(self._toy_score("", choice)) if request.unconditional else None
                choices.append(
                    ChoiceScore(tuple(logprobs), tuple(FakeTokenizer().encode(choice)), uncond)
                )
            return ScoreResult(
                tuple(choices),
                prompt_tokens=len(request.prompt),
                cached_tokens=self._cached(request.prompt),
            )
        finally:
            self._end()

    def cache_prefix(self, prompt: str) -> None:
        with self._lock:
            self.prefixes.append(prompt)

    @property
    def chat_template(self) -> ChatTemplate:
        return self._template

    @property
    def image_token(self) -> str | None:
        return self._image_token

    @property
    def tokenizer(self) -> Any:
        return FakeTokenizer()

    # ---- toy model ---------------------------------------------------------------

    def _toy(self, request: GenerateRequest) -> str:
        p = request.params
        salt: object = p.seed if p.seed is not None else (0 if p.greedy else next(self._counter))
        h = _hash(request.prompt, salt)
        words = [WORDS[(h >> (3 * i)) % len(WORDS)] for i in range(min(p.max_tokens, 20))]
        return "".join(" " + w for w in words)

    @staticmethod
    def _toy_score(prompt: str, choice: str) -> list[float]:
        return [-((_hash(prompt[-20:], choice, i) % 1000) / 250.0) for i in range(len(choice))]

    def _cached(self, prompt: str) -> int:
        with self._lock:
            return max((len(p) for p in self.prefixes if prompt.startswith(p)), default=0)

    def _begin(self, request: GenerateRequest | ScoreRequest) -> None:
        if self.fail_on is not None and self.fail_on in str(request.prompt):
            raise BackendError(f"fake backend failure on {self.fail_on!r}")
        with self._lock:
            self.requests.append(request)
            self.active += 1
            self.max_active = max(self.max_active, self.active)

    def _end(self) -> None:
        with self._lock:
            self.active -= 1

    def _meet(self) -> None:
        """With `rendezvous`: wait until that many calls are here at once."""
        if self._barrier is None:
            return
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            raise BackendError(
                f"fake backend: {self._barrier.parties} calls were never in flight at once "
                f"(waited {SYNC_TIMEOUT:g} s; the most at once: {self.max_active})"
            ) from None

    def _hold(self) -> None:
        if self.gate is not None:
            self.gate.pass_through()

    def generations(self) -> list[GenerateRequest]:
        with self._lock:
            return [r for r in self.requests if isinstance(r, GenerateRequest)]


def _apply_stop(text: str, stops: tuple[str, ...]) -> tuple[str, str, str | None]:
    cut, matched = len(text), None
    for s in stops:
        i = text.find(s)
        if 0 <= i < cut:
            cut, matched = i, s
    return text[:cut], ("stop" if matched else "length"), matched


def _pieces(text: str) -> list[str]:
    """Split into word-sized pieces (each with its leading space) that concatenate back."""
    pieces, current = [], ""
    for ch in text:
        if ch == " " and current.strip():
            pieces.append(current)
            current = ""
        current += ch
    if current:
        pieces.append(current)
    return pieces


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """`fn()`'s result, or fail the test if it takes longer than `seconds` (a hang)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise AssertionError(f"did not finish within {seconds}s (hang)")
    if "error" in box:
        raise box["error"]
    return box.get("value")
