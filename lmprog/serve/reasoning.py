"""Reasoning models behind the server: a request's reasoning format, constraint after thinking,
budget and output split.

    plan = reasoning_plan(ctx.reasoning, prompt, separate=True, budget=None)   # None: no reasoning
    constraint = plan.constrain(answer_constraint)   # thinking, end marker, then the answer
    backend = plan.backend(ctx.backend, answer_constraint)   # with a budget: two calls
    reasoning, answer = plan.split(result.text)

The output splits into `reasoning_content` and `content`. Design: docs/design/server.md#reasoning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmprog.core.errors import ConstraintError
from lmprog.core.protocol import Backend
from lmprog.core.reasoning import ANSWER, PromptState, ReasoningFormat, ReasoningSplitter
from lmprog.core.thinking_budget import Budgeted, check_budget
from lmprog.fsm.thinking import answer_only, for_format

from .errors import APIError


@dataclass(frozen=True)
class ReasoningPlan:
    """fmt: the format; state: how the prompt left the block; budget: thinking tokens (None:
    no budget); separate: split the output (SGLang's separate_reasoning)."""

    fmt: ReasoningFormat
    state: PromptState
    budget: int | None = None
    separate: bool = True

    def constrain(
        self,
        answer: Any,
        param: str = "response_format",
        *,
        headed: bool = False,
        specials: Mapping[str, int] | None = None,
    ) -> Any:
        """The constraint of the whole output given the answer's (None: free text);
        `headed`: the answer writes its own message header (gpt-oss tool calls); `specials`:
        the markers the model's tokenizer has as special tokens, name -> id (taken as those
        ids: `fsm.thinking.after_thinking`)."""
        if answer is None or self.budget is not None:
            return None if self.budget is not None else answer
        try:
            return for_format(answer, self.fmt, self.state, headed=headed, specials=specials)
        except ConstraintError as exc:
            raise APIError(400, str(exc), param=param, code="invalid_constraint") from None

    def backend(
        self,
        backend: Backend,
        answer: Any,
        *,
        headed: bool = False,
        specials: Mapping[str, int] | None = None,
    ) -> Backend:
        """`backend`, or with a budget one whose generate runs the thinking and the answer
        as two calls (core.thinking_budget); `specials`: as `constrain`'s."""
        if self.budget is None:
            return backend
        if answer is not None:
            answer = answer_only(answer, self.fmt, headed=headed, specials=specials)
        budgeted = Budgeted(backend, self.fmt, self.state, self.budget, answer)
        return budgeted  # type: ignore[return-value]

    def split(self, text: str) -> tuple[str | None, str]:
        return self.fmt.split(text, self.state)

    def splitter(self) -> ReasoningSplitter:
        return self.fmt.splitter(self.state)


def reasoning_plan(
    fmt: ReasoningFormat | None,
    prompt: str,
    *,
    separate: bool | None = None,
    budget: Any = None,
    budget_param: str = "thinking_budget",
) -> ReasoningPlan | None:
    """The plan of a request whose rendered prompt is `prompt` (None: its output has no
    reasoning: the model has no format, or the template closed the block). A budget on a
    model without a reasoning format is a 400 naming it."""
    try:
        budget = check_budget(budget, budget_param)
    except ValueError as exc:
        raise APIError(400, str(exc), param=budget_param) from None
    if fmt is None:
        if budget is not None:
            raise APIError(
                400,
                f"{budget_param} needs a reasoning model: this server's model has no reasoning "
                "format (start the server with --reasoning-parser NAME if its template hides it)",
                param=budget_param,
            )
        return None
    state = fmt.prompt_state(prompt)
    if state == "closed":
        return None
    return ReasoningPlan(fmt, state, budget, separate is not False)


class OutputSplit:
    """One choice's streamed text, split: `feed(piece)` gives (reasoning, answer) pieces."""

    def __init__(self, plan: ReasoningPlan | None) -> None:
        self._splitter = plan.splitter() if plan is not None and plan.separate else None

    def feed(self, piece: str) -> tuple[str, str]:
        if self._splitter is None:
            return "", piece
        return _joined(self._splitter.feed(piece))

    def finish(self) -> tuple[str, str]:
        if self._splitter is None:
            return "", ""
        return _joined(self._splitter.finish())


def _joined(parts: list[tuple[str, str]]) -> tuple[str, str]:
    reasoning = "".join(t for k, t in parts if k != ANSWER)
    return reasoning, "".join(t for k, t in parts if k == ANSWER)


def reasoning_tokens(tokenizer: Any, reasoning: str | None) -> int:
    """Tokens of the reasoning text (0 without one, or without a tokenizer)."""
    if not reasoning or tokenizer is None:
        return 0
    try:
        return len(tokenizer.encode(reasoning, add_special_tokens=False))
    except TypeError:  # a tokenizer without the keyword
        return len(tokenizer.encode(reasoning))
