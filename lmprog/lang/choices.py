"""How `select` picks a choice from the backend's per-token logprobs.

The backend scores every choice as a continuation of the prompt (with token healing) and
returns a `ScoreResult`; a `ChoicesMethod` turns that into the index of the winner. The
three methods are interchangeable values passed as `choices_method=`:

    lp.token_length_normalized           mean token logprob (the default)
    lp.greedy_token_selection            the choice that wins token by token
    lp.unconditional_likelihood_normalized
                                         mean logprob minus the choice's mean logprob
                                         without the context
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from lmprog.core.protocol import ScoreResult


@dataclass(frozen=True)
class ChoiceDecision:
    """The winning choice and the per-choice scores the method compared (higher wins)."""

    index: int
    scores: tuple[float, ...]


class ChoicesMethod(abc.ABC):
    """A strategy that picks one of the scored choices.

    Contract:
    - `choose` is a pure function of the `ScoreResult`: same scores, same index. It never
      mutates its input and is safe to call from many threads.
    - `result.choices[i]` scores choice i; every choice has at least one token.
    - Ties go to the earliest choice.
    - `needs_unconditional` is True when the method reads
      `ChoiceScore.unconditional_token_logprobs`; the interpreter then asks the backend for
      them (`ScoreRequest(unconditional=True)`), and `choose` raises ValueError if they
      are missing.
    """

    name: str = "choices_method"
    needs_unconditional: bool = False

    @abc.abstractmethod
    def choose(self, result: ScoreResult) -> ChoiceDecision:
        """The index of the chosen choice and the scores it was chosen by."""

    def meta_info(self, result: ScoreResult) -> dict[str, Any]:
        """The keys SGLang's method puts in a select's meta info beside its
        `normalized_prompt_logprobs` (each choice's mean token logprob): none here."""
        return {}

    def __repr__(self) -> str:
        return f"lp.{self.name}"


class TokenLengthNormalized(ChoicesMethod):
    """The choice with the highest mean token logprob.

    Normalising by length avoids penalising long choices, at the price of a bias toward
    long, predictable ones. Scores: each choice's mean token logprob.
    """

    name = "token_length_normalized"

    def choose(self, result: ScoreResult) -> ChoiceDecision:
        scores = tuple(_mean(c.token_logprobs, i) for i, c in enumerate(result.choices))
        return ChoiceDecision(_argmax(scores), scores)


class GreedyTokenSelection(ChoicesMethod):
    """The choice that wins position by position, like greedy decoding would pick it.

    At each token position, keep the choices whose logprob there is the highest; stop when
    one remains. A choice shorter than the longest is padded with its own mean logprob, so
    a prefix of a longer choice competes fairly. Scores: each choice's mean token logprob
    (for inspection; the decision is the positional elimination).
    """

    name = "greedy_token_selection"

    def choose(self, result: ScoreResult) -> ChoiceDecision:
        means = tuple(_mean(c.token_logprobs, i) for i, c in enumerate(result.choices))
        rows, width = _padded_rows(result), max(len(c.token_logprobs) for c in result.choices)
        remaining = list(range(len(rows)))
        for j in range(width):
            best = max(rows[i][j] for i in remaining)
            remaining = [i for i in remaining if rows[i][j] == best]
            if len(remaining) == 1:
                break
        return ChoiceDecision(remaining[0], means)

    def meta_info(self, result: ScoreResult) -> dict[str, Any]:
        """SGLang's `greedy_logprob_matrix`: the rows compared, padded with their means."""
        return {"greedy_logprob_matrix": _padded_rows(result)}


class UnconditionalLikelihoodNormalized(ChoicesMethod):
    """The choice whose likelihood rises most because of the context.

    Score = mean token logprob given the prompt minus the mean token logprob of the choice
    on its own (no context), which cancels how likely a choice is a priori.
    """

    name = "unconditional_likelihood_normalized"
    needs_unconditional = True

    def choose(self, result: ScoreResult) -> ChoiceDecision:
        scores = []
        for i, c in enumerate(result.choices):
            if c.unconditional_token_logprobs is None:
                raise ValueError(
                    f"{self.name} needs unconditional logprobs but the backend returned none "
                    f"for choice {i}"
                )
            scores.append(_mean(c.token_logprobs, i) - _mean(c.unconditional_token_logprobs, i))
        return ChoiceDecision(_argmax(scores), tuple(scores))

    def meta_info(self, result: ScoreResult) -> dict[str, Any]:
        """SGLang's `unconditional_token_logprobs` ([logprob, None, None] entries) and
        `normalized_unconditional_prompt_logprobs` (the scores)."""
        return {
            "unconditional_token_logprobs": [
                [[lp, None, None] for lp in c.unconditional_token_logprobs or ()]
                for c in result.choices
            ],
            "normalized_unconditional_prompt_logprobs": list(self.choose(result).scores),
        }


def _padded_rows(result: ScoreResult) -> list[list[float]]:
    """Each choice's token logprobs, padded to the longest with the choice's own mean."""
    width = max(len(c.token_logprobs) for c in result.choices)
    return [
        list(c.token_logprobs) + [_mean(c.token_logprobs, i)] * (width - len(c.token_logprobs))
        for i, c in enumerate(result.choices)
    ]


def _mean(values: tuple[float, ...], index: int) -> float:
    if not values:
        raise ValueError(
            f"choice {index} was scored with no tokens; a backend must score at least one"
        )
    return sum(values) / len(values)


def _argmax(scores: tuple[float, ...] | list[float]) -> int:
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


token_length_normalized: ChoicesMethod = TokenLengthNormalized()
greedy_token_selection: ChoicesMethod = GreedyTokenSelection()
unconditional_likelihood_normalized: ChoicesMethod = UnconditionalLikelihoodNormalized()
