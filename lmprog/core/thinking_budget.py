"""A thinking budget: after N thinking tokens the end marker is forced, then the answer.

    result = generate_thinking(backend, request, fmt=fmt, state="open", budget=256,
                               answer=constraint_or_None, stream=callback)

Two backend calls over one prefix: the thinking (at most min(budget, max_tokens) tokens,
stopped at the end marker), then the answer after the end marker, under its constraint. The
result's text reads as the model's output would; a token-id prompt is refused.
Design: docs/design/reasoning.md.
"""

from __future__ import annotations

import dataclasses

from lmprog.core.prompt import extend_control
from lmprog.core.protocol import Backend, GenerateRequest, GenerateResult, StreamCallback
from lmprog.core.reasoning import PromptState, ReasoningFormat


def check_budget(budget: object, name: str = "thinking_budget") -> int | None:
    """`budget` as a token count (None: no budget); ValueError naming `name` otherwise."""
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"{name} must be an integer >= 0 (thinking tokens), got {budget!r}")
    return budget


def generate_thinking(
    backend: Backend,
    request: GenerateRequest,
    *,
    fmt: ReasoningFormat,
    state: PromptState,
    budget: int,
    answer: object = None,
    stream: StreamCallback | None = None,
) -> GenerateResult:
    """The output of `request` with its thinking held to `budget` tokens
    (docs/design/reasoning.md); `answer`: the constraint of the answer (None: free text)."""
    if not isinstance(request.prompt, str):
        raise ValueError("a thinking budget needs a text prompt, not token ids")
    params = request.params
    opener = fmt.start + "\n" if state == "none" and fmt.start else ""
    first_prompt = extend_control(request.prompt, opener)
    first = GenerateRequest(
        first_prompt,
        dataclasses.replace(
            params, max_tokens=min(budget, params.max_tokens), stop=(fmt.end,), min_tokens=0
        ),
        images=request.images,
    )
    if stream is not None and opener:
        stream(opener)
    if budget == 0:  # no thinking at all: the marker at once
        thought = GenerateResult("", (), "length", 0, 0)
    else:
        thought = backend.generate(first, stream=stream)
    cut_by_max_tokens = thought.finish_reason == "length" and params.max_tokens <= budget
    left = params.max_tokens - thought.completion_tokens
    if cut_by_max_tokens or left <= 0 or thought.finish_reason in ("abort", "error"):
        return dataclasses.replace(thought, text=opener + thought.text, matched_stop=None)
    if fmt.after_end:  # the next message's header follows the marker (gpt-oss)
        glue = fmt.end + fmt.after_end
    else:
        glue = ("" if thought.text[-1:].isspace() or not thought.text else "\n") + fmt.end
        glue += "\n\n"
    if stream is not None:
        stream(glue)
    second = GenerateRequest(
        extend_control(first_prompt, thought.text + glue),
        dataclasses.replace(
            params,
            max_tokens=left,
            min_tokens=max(0, params.min_tokens - thought.completion_tokens),
        ),
        answer,
        request.images,
    )
    said = backend.generate(second, stream=stream)
    logprobs = None
    if thought.logprobs is not None and said.logprobs is not None:
        logprobs = thought.logprobs + said.logprobs
    return dataclasses.replace(
        said,
        text=opener + thought.text + glue + said.text,
        token_ids=thought.token_ids + said.token_ids,
        prompt_tokens=thought.prompt_tokens if budget else said.prompt_tokens,
        completion_tokens=thought.completion_tokens + said.completion_tokens,
        cached_tokens=thought.cached_tokens if budget else said.cached_tokens,
        logprobs=logprobs,
    )


class Budgeted:
    """A view of `backend` whose `generate` holds the thinking to `budget` tokens
    (`generate_thinking`); what the server's choices and the DSL's gens call."""

    def __init__(
        self,
        backend: Backend,
        fmt: ReasoningFormat,
        state: PromptState,
        budget: int,
        answer: object = None,
    ) -> None:
        self._backend, self._fmt, self._state = backend, fmt, state
        self._budget, self._answer = budget, answer

    def generate(
        self, request: GenerateRequest, stream: StreamCallback | None = None
    ) -> GenerateResult:
        return generate_thinking(
            self._backend,
            request,
            fmt=self._fmt,
            state=self._state,
            budget=self._budget,
            answer=self._answer,
            stream=stream,
        )
