"""`separate_reasoning`: a reasoning model's gen as two variables, its thinking and its answer.

    s += lp.assistant(lp.separate_reasoning(lp.gen("answer", max_tokens=512), model_type="qwen3"))
    s["answer"]                      # the answer; the state's text holds only the answer
    s["answer_reasoning_content"]    # the thinking (SGLang's name for it)

The gen's constraint applies to the answer only, after free thinking; `thinking_budget`
forces the end marker. Design: docs/design/reasoning.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lmprog.core.reasoning import PromptState, ReasoningFormat, named_format, reasoning_format
from lmprog.core.thinking_budget import check_budget
from lmprog.lang.ir import Concat, Expr, Gen, Select

if TYPE_CHECKING:
    from lmprog.fsm import Constraint

SUFFIX = "_reasoning_content"


@dataclass(frozen=True)
class Reasoning:
    """How a gen's output splits: `model_type` (None: from the chat template) and the
    thinking `budget` (None: none)."""

    model_type: str | None = None
    budget: int | None = None

    def format(self, template_source: str | None) -> ReasoningFormat:
        """The format of this gen's output; ValueError if the template shows none."""
        if self.model_type is not None:
            fmt = named_format(self.model_type)
        else:
            fmt = reasoning_format(template_source or "")
        if fmt is None:
            raise ValueError(
                "separate_reasoning: the model's chat template shows no reasoning format; "
                "name one with model_type= ('deepseek-r1', 'qwen3', 'gpt-oss', 'magistral')"
            )
        return fmt

    @staticmethod
    def specials(fmt: ReasoningFormat, tokenizer: object | None) -> dict[str, int]:
        """The markers of `fmt` that `tokenizer` (the backend's; None: an endpoint without
        one) has as special tokens, name -> id: the constraint takes them as those ids, as
        the model writes them (gpt-oss's `<|channel|>`, `<|end|>`), as the server's do."""
        if tokenizer is None or not fmt.marked_by_special_tokens(tokenizer):
            return {}
        from lmprog.fsm.compose import special_markers  # lazy: lmprog.fsm adds ~150 ms

        return special_markers(tokenizer, fmt.marker_texts)

    @staticmethod
    def constrain(
        answer: Constraint | None,
        fmt: ReasoningFormat,
        state: PromptState,
        specials: Mapping[str, int] | None = None,
    ) -> Constraint | None:
        """The constraint of the whole output given the answer's (None: free text);
        `specials`: the markers taken as special tokens (`specials`)."""
        if answer is None or state == "closed":
            return answer
        from lmprog.fsm.thinking import for_format  # lazy: lmprog.fsm adds ~150 ms to import

        return for_format(answer, fmt, state, specials=specials)

    @staticmethod
    def answer(
        answer: Constraint | None,
        fmt: ReasoningFormat,
        specials: Mapping[str, int] | None = None,
    ) -> Constraint | None:
        """The answer's constraint after a budget's forced end marker (None: free text)."""
        if answer is None:
            return None
        from lmprog.fsm.thinking import answer_only  # lazy, as above

        return answer_only(answer, fmt, specials=specials)


def reasoning_name(name: str) -> str:
    """The variable holding the thinking of gen `name`."""
    return name + SUFFIX


def separate_reasoning(
    expr: Expr, model_type: str | None = None, *, thinking_budget: int | None = None
) -> Expr:
    """A reasoning model's gen (or select, or a role holding them) with its thinking kept
    apart, as SGLang's `separate_reasoning`:

        s += lp.assistant(lp.separate_reasoning(lp.gen("answer", max_tokens=512)))
        s["answer"]                       # the answer; the state's text keeps only the answer
        s["answer_reasoning_content"]     # the thinking

    `model_type`: how the output splits, "deepseek-r1" (`<think>`; thinking even without the
    start marker), "qwen3" (`<think>` when the model writes it), "magistral" (`[THINK]`),
    "gpt-oss" (its analysis channel), or SGLang's/vLLM's names for them; None: the format
    the chat template shows (ValueError at run time if it shows none).

    Beyond SGLang: the gen's constraint (regex, json_schema, ebnf, dtype, choices; a
    select becomes a gen constrained to its choices) applies to the answer only, after free
    thinking and the end marker (one grammar: the marker is reachable at every token);
    `thinking_budget=N` forces the end marker after N thinking tokens (two backend calls
    over one cached prefix), then the answer; with `stream=True` both variables stream
    (`text_iter("answer_reasoning_content")`, `text_iter("answer")`). At the start of an
    assistant message the gen gets the template's generation prompt, so a template that
    opens a block there (DeepSeek-R1's distills) or renders answers with an empty one
    (Qwen3) leaves the model free to think; thinking switched off where the template
    supports it (`run(..., chat_template_kwargs={"enable_thinking": False})`, or on
    `lp.function`) leaves the whole output to the answer. TypeError for an expression
    without a gen or select, ValueError for an unknown model_type or a negative budget."""
    if model_type is not None:
        named_format(model_type)  # an unknown name fails here
    budget = check_budget(thinking_budget)
    spec = Reasoning(model_type, budget)
    out = _with(expr, spec)
    if out is None:
        raise TypeError(
            "separate_reasoning() takes a gen or a select (or a role holding them), got "
            f"{type(expr).__name__}"
        )
    return out


def _with(expr: object, spec: Reasoning) -> Expr | None:
    if isinstance(expr, Gen):
        if expr.name is None:
            raise ValueError("separate_reasoning() needs a named gen: gen('answer', ...)")
        return Gen(
            expr.name,
            expr.overrides,
            expr.constraint,
            expr.constraint_spec,
            expr.schema_class,
            reasoning=spec,
        )
    if isinstance(expr, Select):  # think, then write one of the choices
        from lmprog.fsm import Constraint  # lazy: lmprog.fsm adds ~150 ms to `import lmprog`

        return Gen(
            expr.name,
            (),
            Constraint.from_choices(list(expr.choices)),
            "choices",
            reasoning=spec,
        )
    if isinstance(expr, Concat):
        parts = [_with(p, spec) if isinstance(p, (Gen, Select)) else p for p in expr.parts]
        if all(p is q for p, q in zip(parts, expr.parts, strict=True)):
            return None
        return Concat(tuple(parts))  # type: ignore[arg-type]
    return None
