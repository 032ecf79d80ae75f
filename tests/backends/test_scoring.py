"""Token-healed choice spans (lmprog.backends.scoring), which llama.cpp and the runtime share:
over a toy tokenizer whose start token is 1 and that may add it itself (a BOS-adding one)."""

from __future__ import annotations

from lmprog.backends.scoring import choice_scores, choice_spans, healed_span
from lmprog.core.protocol import ScoreRequest

BOS = 1


def toy(add_bos: bool):
    """One token per character (its code point), BOS first when add_bos."""

    def tokenize(text: str) -> list[int]:
        return ([BOS] if add_bos else []) + [ord(c) for c in text]

    return tokenize


def test_a_span_starts_at_the_first_token_the_prompt_does_not_share():
    assert healed_span([7, 8], [7, 8, 9, 10], BOS) == ([7, 8, 9, 10], 2)
    assert healed_span([7, 8], [7, 5, 9], BOS) == ([7, 5, 9], 1)  # the boundary re-tokenized


def test_with_nothing_shared_the_start_token_comes_first_once():
    assert healed_span([], [9, 10], BOS) == ([BOS, 9, 10], 1)
    assert healed_span([], [], BOS) == ([BOS], 1)
    # a tokenizer that adds BOS itself: not a second one, and BOS is not a scored token
    assert healed_span([], [BOS, 9, 10], BOS) == ([BOS, 9, 10], 1)


def test_spans_and_scores_for_both_kinds_of_tokenizer():
    for add_bos in (False, True):
        tokenize = toy(add_bos)
        request = ScoreRequest(prompt="ab", choices=("c", "de"), unconditional=True)
        spans, free = choice_spans(request, tokenize("ab"), tokenize, BOS)
        assert [t[s:] for t, s in spans] == [[ord("c")], [ord("d"), ord("e")]]
        assert [t[:s] for t, s in free] == [[BOS], [BOS]]  # the start token alone, once
        assert [t[s:] for t, s in free] == [[ord("c")], [ord("d"), ord("e")]]
        scored = [(-1.0,), (-2.0, -3.0), (-4.0,), (-5.0, -6.0)]
        c, de = choice_scores(spans, free, scored)
        assert c.token_logprobs == (-1.0,) and c.unconditional_token_logprobs == (-4.0,)
        assert de.token_ids == (ord("d"), ord("e")) and de.unconditional_token_logprobs == (
            -5.0,
            -6.0,
        )
    spans, free = choice_spans(ScoreRequest(prompt="ab", choices=("c",)), [97, 98], toy(False), BOS)
    assert (
        free == [] and choice_scores(spans, free, [(-1.0,)])[0].unconditional_token_logprobs is None
    )
