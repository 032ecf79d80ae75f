"""HeadProposer: a proposer that reads the target's hidden states (EAGLE-3, Medusa heads).

    capture = proposer.capture          # what every step hands over (models.llama.HiddenCapture)
    proposer.observe(rid, start, rows)  # rows[i]: the hidden state of token index start + i
    proposer.propose([...])             # as any Proposer

The engine runs steps with LlamaForCausalLM.forward_capture while one is installed and
speculation is on, and the Speculator hands each request's rows over right after the
forward (before sampling: rows are keyed by token index, so drafts the step rejects leave
rows that the next step's overwrite). Trees: `tree_nodes` builds the top-k expansion.
Design: docs/design/speculative.md.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Sequence

import torch

from ..draft_tree import ROOT
from ..models.llama import HiddenCapture
from .proposer import Proposal, Proposer


class HeadProposer(Proposer):
    """A Proposer fed with the target's hidden states. Engine thread only."""

    capture: HiddenCapture

    @abc.abstractmethod
    def observe(self, rid: Hashable, start: int, rows: torch.Tensor) -> None:
        """rows [m, features]: the hidden states (as `capture` asks) of request rid's tokens
        start .. start + m - 1, just computed by the target (a device tensor; no sync)."""


def tree_depth(nodes: int, width: int) -> int:
    """How many draft depths a proposal of at most `nodes` drafts uses: a chain's (width 1)
    every one, a tree's (tree_nodes, w per depth) ceil(nodes / w); the Speculator keeps the
    first `nodes` (in topological order), so deeper top-w candidates would go unverified."""
    return nodes if width <= 1 else -(-nodes // width)


def tree_nodes(top: list[list[int]], width: int) -> Proposal:
    """A Proposal from the top candidates of each draft depth (top[d]: best first, drafted
    along the top-1 path): width 1 gives the chain of top-1 tokens; width w > 1 a tree in
    which each depth's best token continues the path and the next w - 1 are its siblings
    (leaves), parents in topological order."""
    if width <= 1:
        return Proposal(tuple(t[0] for t in top))
    ids: list[int] = []
    parents: list[int] = []
    spine = -1
    for cands in top:
        first = len(ids)
        for t in cands[:width]:
            ids.append(t)
            parents.append(spine)
        spine = first
    return Proposal(tuple(ids), parents=tuple(parents))


def spine(proposal: Proposal) -> Proposal:
    """A tree's first path (from the root, each node's first child): the chain that today's
    verification checks; a chain is returned as it is."""
    if proposal.parents is None:
        return proposal
    chain: list[int] = []
    at = -1
    for i, p in enumerate(proposal.parents):
        if p == at:
            chain.append(i)
            at = i
    probs = None if proposal.probs is None else proposal.probs[chain]
    return Proposal(tuple(proposal.token_ids[i] for i in chain), probs)


class DynamicTree:
    """EAGLE-2's draft tree for one request, grown depth by depth on the host from the
    head's top-w candidates (ids with their log probabilities) of each expanded node:

        tree = DynamicTree(width)
        tree.add(-1, ids, logps)            # the root's top w: depth 0, all expanded next
        for depth in 1 .. D - 1:
            for i, node in enumerate(tree.frontier):   # fed to the head, masked by the tree
                tree.add(node, ids[i], logps[i])       # its top w children
            tree.advance()                  # the w new nodes of best cumulative score
        tree.proposal(budget)               # the best `budget` of all, ancestors closed

    A node's score is the sum of the log probabilities along its path (the product of its
    draft probabilities). Ties go to the node drafted first, so a parent (score >= its
    children's) always ranks before its children and the kept set is a tree."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.scores: list[float] = []
        self.frontier: list[int] = []  # the nodes the next depth expands (fed to the head)
        self._new: list[int] = []

    def add(self, parent: int, ids: Sequence[int], logps: Sequence[float]) -> None:
        base = 0.0 if parent == ROOT else self.scores[parent]
        for t, lp in zip(ids[: self.width], logps[: self.width]):
            self._new.append(len(self.tokens))
            self.tokens.append(int(t))
            self.parents.append(parent)
            self.scores.append(base + float(lp))
        if parent == ROOT:
            self.advance()

    def advance(self) -> None:
        """The next frontier: the best `width` of the nodes added since the last call."""
        self.frontier = sorted(self._best(self._new)[: self.width])
        self._new = []

    def _best(self, nodes: Sequence[int]) -> list[int]:
        return sorted(nodes, key=lambda i: (-self.scores[i], i))

    def proposal(self, budget: int) -> Proposal:
        kept = sorted(self._best(range(len(self.tokens)))[:budget])  # topological order
        index = {node: i for i, node in enumerate(kept)}
        parents = [ROOT if self.parents[i] == ROOT else index[self.parents[i]] for i in kept]
        return Proposal(tuple(self.tokens[i] for i in kept), parents=tuple(parents))

    def ancestors(self, node: int) -> list[int]:
        """node's path from the root, node included (root first)."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]
