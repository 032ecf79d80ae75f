"""The speculative-sampling acceptance rule (Leviathan et al. 2023; Chen et al. 2023).

A draft token d was drawn from the draft distribution q; p is the target's distribution at
the same position (after every sampling transform: see `lmprog.decoding.sampler.probabilities`).

    accept d           with probability min(1, p(d) / q(d))
    else draw x        from (p - q)+ / sum (p - q)+              (the "residual")

Either way the token is distributed exactly as p, whatever q is, so chaining the rule over
a draft chain (stopping at the first rejection, then drawing the bonus token from p after
a fully accepted chain) samples the target's sequence distribution.

A deterministic proposer (probs None, e.g. n-gram) is the point mass q = 1{d}: the rule then
becomes "draw x from p; accept d iff x == d", which is what the engine does for such drafts
(see lmprog.runtime.engine.step_outputs); this module serves drafts with explicit q.
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
