"""Retraction: a running request gives back its KV when the pool runs out, and which one."""

from __future__ import annotations

from collections.abc import Iterable

from ..cache.manager import CacheManager
from ..request import Req, ReqStatus
from .budget import NewTokenRatio
from .requests import RequestTable


class RetractPolicy:
    """Newest arrival first: the oldest requests keep going, so every request finishes
    (the oldest running one always fits the pool on its own). Counts retractions."""

    def __init__(self, cache: CacheManager, requests: RequestTable, ratio: NewTokenRatio) -> None:
        self.cache = cache
        self.requests = requests
        self.ratio = ratio
        self.num_retractions = 0  # since start

    def pick(self, running: Iterable[Req]) -> Req | None:
        return max(running, key=_arrival, default=None)

    def retract(self, req: Req) -> None:
        """Scheduler.retract: the contract is documented there."""
        if req.status is not ReqStatus.RUNNING:
            raise ValueError(
                f"only running requests can be retracted, {req.rid!r} is {req.status.value}"
            )
        self.cache.release(req, cache=True)
        self.requests.requeue(req)
        req.draft_ids, req.draft_parents = [], None
        req.num_retractions += 1
        self.num_retractions += 1
        self.ratio.on_retract()

    def retract_newest(self) -> Req:
        """Retract the newest running request (there must be one); return it."""
        victim = self.pick(self.requests.running_reqs())
        assert victim is not None
        self.retract(victim)
        return victim


def _arrival(req: Req) -> int:
    return req.arrival
