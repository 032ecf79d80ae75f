"""Per-step budget and the admission reserve. Plain data, no imports from the package."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepBudget:
    """What one step may still take: tokens fed to the model (and the vision encoder's work,
    counted in tokens) and newly admitted requests.

    Policies call take() and fit_images(); nothing else mutates it. A fresh one is made
    every step. image_room: the tokens an image can always count on in a step (the budget
    less a full set of decodes); `images`: the digests of the images encoded this step.
    """

    tokens: int
    new_reqs: int
    image_room: int = 0
    images: set[str] = field(default_factory=set)

    def take(self, num_tokens: int, new_req: bool = False) -> None:
        assert 0 <= num_tokens <= self.tokens, f"took {num_tokens} of {self.tokens} tokens"
        assert not new_req or self.new_reqs > 0, "no request slot left this step"
        self.tokens -= num_tokens
        self.new_reqs -= new_req

    def fit_images(self, runs: Sequence[Any], start: int, n: int) -> int:
        """The most of the n tokens fed from position `start` that fit with the vision
        encoder's work, which is taken from the budget here (take() then takes the tokens).

        The step encodes an image when it feeds one of its positions and the image has no
        embeddings yet (runtime.images.step_images): that costs its image-token count, once
        per image per step. A chunk stops before an image whose cost does not fit what is
        left; one larger than image_room (it might never fit beside the decodes) starts
        anyway as the step's first image, charged what is left. runs: the request's
        ImageRuns in order (start, end, positions, embeds, digest)."""
        cost = 0
        charged: list[str] = []
        for run in runs:
            first = max(run.start, start)  # a prefix hit may end inside the image run
            if run.end <= start or run.embeds is not None:
                continue  # fed already, or encoded by an earlier step
            if first >= start + n:
                break
            if run.digest in self.images or run.digest in charged:
                continue  # encoded once this step for every request that feeds it
            rows = len(run.positions)
            before = first - start + 1  # the chunk's tokens up to the image's first one
            if before + cost + rows > self.tokens:
                alone = not self.images and not charged and rows + 1 > self.image_room
                if not alone or before + cost > self.tokens:
                    n = first - start  # the chunk ends before the image; it starts later
                    break
                rows = self.tokens - before - cost
            charged.append(run.digest)
            cost += rows
            n = min(n, self.tokens - cost)
        self.images.update(charged)
        self.tokens -= cost
        return n


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
