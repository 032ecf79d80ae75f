"""Select scoring with token healing, for the backends that tokenize here (llama.cpp and the
runtime; the HTTP endpoints compare the server's own tokens instead).

Each choice is scored as `prompt + choice` tokenized as one text, from its first token that
differs from the prompt's own tokenization (a span); an unconditional score tokenizes the
choice alone after the start token (BOS, else EOS). Both backends then score every span in
one batch and hand the logprobs back here, spans first, unconditional twins after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lmprog.backends.state_cache import common_prefix_len
from lmprog.core.prompt import extend, user_text
from lmprog.core.protocol import ChoiceScore, ScoreRequest

Span = tuple[list[int], int]  # (tokens of the whole text, index of the first token to score)


def healed_span(prompt: list[int], tokens: list[int], start_id: int) -> Span:
    """The span of a text whose tokens are `tokens` after a prompt tokenized as `prompt`.
    With nothing to condition on (no common prefix) the start token is put first, unless
    the tokenizer put it there already (a BOS-adding one), and scoring starts after it."""
    start = common_prefix_len(prompt, tokens)
    if start == 0:
        if not tokens or tokens[0] != start_id:
            tokens = [start_id, *tokens]
        start = 1
    return tokens, start


def choice_spans(
    request: ScoreRequest, prompt: list[int], tokenize: Callable[[str], list[int]], start_id: int
) -> tuple[list[Span], list[Span]]:
    """Every choice's span after the prompt (its tokens `prompt`), and with
    request.unconditional every choice's span after the start token alone (else [])."""
    spans = [
        healed_span(prompt, tokenize(extend(request.prompt, c)), start_id) for c in request.choices
    ]
    if not request.unconditional:
        return spans, []
    free = [
        healed_span([], tokenize(user_text(request.prompt, c)), start_id) for c in request.choices
    ]
    return spans, free


def choice_scores(
    spans: list[Span], unconditional: list[Span], scored: Sequence[tuple[float, ...]]
) -> tuple[ChoiceScore, ...]:
    """The ChoiceScores from `scored`: the logprobs of spans + unconditional, in order."""
    free = scored[len(spans) :] if unconditional else None
    return tuple(
        ChoiceScore(
            token_logprobs=scored[i],
            token_ids=tuple(tokens[start:]),
            unconditional_token_logprobs=free[i] if free is not None else None,
        )
        for i, (tokens, start) in enumerate(spans)
    )
