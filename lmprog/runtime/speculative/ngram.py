"""NgramProposer: prompt-lookup drafts, no model (Saxena 2023; vLLM's "ngram" proposer).

Drafts are what followed the latest earlier occurrence of the sequence's last n tokens
(n from ngram_max down to ngram_min). Stateless. Design: docs/design/speculative.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .proposer import Proposal, ProposalInput, Proposer

_EMPTY = Proposal(())


class NgramProposer(Proposer):
    """Deterministic drafts (probs=None): acceptance compares them with what the target
    samples, so the output distribution is exactly the target's."""

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def propose(self, inputs: Sequence[ProposalInput]) -> list[Proposal]:
        return [self._one(inp) for inp in inputs]

    def _one(self, inp: ProposalInput) -> Proposal:
        if inp.max_tokens < 1 or len(inp.token_ids) < 2:
            return _EMPTY
        tokens = np.asarray(inp.token_ids, dtype=np.int64)
        drafts = lookup(tokens, self.ngram_min, self.ngram_max, inp.max_tokens)
        return Proposal(tuple(drafts.tolist())) if len(drafts) else _EMPTY


def lookup(tokens: np.ndarray, n_min: int, n_max: int, k: int) -> np.ndarray:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix of
    `tokens` of n_min..n_max tokens; empty when no such suffix occurs earlier."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        start = _latest_match(tokens, n)
        if start >= 0:
            # A copy that runs into the end continues with what it is copying: the span
            # from the match to the suffix repeats with period (length - n - start).
            period = length - n - start
            return tokens[start + n + np.arange(k) % period]
    return tokens[:0]


def _latest_match(tokens: np.ndarray, n: int) -> int:
    """The largest i < len - n with tokens[i:i+n] == tokens[-n:], or -1."""
    length = len(tokens)
    suffix = tokens[length - n :]
    # candidate starts i in [0, length - n - 1]: their last token sits at i + n - 1
    starts = np.flatnonzero(tokens[n - 1 : length - 1] == suffix[-1])
    for j in range(n - 1):  # check the other positions, pruning as we go
        if not len(starts):
            return -1
        starts = starts[tokens[starts + j] == suffix[j]]
    return int(starts[-1]) if len(starts) else -1
