"""Proposer: the interface every speculative-token source implements.

    propose([ProposalInput(rid, tokens, k), ...])  ->  [Proposal, ...]   (same order)
    release(rid)                                    the request ended or was retracted

A proposer sees each request's whole sequence every call and finds its own rollback point.
Design: docs/design/speculative.md.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from lmprog.core.sampling import SamplingParams

from ..draft_tree import check_parents


@dataclass(frozen=True)
class ProposalInput:
    """rid: the request; token_ids: prompt + outputs so far, the last one not yet fed to
    the target model (after a jump-forward, the forced tokens at the end neither: drafts
    continue after them); max_tokens: most draft tokens wanted (>= 1); params: the
    request's sampling parameters (None = greedy), for proposers that sample their drafts."""

    rid: Hashable
    token_ids: Sequence[int]
    max_tokens: int
    params: SamplingParams | None = None


@dataclass(frozen=True)
class Proposal:
    """token_ids: the draft chain (may be empty: nothing worth verifying).
    probs: None when the chain was chosen deterministically (acceptance then uses the target
    probability of each draft token); else a [len(token_ids), vocab] float tensor, row i the
    draft distribution token i was sampled from (rejection sampling needs it).
    parents: None for a chain; for a token tree, parents[i] is the index in token_ids of
    token i's parent, -1 for a child of the last token fed (parents[i] < i, so token_ids is
    in topological order; siblings are alternatives for the same position)."""

    token_ids: tuple[int, ...]
    probs: Any = None
    parents: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.parents is not None:
            object.__setattr__(self, "parents", check_parents(self.parents, len(self.token_ids)))


class Proposer(abc.ABC):
    """A source of draft tokens. Called only from the engine thread."""

    @abc.abstractmethod
    def propose(self, inputs: Sequence[ProposalInput]) -> list[Proposal]:
        """One Proposal per input, in order; each chain (or tree) at most `max_tokens`
        tokens."""

    def release(self, rid: Hashable) -> None:
        """Forget per-request state (default: none kept)."""
