"""Per-step budget and the admission reserve. Plain data, no imports from the package."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepBudget:
    """What one step may still take: tokens fed to the model and newly admitted requests.

    Policies call take(); nothing else mutates it. A fresh one is made every step.
    """

    tokens: int
    new_reqs: int

    def take(self, num_tokens: int, new_req: bool = False) -> None:
        assert 0 <= num_tokens <= self.tokens, f"took {num_tokens} of {self.tokens} tokens"
        assert not new_req or self.new_reqs > 0, "no request slot left this step"
        self.tokens -= num_tokens
        self.new_reqs -= new_req


class NewTokenRatio:
    """Which fraction of the running requests' remaining max_tokens admission keeps free.

    Optimistic over time (decays each step toward `minimum`), pessimistic right after a
    retraction (back to `initial`): a retraction means admission was too generous.
    """

    def __init__(self, initial: float, minimum: float, decay: float) -> None:
        self.initial, self.minimum, self.decay = initial, minimum, decay
        self.value = initial

    def step(self) -> None:
        self.value = max(self.minimum, self.value - self.decay)

    def on_retract(self) -> None:
        self.value = self.initial

    def reserve(self, remaining_tokens: int, clip: int) -> int:
        """Slots to keep for one request that may still generate remaining_tokens."""
        return int(self.value * min(remaining_tokens, clip) + 0.999999)
