"""MedusaProposer: Medusa heads draft from the target's last hidden state.

The target's own head turned the hidden state of token n - 2 into token n - 1 (the one not
fed yet); Medusa head i reads the same hidden state and predicts token n + i, so one call
of the heads gives a whole chain (or, tree_width > 1, the top-w tokens of every depth: see
head_proposer.tree_nodes). The engine hands over the final norm's output at the rows it
computes logits for; the proposer keeps each request's latest rows, keyed by token index.
Design: docs/design/speculative.md.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch

from ..models.llama import HiddenCapture
from .draft import _checked_tokens
from .head_proposer import HeadProposer, tree_depth, tree_nodes
from .heads import MedusaHeads
from .proposer import Proposal, ProposalInput

_EMPTY = Proposal(())


class MedusaProposer(HeadProposer):
    """Drafts with `heads` (MedusaHeads on the target's device, of the target's vocabulary
    and hidden size): at most heads.num_heads drafts per request and call."""

    capture = HiddenCapture(())

    def __init__(
        self, heads: MedusaHeads, *, vocab_size: int, tree_width: int = 1, max_states: int = 256
    ) -> None:
        if heads.vocab_size != vocab_size:
            raise ValueError(
                f"the Medusa heads predict {heads.vocab_size} tokens, the target has {vocab_size}"
            )
        self.heads, self.vocab_size, self.tree_width = heads, vocab_size, tree_width
        self.max_states = max_states
        self._rows: OrderedDict[Hashable, tuple[int, torch.Tensor]] = OrderedDict()
        self.num_proposed = 0
        self.num_skipped = 0

    def observe(self, rid: Hashable, start: int, rows: torch.Tensor) -> None:
        self._rows[rid] = (start, rows)
        self._rows.move_to_end(rid)
        while len(self._rows) > self.max_states:
            self._rows.popitem(last=False)

    def propose(self, inputs: Sequence[ProposalInput]) -> list[Proposal]:
        wanted: list[tuple[int, torch.Tensor, int]] = []  # (input index, hidden row, k)
        for i, inp in enumerate(inputs):
            n = len(_checked_tokens(inp))
            start, rows = self._rows.get(inp.rid, (0, None))
            at = n - 2 - start  # the row of token n - 2 (after a jump-forward: none)
            if rows is None or not 0 <= at < len(rows):
                self.num_skipped += 1
                continue
            heads = tree_depth(inp.max_tokens, self.tree_width)  # a tree of max_tokens nodes
            wanted.append((i, rows[at], min(heads, self.heads.num_heads)))
        out = [_EMPTY] * len(inputs)
        if not wanted:
            return out
        depth = max(k for _, _, k in wanted)
        with torch.inference_mode():
            logits = self.heads(torch.stack([h for _, h, _ in wanted]), depth)  # [d, B, V]
            w = min(self.tree_width, logits.shape[-1])
            top = logits.topk(w, dim=-1).indices.permute(1, 0, 2).tolist()  # [B, d, w]
        for (i, _, k), cands in zip(wanted, top):
            out[i] = tree_nodes(cands[:k], self.tree_width)
        self.num_proposed += sum(len(p.token_ids) for p in out)
        return out

    def release(self, rid: Hashable) -> None:
        self._rows.pop(rid, None)

    def stats(self) -> dict[str, int]:
        return {"draft_tokens_proposed": self.num_proposed, "draft_skipped": self.num_skipped}
