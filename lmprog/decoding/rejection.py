"""The speculative-sampling acceptance rule (Leviathan et al. 2023; Chen et al. 2023):
accept draft d with probability min(1, p(d) / q(d)), else draw from the residual
(p - q)+, so every token is distributed exactly as p. For drafts with explicit q;
point-mass drafts (n-gram) are verified by the engine itself. Siblings of a token tree:
`sibling_rejection` (SpecInfer's multi-draft rule). Design: docs/design/speculative.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .rng import SeededGenerator, uniforms
from .sampler import draw


def rejection_sample(
    p: torch.Tensor,
    q: torch.Tensor,
    drafts: torch.Tensor,
    generators: Sequence[SeededGenerator | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the rule to each row.

    p, q: [B, V] probabilities (rows summing to 1); drafts: [B] int64, drafts[b] drawn from
    q[b] (so q[b, drafts[b]] > 0). generators: per-row seeded generators (None: torch's
    default RNG); each row consumes two uniforms, the acceptance test's then the residual
    draw's.
    Returns (tokens [B] int64, accepted [B] bool): tokens[b] == drafts[b] where accepted.
    """
    assert p.shape == q.shape and p.dim() == 2 and drafts.shape == (p.shape[0],)
    p, q = p.float(), q.float()
    u = uniforms(generators, p.shape[0], p.device)
    d = drafts[:, None]
    accepted = u * q.gather(1, d)[:, 0] < p.gather(1, d)[:, 0]  # u < p(d) / q(d)
    residual = (p - q).clamp_(min=0.0)
    empty = residual.sum(dim=-1, keepdim=True) <= 0  # p == q: rejection is (almost) impossible
    residual = torch.where(empty, p, residual)
    resampled = draw(residual, generators)
    return torch.where(accepted, drafts, resampled), accepted


def sibling_rejection(
    p: torch.Tensor,
    q: torch.Tensor,
    drafts: Sequence[int],
    generator: SeededGenerator | None = None,
) -> tuple[int, int]:
    """The rule over k alternatives for one position (SpecInfer's multi-step speculative
    sampling; EAGLE's tree verification): sibling j, drawn from q[j] independently of the
    others, is accepted with probability min(1, p_j(d_j) / q_j(d_j)), where p_0 = p and
    p_{j+1} = (p_j - q_j)+ normalised after a rejection; when all are rejected the token is
    drawn from the last residual. The token is distributed exactly as p.

    p: [V] probabilities; q: [k, V]; drafts: k ids (drafts[j] drawn from q[j]). generator:
    the row's seeded generator (None: torch's default RNG); one uniform per sibling (drawn
    together, before the first test), one more for the final draw when all are rejected. Returns (token, index of the accepted sibling or -1).
    A rejected token keeps probability 0 in every later residual, so it is never the
    outcome: the first sibling with the outcome's token is the accepted one."""
    assert q.dim() == 2 and q.shape[0] == len(drafts) and q.shape[1] == p.shape[-1]
    cur = p.float().reshape(-1)
    us = uniforms([generator] * len(drafts), len(drafts), cur.device).tolist()
    for j, (d, u) in enumerate(zip(drafts, us)):
        qj = q[j].float()
        if u * float(qj[d]) < float(cur[d]):
            return int(d), j
        residual = (cur - qj).clamp_(min=0.0)
        total = float(residual.sum())
        if total > 0:  # else p_j == q_j: the rejection was (almost) impossible
            cur = residual / total
    return int(draw(cur[None], [generator])[0]), -1
