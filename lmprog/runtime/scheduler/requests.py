"""RequestTable: which requests wait, which run, and lookup by rid. Owns no KV.

    submit ──> waiting ──admit──> running ──finish──> (gone)
                  ^                  │
                  └──── retract ─────┘        abort/finish also works from waiting

`waiting` stays in arrival order (retracted requests go back to their original place),
which is the first-come-first-served order; `running` is in admission order.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterator

from ..cache.base import require
from ..request import Req, ReqStatus


class RequestTable:
    def __init__(self) -> None:
        self.waiting: list[Req] = []
        self.running: dict[Hashable, Req] = {}
        self._by_rid: dict[Hashable, Req] = {}
        self._next_arrival = 0

    def __len__(self) -> int:
        return len(self._by_rid)

    def __contains__(self, rid: Hashable) -> bool:
        return rid in self._by_rid

    def get(self, rid: Hashable) -> Req | None:
        return self._by_rid.get(rid)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def all(self) -> list[Req]:
        """Every unfinished request, waiting or running."""
        return list(self._by_rid.values())

    def running_reqs(self) -> Iterator[Req]:
        return iter(self.running.values())

    def add(self, req: Req) -> None:
        """Queue a new request (status WAITING, arrival stamped)."""
        assert req.rid not in self._by_rid
        req.arrival = self._next_arrival
        self._next_arrival += 1
        req.status = ReqStatus.WAITING
        self._by_rid[req.rid] = req
        self.waiting.append(req)

    def start(self, req: Req) -> None:
        """waiting -> running."""
        self.waiting.remove(req)
        req.status = ReqStatus.RUNNING
        self.running[req.rid] = req

    def requeue(self, req: Req) -> None:
        """running -> waiting (status RETRACTED), at its arrival position."""
        del self.running[req.rid]
        req.status = ReqStatus.RETRACTED
        keys = [r.arrival for r in self.waiting]
        self.waiting.insert(bisect.bisect(keys, req.arrival), req)

    def clear(self) -> list[Req]:
        """Forget every request; returns them, waiting ones first, each in its order."""
        reqs = self.waiting + list(self.running.values())
        self.waiting, self.running, self._by_rid = [], {}, {}
        return reqs

    def remove(self, req: Req) -> None:
        """Forget req, waiting or running."""
        del self._by_rid[req.rid]
        if self.running.pop(req.rid, None) is None:
            self.waiting.remove(req)

    def check_integrity(self, max_running: int) -> list[Req]:
        """Raise IntegrityError unless every running request runs with a pending token and
        every waiting one waits holding no KV (and at most max_running run); return the
        running requests."""
        running = list(self.running.values())
        for req in running:
            require(req.status is ReqStatus.RUNNING, f"{req} is in the running set")
            require(req.num_computed < req.seq_len, f"{req}: no pending token")
        for req in self.waiting:
            require(
                req.status in (ReqStatus.WAITING, ReqStatus.RETRACTED),
                f"{req} is in the waiting queue",
            )
            require(
                req.row is None and req.last_node is None and not req.num_allocated,
                f"{req} waits but holds KV",
            )
        require(len(running) <= max_running, "too many running requests")
        return running
