"""Retraction policy: which running request gives back its KV when the pool runs out."""

from __future__ import annotations

from collections.abc import Iterable

from ..request import Req


class RetractPolicy:
    """Newest arrival first: the oldest requests keep going, so every request finishes
    (the oldest running one always fits the pool on its own)."""

    def pick(self, running: Iterable[Req]) -> Req | None:
        return max(running, key=_arrival, default=None)


def _arrival(req: Req) -> int:
    return req.arrival
