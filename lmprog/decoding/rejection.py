"""The speculative-sampling acceptance rule (Leviathan et al. 2023; Chen et al. 2023):
accept draft d with probability min(1, p(d) / q(d)), else draw from the residual
(p - q)+, so every token is distributed exactly as p. For drafts with explicit q;
point-mass drafts (n-gram) are verified by the engine itself. Design:
docs/design/speculative.md.
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
