"""Placement of requests on replicas of unequal speed: each goes where it is expected to
complete first.

    p = Placement(3, policy="capacity")
    i = p.choose(work=Work(prompt_tokens=120, max_tokens=64))   # a replica index
    t = p.start(i, work)                                        # outstanding there
    p.finish(t, completion_tokens=57)                           # measured: capacity

Policies: "capacity" (expected completion time from each replica's measured capacity),
"least_outstanding", "round_robin"; unavailable replicas are skipped. Torch-free,
thread-safe. Design (issue 35, section 2; HeteroServe's idea): docs/design/foundations.md.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lmprog.core.errors import BackendError

POLICIES = ("capacity", "least_outstanding", "round_robin")
PREFILL_RATIO = 8.0
EWMA = 0.2  # weight of the newest measurement


@dataclass(frozen=True)
class Work:
    """What a request asks: its prompt's tokens (estimated for a text prompt) and at most
    max_tokens out."""

    prompt_tokens: int
    max_tokens: int


@dataclass
class Ticket:
    """One request outstanding on a replica."""

    replica: int
    work: Work
    expected: float  # decode-token equivalents
    started: float = field(default_factory=time.monotonic)
    progress: float = 0.0  # work done so far (streamed tokens)
    last_progress: float = field(default_factory=time.monotonic)


@dataclass
class _Replica:
    outstanding: list[Ticket] = field(default_factory=list)
    capacity: float | None = None  # measured work per busy second
    reported: float | None = None  # what the replica says of itself
    cost: float = 1.0
    finished: int = 0
    busy_since: float | None = None
    busy_s: float = 0.0  # busy time since the last measurement
    work_done: float = 0.0  # work finished since the last measurement
    available: bool = True
    last_progress: float = field(default_factory=time.monotonic)  # a token or an end


class Placement:
    def __init__(
        self,
        num_replicas: int,
        policy: str = "capacity",
        *,
        costs: Sequence[float] | None = None,
        prefill_ratio: float = PREFILL_RATIO,
        warmup: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if num_replicas < 1:
            raise ValueError(f"need at least one replica, got {num_replicas}")
        if not prefill_ratio > 0:
            raise ValueError(f"prefill_ratio must be > 0, got {prefill_ratio!r}")
        self.policy = policy
        self.clock = clock  # seconds; a simulation passes its own
        self.prefill_ratio = float(prefill_ratio)
        self.warmup = warmup
        self.replicas = [_Replica() for _ in range(num_replicas)]
        for r, c in zip(self.replicas, costs or [1.0] * num_replicas):
            if not c > 0:
                raise ValueError(f"costs must be > 0, got {c!r}")
            r.cost = float(c)
        self.completion_ratio = 1.0  # mean completion_tokens / max_tokens, learned
        self._rr = itertools.count()
        self._lock = threading.Lock()

    # ---- choosing --------------------------------------------------------------------------
    def expected(self, work: Work) -> float:
        """The decode-token equivalents a request is expected to cost."""
        decode = work.max_tokens * self.completion_ratio
        return decode + work.prompt_tokens / self.prefill_ratio

    def choose(self, work: Work, exclude: Sequence[int] = ()) -> int:
        with self._lock:
            live = [i for i, r in enumerate(self.replicas) if r.available and i not in exclude]
            if not live:
                down = sum(not r.available for r in self.replicas)
                raise BackendError(
                    f"no replica can take the request: {down} of {len(self.replicas)} are out "
                    "of rotation" + (f", {len(exclude)} already failed it" if exclude else "")
                )
            if self.policy == "round_robin":
                n = len(self.replicas)
                for _ in range(n):
                    i = next(self._rr) % n
                    if i in live:
                        return i
            if self.policy == "least_outstanding":
                return min(live, key=lambda i: (len(self.replicas[i].outstanding), i))
            new = self.expected(work)
            return min(live, key=lambda i: (self._finish_time(i, new), i))

    def _finish_time(self, i: int, new: float) -> float:
        r = self.replicas[i]
        queued = sum(max(t.expected - t.progress, 0.0) for t in r.outstanding)
        return (queued + new) / self._capacity(i) * r.cost

    def _capacity(self, i: int) -> float:
        r = self.replicas[i]
        if r.capacity is not None and r.finished >= self.warmup:
            return r.capacity
        if r.reported:
            return r.reported
        known = [
            x.capacity
            for x in self.replicas
            if x.capacity is not None and x.finished >= self.warmup
        ]
        if known:
            return sum(known) / len(known)
        return r.capacity or 1.0

    # ---- bookkeeping -----------------------------------------------------------------------
    def start(self, replica: int, work: Work) -> Ticket:
        with self._lock:
            r = self.replicas[replica]
            now = self.clock()
            if not r.outstanding:
                r.busy_since = now
                r.last_progress = now
            ticket = Ticket(replica, work, self.expected(work), now, 0.0, now)
            r.outstanding.append(ticket)
            return ticket

    def progress(self, ticket: Ticket, tokens: float) -> None:
        """`tokens` more came out of the request (streamed)."""
        ticket.progress += tokens
        ticket.last_progress = self.replicas[ticket.replica].last_progress = self.clock()

    def touch(self, replica: int) -> None:
        """`replica` was seen making progress (e.g. its generated-token count grew)."""
        self.replicas[replica].last_progress = self.clock()

    def last_progress(self, replica: int) -> float:
        """When a request on `replica` last made progress (or the replica became busy)."""
        return self.replicas[replica].last_progress

    def finish(self, ticket: Ticket, completion_tokens: int | None = None) -> None:
        """The request ended; with completion_tokens (it succeeded) it is measured."""
        with self._lock:
            r = self.replicas[ticket.replica]
            if ticket not in r.outstanding:
                return
            r.outstanding.remove(ticket)
            now = self.clock()
            r.last_progress = now
            if r.busy_since is not None:
                r.busy_s += now - r.busy_since
                r.busy_since = now if r.outstanding else None
            if completion_tokens is None:
                return
            work = completion_tokens + ticket.work.prompt_tokens / self.prefill_ratio
            r.work_done += work
            r.finished += 1
            if ticket.work.max_tokens > 0:
                ratio = min(completion_tokens / ticket.work.max_tokens, 1.0)
                self.completion_ratio += EWMA * (ratio - self.completion_ratio)
            if r.busy_s > 0.05:  # a measurement: work over the busy time it took
                rate = r.work_done / r.busy_s
                r.capacity = rate if r.capacity is None else r.capacity + EWMA * (rate - r.capacity)
                r.work_done = r.busy_s = 0.0

    def set_available(self, replica: int, available: bool) -> None:
        with self._lock:
            self.replicas[replica].available = available

    def report(self, replica: int, capacity: float | None) -> None:
        """What the replica says its capacity is (e.g. its gen_tokens_per_s)."""
        with self._lock:
            self.replicas[replica].reported = capacity if capacity and capacity > 0 else None

    def stats(self) -> list[dict[str, float | int | bool | None]]:
        with self._lock:
            return [
                {
                    "available": r.available,
                    "outstanding": len(r.outstanding),
                    "capacity": r.capacity,
                    "reported_capacity": r.reported,
                    "cost": r.cost,
                    "finished": r.finished,
                }
                for r in self.replicas
            ]
