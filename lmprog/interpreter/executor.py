"""Executing IR nodes for one state (on its worker thread).

The executor owns the state's position in the chat structure (open message, var scopes,
how many messages so far) and writes results into the `StateRecord`. It reaches the model
only through the `Backend` protocol: `generate` for gens, `score` for selects,
`cache_prefix` at forks. Design: docs/design/frontend.md.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from lmprog.core.chat import ChatTemplate
from lmprog.core.errors import BackendError, ConstraintError, ProgramCancelled
from lmprog.core.images import ImageInput
from lmprog.core.prompt import Prompt, cut, extend_control
from lmprog.core.protocol import Backend, GenerateRequest, GenerateResult, ScoreRequest, ScoreResult
from lmprog.core.reasoning import ANSWER
from lmprog.core.sampling import SamplingParams
from lmprog.core.thinking_budget import Budgeted
from lmprog.interpreter.api_spec import ApiSpeculator
from lmprog.interpreter.record import Parsed, StateRecord
from lmprog.lang.choices import ChoiceDecision
from lmprog.lang.ir import (
    Fork,
    Gen,
    Image,
    Join,
    Node,
    RoleBegin,
    RoleEnd,
    Select,
    Text,
    VarScopeBegin,
    VarScopeEnd,
)
from lmprog.lang.reasoning import reasoning_name

# Gives the chat template when a role first needs it (see `TemplateCache`).
TemplateSource = Callable[[], ChatTemplate]


class TemplateCache:
    """A backend's chat template, fetched once on first use and shared by a run's states.

    Lazy because a backend for a model without a chat template may raise when asked, and
    a program without roles must still run there.
    """

    def __init__(self, backend: Backend, variables: Mapping[str, Any] | None = None) -> None:
        self._backend = backend
        self._variables = dict(variables or {})  # the run's chat_template_kwargs
        self._template: ChatTemplate | None = None

    def __call__(self) -> ChatTemplate:
        if self._template is None:
            template = self._backend.chat_template
            if self._variables:
                # an endpoint in chat mode sends messages: its server renders them
                if getattr(self._backend, "chat", None) is True:
                    raise ValueError(
                        "chat_template_kwargs: this backend sends chat messages, which its "
                        "server renders; give them to it instead (lp.OpenAI(..., extra_body="
                        '{"chat_template_kwargs": {...}}))'
                    )
                template = template.with_variables(self._variables)
            self._template = template  # idempotent: a race only fetches twice
        return self._template


class ForkTarget(Protocol):
    """Where a fork step hands its snapshot to the copies (the worker's `ForkPoint`)."""

    def resolve(self, snapshot: ForkSnapshot) -> None: ...


@dataclass(frozen=True)
class ForkSnapshot:
    """A state at a fork: what each copy starts from."""

    text: str
    variables: dict[str, Any]
    meta: dict[str, Any]
    messages: list[dict[str, str]]
    message_count: int
    open_message: tuple[str, int] | None
    parsed: dict[str, Parsed | list[Parsed | None]] = field(default_factory=dict)
    control: tuple[tuple[int, int], ...] = ()
    images: tuple[tuple[int, ImageInput], ...] = ()  # (offset of its token, image)


class NodeExecutor:
    """Runs nodes against one record. Not thread-safe: only the state's worker calls it."""

    def __init__(
        self,
        record: StateRecord,
        backend: Backend | None,
        template: TemplateSource,
        stream: bool,
        num_api_spec_tokens: int | None = None,
        allow_special_tokens: bool = False,
    ) -> None:
        self._record = record
        # False: special-token strings in the program's own text (its strings, arguments,
        # tool results, select choices) are text; only the template's markers and generated
        # text hold control tokens (see `_prompt`)
        self._allow_special = allow_special_tokens
        self._backend = backend
        self._template = template  # fetched at the first role: plain-text programs need none
        self._stream = stream
        # API speculative execution, on endpoint backends only (see api_spec.py).
        self._spec: ApiSpeculator | None = None
        if num_api_spec_tokens and backend is not None and backend.api_speculation is not None:
            self._spec = ApiSpeculator(backend, num_api_spec_tokens)
        self._message_count = 0  # role messages begun so far (the first one renders differently)
        self._open_message: tuple[str, int] | None = None  # (role, offset of its content)
        self._scopes: list[tuple[str, int]] = []  # (variable, offset where capture began)
        self._captures: tuple[str, ...] = ()
        self._image_token: str | None = None  # the backend's, read at the first lp.image()
        self._handlers: dict[type, Callable[[Any, Any], None]] = {
            Text: self._text,
            Gen: self._gen,
            Select: self._select,
            RoleBegin: self._role_begin,
            RoleEnd: self._role_end,
            VarScopeBegin: self._scope_begin,
            VarScopeEnd: self._scope_end,
            Fork: self._fork,
            Join: self._join,
            Image: self._image,
        }

    def execute(self, node: Node, payload: Any) -> None:
        handler = self._handlers.get(type(node))
        if handler is None:
            raise TypeError(f"the interpreter cannot execute {node.describe()}")
        handler(node, payload)

    # ---- text and structure ------------------------------------------------------

    def _text(self, node: Text, _: None) -> None:
        self._append_constant(node.text)

    def _append_constant(self, text: str, control: bool = False) -> None:
        """Append text the program wrote (not generated); a speculation's surplus must match it.
        `control`: the chat template's markers, whose special tokens are control tokens."""
        if self._spec is not None:
            self._spec.on_text(text)
        start = self._record.length
        self._record.append(text, self._captures)
        if control:
            self._record.mark_control(start, self._record.length)

    def _prompt(self) -> str:
        """The text so far as a prompt: a `Prompt` whose special-token strings are control
        tokens only in the template's markers and generated text (a plain str, every one a
        control token, when the program allows special tokens in its text)."""
        record = self._record
        with record.cond:
            text = record._text_locked()
            control = tuple(record.control)
        return text if self._allow_special else Prompt(text, control)

    def _role_begin(self, node: RoleBegin, _: None) -> None:
        assert self._open_message is None, "the front half rejects nested roles"
        prefix = self._template().role_prefix(node.role, first=self._message_count == 0)
        self._message_count += 1
        if prefix:
            self._append_constant(prefix, control=True)
        self._open_message = (node.role, self._record.length)
        self._record.open_message = self._open_message

    def _role_end(self, node: RoleEnd, _: None) -> None:
        assert self._open_message is not None and self._open_message[0] == node.role
        role, start = self._open_message
        self._record.add_message(role, self._record.text[start:])
        self._open_message = self._record.open_message = None
        suffix = self._template().role_suffix(role)
        if suffix:
            self._append_constant(suffix, control=True)

    def _scope_begin(self, node: VarScopeBegin, _: None) -> None:
        self._scopes.append((node.name, self._record.length))
        self._captures = tuple(name for name, _ in self._scopes)

    def _scope_end(self, node: VarScopeEnd, _: None) -> None:
        name, start = self._scopes.pop()
        assert name == node.name
        self._captures = tuple(n for n, _ in self._scopes)
        self._record.set_var(name, self._record.text[start:], {})

    def _image(self, node: Image, _: None) -> None:
        """The backend's image token text in the image's place (a control token), and the
        image kept in order: every later request whose prompt holds the token sends it."""
        token = self._vision_token()
        image = ImageInput.from_source(node.source)  # a path is read here, as SGLang does
        self._record.add_image(image)
        self._append_constant(token, control=True)

    def _vision_token(self) -> str:
        if self._image_token is None:
            backend = self._backend
            token = None if backend is None else backend.image_token
            if token is None:
                raise BackendError(
                    f"{type(backend).__name__} has no vision support (its model takes no "
                    "images, image_token is None), so lp.image() cannot run; use a "
                    "vision-language model: lp.Runtime(model=...) of one, "
                    "lp.LlamaCpp(model=..., mmproj=...), or lp.OpenAI(chat=True) on a vision "
                    "model"
                )
            if not isinstance(token, str) or not token:
                raise BackendError(
                    f"{type(backend).__name__}.image_token must be a non-empty str, got {token!r}"
                )
            self._image_token = token
        return self._image_token

    def _images(self, prompt: str) -> tuple[ImageInput, ...]:
        """The images of `prompt` (a prefix of the text, maybe with a generation prompt
        after it): one per image token in it. BackendError when the program's own text
        holds the token text outside lp.image(): the model could not tell them apart."""
        images = self._record.images_before(len(prompt))
        if not images:
            return ()
        token = self._vision_token()
        found = str(prompt).count(token)
        if found != len(images):
            raise BackendError(
                f"the prompt holds the image token {token!r} {found} times for {len(images)} "
                "lp.image() images: the program's text holds that token text outside "
                "lp.image(); remove it from the text"
            )
        return images

    # ---- model calls -------------------------------------------------------------

    def _captures_with(self, name: str | None) -> tuple[str, ...]:
        """The open scopes' variables, plus `name` (the gen/select's own) if given."""
        return self._captures + ((name,) if name is not None else ())

    def _gen(self, node: Gen, params: SamplingParams) -> None:
        assert self._backend is not None and isinstance(params, SamplingParams)
        if params.n > 1:
            if node.reasoning is not None:
                raise ValueError(
                    f"gen({node.name!r}) under separate_reasoning draws one continuation: n must be 1"
                )
            self._gen_n(node, params)
            return
        if node.reasoning is not None:
            self._gen_reasoning(node, params)
            return
        captures = self._captures_with(node.name)
        result = None
        text_start = self._record.length
        if self._spec is not None:
            start = self._open_message[1] if self._open_message is not None else None
            result = self._spec.gen(self._record.text, start, params, node.constraint, self._images)
        if result is None:
            prompt = self._prompt()
            result, done = self._generate(
                GenerateRequest(prompt, params, node.constraint, self._images(prompt)), captures
            )
        else:
            done = ""
        if len(result.text) > len(done):
            self._record.append(result.text[len(done) :], captures)
        self._record.mark_control(text_start, self._record.length)  # the model's own text
        if node.name is not None:
            value, parsed = _parse(node, result)
            self._record.set_var(node.name, value, result.meta_info(), parsed)

    def _gen_n(self, node: Gen, params: SamplingParams) -> None:
        """gen(n=k): k continuations of one prompt (sample i seeded seed + i when seeded);
        the variable holds the list of their texts (meta info and parsed values lists too)
        and the text goes on with the first, as SGLang's OpenAI backend has it."""
        if self._spec is not None:
            self._spec.drop()
        prompt, text_start = self._prompt(), self._record.length
        images = self._images(prompt)
        results: list[GenerateResult] = []
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            request = GenerateRequest(
                prompt, dataclasses.replace(params, n=1, seed=seed), node.constraint, images
            )
            if i == 0:  # the text goes on with the first: streamed as a single gen's
                result, done = self._generate(request, self._captures_with(node.name))
                if len(result.text) > len(done):
                    self._record.append(result.text[len(done) :], self._captures_with(node.name))
                self._record.mark_control(text_start, self._record.length)
            else:
                result, _ = self._generate(request, (), on_text=lambda _: None)
            results.append(result)
        if node.name is not None:
            parsed = [_parse(node, r) for r in results]
            self._record.set_var(
                node.name,
                [value for value, _ in parsed],
                [r.meta_info() for r in results],
                [p for _, p in parsed],
            )

    def _gen_reasoning(self, node: Gen, params: SamplingParams) -> None:
        """A separate_reasoning gen: the thinking goes to `<name>_reasoning_content` (streamed
        aside, never into the text), the answer to `name` and the text; the constraint
        applies to the answer (see lmprog.lang.reasoning)."""
        assert self._backend is not None and node.name is not None
        if self._spec is not None:
            self._spec.drop()
        spec = node.reasoning
        fmt = spec.format(self._template_source())
        prompt = self._generation_prompt(self._prompt())
        state = fmt.prompt_state(prompt)
        captures, aside = self._captures_with(node.name), (reasoning_name(node.name),)
        splitter = fmt.splitter(state)
        text_start, streamed = self._record.length, []

        def route(parts: list[tuple[str, str]]) -> None:
            for kind, text in parts:
                if kind == ANSWER:
                    streamed.append(text)
                    self._record.append(text, captures)
                else:
                    self._record.append_aside(text, aside)

        backend: Backend | Budgeted = self._backend
        images = self._images(prompt)
        tokenizer = self._local_tokenizer()
        specials = spec.specials(fmt, tokenizer)
        if tokenizer is not None and fmt.marked_by_special_tokens(tokenizer):
            params = dataclasses.replace(params, skip_special_tokens=False)  # to split the text
        if spec.budget is not None:
            after = spec.answer(node.constraint, fmt, specials)
            backend = Budgeted(self._backend, fmt, state, spec.budget, after)
            request = GenerateRequest(prompt, params, images=images)
        else:
            constraint = spec.constrain(node.constraint, fmt, state, specials)
            request = GenerateRequest(prompt, params, constraint, images)
        result, _ = self._generate(
            request, captures, backend=backend, on_text=lambda t: route(splitter.feed(t))
        )
        if self._stream:
            route(splitter.finish())
        reasoning, answer = fmt.split(result.text, state)
        done = "".join(streamed)
        if len(answer) > len(done) and answer.startswith(done):
            self._record.append(answer[len(done) :], captures)
        self._record.mark_control(text_start, self._record.length)
        self._record.set_var(aside[0], reasoning or "", result.meta_info())
        value, parsed = _parse(node, dataclasses.replace(result, text=answer))
        self._record.set_var(node.name, value, result.meta_info(), parsed)

    def _generation_prompt(self, prompt: str) -> str:
        """At the start of an assistant message, the prompt the chat template's generation
        prompt gives instead of its assistant prefix (a reasoning block opened, or not
        closed empty: see ChatTemplate.generation_prompt); else `prompt`."""
        opened = self._open_message
        if opened is None or opened[0] != "assistant" or opened[1] != self._record.length:
            return prompt
        template = self._template()
        prefix, generation = template.role_prefix("assistant"), template.generation_prompt()
        if not generation or generation == prefix or not prompt.endswith(prefix):
            return prompt
        return extend_control(cut(prompt, len(prompt) - len(prefix)), generation)

    def _local_tokenizer(self) -> Any:
        """The backend's tokenizer, or None for a backend without one (an endpoint)."""
        try:
            return self._backend.tokenizer  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - no local tokenizer
            return None

    def _template_source(self) -> str | None:
        try:
            return self._template().source
        except Exception:  # noqa: BLE001 - no template: only a named model_type will do
            return None

    def _generate(
        self,
        request: GenerateRequest,
        captures: tuple[str, ...],
        *,
        backend: Backend | Budgeted | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> tuple[GenerateResult, str]:
        """Call the backend (default: the state's); returns the result and the text already
        appended by streaming (`on_text`: streamed pieces go there instead)."""
        assert self._backend is not None
        backend = backend or self._backend
        streamed: list[str] = []
        record = self._record

        # Cancellation reuses the server's mechanism: the stream callback raises once the
        # state is cancelled and the backend aborts the request (Runtime: RequestHandle.abort,
        # KV freed; llama.cpp: its decode loop stops). Non-streamed gens get a callback that
        # only checks, except on endpoint backends (a callback would make their call a
        # streamed one): there a cancelled gen's result is dropped when the call returns.
        def on_piece(piece: str) -> None:
            if record.cancelled:
                raise record.error or ProgramCancelled("the program was cancelled")
            if self._stream:
                if on_text is not None:
                    on_text(piece)
                    return
                streamed.append(piece)
                record.append(piece, captures)

        if self._stream or self._backend.api_speculation is None:
            result = backend.generate(request, stream=on_piece)
        else:
            result = backend.generate(request)
        if record.cancelled:  # cancelled after its last piece: its text is not appended
            raise record.error or ProgramCancelled("the program was cancelled")
        if not isinstance(result, GenerateResult):
            raise BackendError(
                f"{type(self._backend).__name__}.generate returned {type(result).__name__}, not a GenerateResult"
            )
        done = "".join(streamed)
        if not result.text.startswith(done):
            raise BackendError(
                f"streamed pieces {done!r} are not a prefix of the result {result.text!r}"
            )
        return result, done

    def _select(self, node: Select, defaults: SamplingParams | None) -> None:
        assert self._backend is not None
        if self._spec is not None:
            self._spec.drop()  # a choice is scored, never generated: nothing to match it with
        prompt = self._prompt()
        request = ScoreRequest(
            prompt,
            node.choices,
            unconditional=node.method.needs_unconditional,
            lora_path=None if defaults is None else defaults.lora_path,
            images=self._images(prompt),
        )
        result = self._backend.score(request)
        if not isinstance(result, ScoreResult) or len(result.choices) != len(node.choices):
            raise BackendError(
                f"{type(self._backend).__name__}.score must return a ScoreResult with one score per choice"
            )
        decision = node.method.choose(result)
        choice = node.choices[decision.index]
        self._record.append(choice, self._captures_with(node.name))
        if node.name is not None:
            self._record.set_var(node.name, choice, self._select_meta(node, result, decision))

    def _select_meta(
        self, node: Select, result: ScoreResult, decision: ChoiceDecision
    ) -> dict[str, Any]:
        """SGLang's select meta info (`normalized_prompt_logprobs`, `input_token_logprobs`
        as [logprob, token_id, token text] per choice token, `output_token_logprobs` (none:
        nothing is generated), and its method's keys) with lmprog's (`normalized_scores`,
        the scores the method compared, ...)."""
        assert self._backend is not None
        text = _token_text(self._backend)
        meta: dict[str, Any] = {
            "normalized_prompt_logprobs": [
                sum(c.token_logprobs) / len(c.token_logprobs) for c in result.choices
            ],
            "input_token_logprobs": [
                [[lp, tid, text(tid)] for lp, tid in zip(c.token_logprobs, c.token_ids)]
                for c in result.choices
            ],
            "output_token_logprobs": [[] for _ in result.choices],
            **node.method.meta_info(result),
            "choices": list(node.choices),
            "choices_method": node.method.name,
            "normalized_scores": list(decision.scores),
            "token_logprobs": [list(c.token_logprobs) for c in result.choices],
            "prompt_tokens": result.prompt_tokens,
            "cached_tokens": result.cached_tokens,
        }
        return meta

    # ---- fork / join -------------------------------------------------------------

    def _fork(self, node: Fork, point: ForkTarget) -> None:
        text = self._prompt()
        # cache_prefix takes text only: a prefix with images is left to the copies' first
        # requests, which share it in a backend's cache keyed by the images' content
        if text and self._backend is not None and not self._record.images:
            self._backend.cache_prefix(text)
        point.resolve(self.snapshot())

    def snapshot(self) -> ForkSnapshot:
        record = self._record
        with record.cond:
            return ForkSnapshot(
                record._text_locked(),
                dict(record.variables),
                dict(record.meta),
                list(record.messages),
                self._message_count,
                self._open_message,
                dict(record.parsed),
                tuple(record.control),
                tuple(record.images),
            )

    def restore(self, snap: ForkSnapshot) -> None:
        """Become a copy of the forked parent (called once, before any step)."""
        self._record.restore(
            snap.text,
            snap.variables,
            snap.meta,
            snap.messages,
            snap.parsed,
            snap.control,
            snap.images,
        )
        self._message_count = snap.message_count
        self._open_message = self._record.open_message = snap.open_message

    def _join(self, node: Join, children: list[StateRecord]) -> None:
        if self._spec is not None:
            self._spec.drop()
        for child in children:
            child.wait_finished()
        for child in children:
            if child.error is not None:
                raise child.error
        if node.mode == "gather":
            names: dict[str, None] = {}
            for child in children:
                names.update(child.new_names)
            for name in names:
                self._record.set_var(
                    name,
                    [c.variables.get(name) for c in children],
                    [c.meta.get(name) for c in children],
                    [c.parsed.get(name) for c in children],
                )
            return
        for child in children:
            segment = child.text[child.origin_text_len :]
            if segment:
                shift = self._record.length - child.origin_text_len
                with child.cond:
                    spans = [(a, b) for a, b in child.control if b > child.origin_text_len]
                    images = [(a, i) for a, i in child.images if a >= child.origin_text_len]
                with self._record.cond:  # the copy's own images, at their place here
                    self._record.images.extend((a + shift, i) for a, i in images)
                self._record.append(segment, self._captures)
                for a, b in spans:  # the copy's markers and generated text, moved here
                    self._record.mark_control(max(a, child.origin_text_len) + shift, b + shift)
            for message in child.messages[child.origin_messages_len :]:
                self._record.add_message(message["role"], message["content"])


def _token_text(backend: Backend) -> Callable[[int], str | None]:
    """token id -> its text through the backend's tokenizer (None where it has none, or an
    id is not its own, as an endpoint's unknown id -1)."""
    try:
        decode: Callable[[list[int]], str] = backend.tokenizer.decode
    except Exception:  # noqa: BLE001 - a backend without a tokenizer: no token texts
        return lambda _: None

    def text(token_id: int) -> str | None:
        if token_id < 0:
            return None
        try:
            return decode([token_id])
        except Exception:  # noqa: BLE001 - an id the tokenizer does not know
            return None

    return text


def _parse(node: Gen, result: GenerateResult) -> tuple[str, Parsed | None]:
    """The variable's value (always the text, as in SGLang) and what `parsed()` gives (a
    dtype's int/float/bool/str, a json_schema's value).

    A constrained gen cut short at max_tokens keeps its partial text as the value (as
    SGLang does; finish_reason "length" in its meta info); `parsed()` then raises. Output
    that does not parse although the gen finished is the backend's fault: ConstraintError.
    """
    if node.constraint is None:
        return result.text, None
    try:
        value = node.constraint.parse(result.text)
    except (TypeError, ValueError) as e:
        where = f"gen({node.name!r}, {node.constraint_spec})"
        if result.finish_reason == "length":
            return result.text, Parsed(
                error=f"{where} stopped at max_tokens (finish_reason 'length') before its "
                f"constraint was complete, so its text {result.text!r} does not parse; "
                "raise max_tokens"
            )
        raise ConstraintError(
            f"{where}: the output {result.text!r} does not parse: {result.message or e}"
        ) from e
    return result.text, _typed(node, result.text, value)


def _typed(node: Gen, text: str, value: Any) -> Parsed:
    """`parsed()` of a constrained gen whose text matched: the JSON value (an instance of the
    type given as json_schema: a pydantic model, a dataclass, an Enum member, a list of them...),
    else the constraint's value (a dtype's int/float/bool/str)."""
    if getattr(node.constraint, "kind", None) != "json_schema":
        return Parsed(value)
    try:
        if node.schema_class is None:
            return Parsed(json.loads(text))
        if hasattr(node.schema_class, "model_validate_json"):
            return Parsed(node.schema_class.model_validate_json(text))
        # the type's schema came from it; lazy: lmprog.fsm adds ~150 ms to `import lmprog`
        from lmprog.fsm.json_schema import type_adapter

        return Parsed(type_adapter(node.schema_class).validate_json(text))
    except ValueError as e:  # json's and pydantic's errors are ValueErrors
        return Parsed(
            error=f"gen({node.name!r}, json_schema) matched the schema's grammar but does not "
            f"validate as {getattr(node.schema_class, '__name__', 'JSON')}: {e}"
        )


def render_nodes(
    nodes: tuple[Node, ...], template: TemplateSource, allow_special_tokens: bool = False
) -> str:
    """The prompt that constant nodes (text, roles, scopes) render to, exactly as run."""
    record = StateRecord()
    executor = NodeExecutor(
        record, None, template, stream=False, allow_special_tokens=allow_special_tokens
    )
    for node in nodes:
        executor.execute(node, None)
    return executor._prompt()
