import pytest

import lmprog as lp
from lmprog.core.protocol import ChoiceScore, ScoreResult


def scores(*choices, uncond=None):
    uncond = uncond or [None] * len(choices)
    return ScoreResult(
        tuple(
            ChoiceScore(tuple(lp_), tuple(range(len(lp_))), None if u is None else tuple(u))
            for lp_, u in zip(choices, uncond)
        ),
        prompt_tokens=10,
    )


def test_token_length_normalized_takes_the_best_mean():
    result = scores([-1.0, -1.0], [-0.5, -3.0], [-1.2])
    decision = lp.token_length_normalized.choose(result)
    assert decision.index == 0
    assert decision.scores == pytest.approx((-1.0, -1.75, -1.2))


def test_greedy_follows_the_first_diverging_token():
    result = scores([-0.1, -5.0], [-0.2, -0.1])
    assert lp.greedy_token_selection.choose(result).index == 0
    assert lp.token_length_normalized.choose(result).index == 1


def test_greedy_pads_a_shorter_choice_with_its_mean():
    # Equal first tokens; the short choice competes with its mean (-1.0) at position 1.
    assert lp.greedy_token_selection.choose(scores([-1.0], [-1.0, -0.5])).index == 1
    assert lp.greedy_token_selection.choose(scores([-1.0], [-1.0, -1.5])).index == 0


def test_unconditional_subtracts_the_context_free_likelihood():
    result = scores([-1.0], [-2.0], uncond=[[-0.5], [-3.0]])
    decision = lp.unconditional_likelihood_normalized.choose(result)
    assert decision.index == 1
    assert decision.scores == pytest.approx((-0.5, 1.0))
    assert lp.unconditional_likelihood_normalized.needs_unconditional
    assert not lp.token_length_normalized.needs_unconditional


def test_unconditional_needs_unconditional_scores():
    with pytest.raises(ValueError, match="unconditional"):
        lp.unconditional_likelihood_normalized.choose(scores([-1.0], [-2.0]))


@pytest.mark.parametrize("method", [lp.token_length_normalized, lp.greedy_token_selection])
def test_ties_go_to_the_first_choice(method):
    assert method.choose(scores([-1.0, -2.0], [-1.0, -2.0], [-1.5, -1.5])).index == 0


def test_a_choice_without_tokens_is_an_error():
    with pytest.raises(ValueError, match="no tokens"):
        lp.token_length_normalized.choose(scores([-1.0], []))
