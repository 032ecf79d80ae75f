"""NgramProposer: prompt-lookup drafts, no model (Saxena 2023; vLLM's "ngram" proposer).

Drafts are what followed the latest earlier occurrence of the sequence's last n tokens
(n from ngram_max down to ngram_min). With branches > 1 the continuations of several
earlier occurrences become one token tree (siblings where they differ). Stateless. Design:
docs/design/speculative.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..draft_tree import is_chain
from .proposer import Proposal, ProposalInput, Proposer

_EMPTY = Proposal(())


class NgramProposer(Proposer):
    """Deterministic drafts (probs=None): acceptance compares them with what the target
    samples, so the output distribution is exactly the target's."""

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4, branches: int = 1) -> None:
        """branches: how many different continuations (of different earlier occurrences) a
        proposal may hold; > 1 makes token trees (`lookup_tree`)."""
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
            raise ValueError(f"branches must be an int >= 1, got {branches!r}")
        self.ngram_min, self.ngram_max, self.branches = ngram_min, ngram_max, branches

    def propose(self, inputs: Sequence[ProposalInput]) -> list[Proposal]:
        return [self._one(inp) for inp in inputs]

    def _one(self, inp: ProposalInput) -> Proposal:
        if inp.max_tokens < 1 or len(inp.token_ids) < 2:
            return _EMPTY
        tokens = np.asarray(inp.token_ids, dtype=np.int64)
        if self.branches > 1:
            ids, parents = lookup_tree(
                tokens, self.ngram_min, self.ngram_max, inp.max_tokens, self.branches
            )
            if not ids:
                return _EMPTY
            return Proposal(tuple(ids), parents=None if is_chain(parents) else tuple(parents))
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


def lookup_tree(
    tokens: np.ndarray, n_min: int, n_max: int, k: int, branches: int
) -> tuple[list[int], list[int]]:
    """At most k draft tokens as a tree (ids, parents; runtime/draft_tree.py): the
    continuations of up to `branches` earlier occurrences of the sequence's suffix, longest
    suffix first, latest occurrence first (as `lookup` picks its one), merged where they
    agree. The first (lookup's own continuation) is the tree's first branch and takes what
    the others leave of k; each other keeps max(1, k // (2 * (branches - 1))) tokens past
    where it parts from the earlier ones."""
    conts = _continuations(tokens, n_min, n_max, k, branches)
    if not conts:
        return [], []
    short = max(1, k // (2 * max(1, len(conts) - 1)))
    others = [c[: max(_common(c, e) for e in conts[:i]) + short] for i, c in enumerate(conts) if i]
    primary = conts[0]
    while others:
        # the first branch keeps at least its token where the others part from it
        least = min(len(primary), k, max(_common(primary, c) for c in others) + 1)
        for first in range(min(k, len(primary)), least - 1, -1):
            ids, parents = _trie([primary[:first], *others])
            if len(ids) <= k:
                return ids, parents
        others.pop()  # the least likely alternative goes
    return primary[:k], list(range(-1, min(k, len(primary)) - 1))


def _continuations(
    tokens: np.ndarray, n_min: int, n_max: int, k: int, branches: int
) -> list[list[int]]:
    """Up to `branches` different k-token continuations, best first (see lookup_tree)."""
    length, out = len(tokens), []
    seen: set[tuple[int, ...]] = set()
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        starts = _matches(tokens, n)
        for start in starts[::-1][: 4 * branches]:  # latest first; a bounded look back
            period = length - n - int(start)
            cont = tuple(tokens[start + n + np.arange(k) % period].tolist())
            if cont not in seen:
                seen.add(cont)
                out.append(list(cont))
                if len(out) == branches:
                    return out
    return out


def _common(a: list[int], b: list[int]) -> int:
    """The length of the common prefix of a and b."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _trie(seqs: list[list[int]]) -> tuple[list[int], list[int]]:
    """seqs merged into one tree (shared prefixes once), nodes in insertion order (a parent
    before its children)."""
    ids: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}
    for seq in seqs:
        node = -1
        for t in seq:
            child = index.get((node, t))
            if child is None:
                child = index[(node, t)] = len(ids)
                ids.append(t)
                parents.append(node)
            node = child
    return ids, parents


def _matches(tokens: np.ndarray, n: int) -> np.ndarray:
    """Every i < len - n with tokens[i:i+n] == tokens[-n:], ascending."""
    length = len(tokens)
    suffix = tokens[length - n :]
    # candidate starts i in [0, length - n - 1]: their last token sits at i + n - 1
    starts = np.flatnonzero(tokens[n - 1 : length - 1] == suffix[-1])
    for j in range(n - 1):  # check the other positions, pruning as we go
        if not len(starts):
            break
        starts = starts[tokens[starts + j] == suffix[j]]
    return starts


def _latest_match(tokens: np.ndarray, n: int) -> int:
    """The largest i < len - n with tokens[i:i+n] == tokens[-n:], or -1."""
    starts = _matches(tokens, n)
    return int(starts[-1]) if len(starts) else -1
