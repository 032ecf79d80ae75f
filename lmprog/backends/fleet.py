"""lp.Fleet: one backend over several unlike ones: remote lmprog servers (lp.RuntimeEndpoint,
or their URLs), a GPU lp.Runtime, a CPU lp.LlamaCpp, in any mix.

    fleet = lp.Fleet(["http://a:8000", "http://b:8000", lp.LlamaCpp()], policy="capacity")
    program.run(backend=fleet)                       # each call goes to one member

Placement by expected completion time (or "least_outstanding", "round_robin"); a failed or
hung member's requests without output run again elsewhere. Design: docs/design/endpoints.md.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import threading
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from lmprog.core.errors import BackendError
from lmprog.core.placement import POLICIES, Placement, Work
from lmprog.core.protocol import (
    Backend,
    GenerateRequest,
    GenerateResult,
    ScoreRequest,
    ScoreResult,
    StreamCallback,
)

_STATUS = re.compile(r"answered HTTP (\d{3})")
_UNREACHABLE = re.compile(r"cannot reach|broke off|stream ended before|timed out")
HANG_TIMEOUT_S = 60.0
PROBE_INTERVAL_S = 2.0
_POLL_S = 0.1


class _Moved(Exception):
    """The attempt's member was found hung: leave it."""


class Fleet(Backend):
    """Several backends behind one (docs/design/endpoints.md).

    members: backends, or URLs of lmprog/SGLang servers (each becomes lp.RuntimeEndpoint).
    policy: "capacity", "least_outstanding" or "round_robin".
    costs: a weight per member (capacity policy: a member of cost 2 is chosen when it is
        expected to finish twice as soon).
    hang_timeout_s: no progress on a request for this long: its member hung (None: never).
    probe_interval_s: how often members are probed (health of those out of rotation,
        reported capacity of remote ones).
    """

    def __init__(
        self,
        members: Sequence[Backend | str],
        policy: str = "capacity",
        *,
        costs: Sequence[float] | None = None,
        hang_timeout_s: float | None = HANG_TIMEOUT_S,
        probe_interval_s: float = PROBE_INTERVAL_S,
        api_key: str | None = None,
    ) -> None:
        if not members:
            raise ValueError("a Fleet needs at least one member")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        from .sglang_endpoint import RuntimeEndpoint

        self.members: list[Backend] = [
            RuntimeEndpoint(m, api_key=api_key) if isinstance(m, str) else m for m in members
        ]
        self.placement = Placement(len(self.members), policy, costs=costs)
        self.hang_timeout_s = hang_timeout_s
        self.probe_interval_s = probe_interval_s
        self.retries = 0
        self.failures = [0] * len(self.members)
        self._pool = cf.ThreadPoolExecutor(64, thread_name_prefix="lmprog-fleet")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._inflight: list[set[_Attempt]] = [set() for _ in self.members]
        self._generated = [-1] * len(self.members)  # a remote member's count at its last probe
        self._prober = threading.Thread(
            target=self._probe_loop, name="lmprog-fleet-probe", daemon=True
        )
        self._prober.start()

    # ---- Backend ---------------------------------------------------------------------------
    @property
    def chat_template(self) -> Any:
        return self.members[0].chat_template

    @property
    def tokenizer(self) -> Any:
        return self.members[0].tokenizer

    @property
    def image_token(self) -> str | None:
        return self.members[0].image_token

    @property
    def model_name(self) -> str:
        return str(getattr(self.members[0], "model_name", ""))

    def generate(
        self, request: GenerateRequest, stream: StreamCallback | None = None
    ) -> GenerateResult:
        work = Work(_prompt_tokens(request.prompt), request.params.max_tokens)
        call = _Call(stream)
        failed: list[int] = []
        while True:
            replica = self.placement.choose(work, failed)
            attempt = _Attempt(self, call, replica, self.placement.start(replica, work))
            with self._lock:
                self._inflight[replica].add(attempt)
            future = self._pool.submit(attempt.run, request)
            try:
                result = self._wait(attempt, future)
            except _Moved as exc:
                error: BaseException = exc.args[0]
            except Exception as exc:
                error = exc
                if not self._member_fault(replica, exc):
                    raise
            else:
                return result
            finally:
                with self._lock:
                    self._inflight[replica].discard(attempt)
            failed.append(replica)
            if call.produced or call.closed:
                raise error
            try:
                self.placement.choose(work, failed)  # anywhere left?
            except BackendError as nowhere:
                raise BackendError(f"{error}; no other member could take it ({nowhere})") from None
            with self._lock:
                self.retries += 1

    def _wait(self, attempt: _Attempt, future: cf.Future) -> GenerateResult:
        while True:
            try:
                return future.result(timeout=_POLL_S)
            except cf.TimeoutError:
                pass
            if attempt.moved is not None:
                raise _Moved(attempt.moved)
            idle = time.monotonic() - self.placement.last_progress(attempt.replica)
            if self.hang_timeout_s is not None and idle > self.hang_timeout_s:
                self._hung(attempt.replica, idle)

    def _member_fault(self, replica: int, error: BaseException) -> bool:
        """Whether `error` is the member's (retry elsewhere) rather than the request's. A
        remote member's fault takes it out of rotation until a probe succeeds."""
        if not isinstance(error, BackendError) or isinstance(error, ValueError):
            return False
        if _is_remote(self.members[replica]):
            status = _STATUS.search(str(error))
            if status is not None and int(status.group(1)) < 500:
                return False  # a 4xx: the request's
            if status is None and not _UNREACHABLE.search(str(error)):
                return False
            self._out(replica, f"it failed a request: {error}")
        with self._lock:
            self.failures[replica] += 1
        return True

    def _hung(self, replica: int, idle_s: float) -> None:
        error = BackendError(
            f"fleet member {replica} hung (no progress for {idle_s:.0f} s); a request with "
            "output there is not retried"
        )
        self._out(replica, f"no progress for {idle_s:.0f} s")
        with self._lock:
            attempts = list(self._inflight[replica])
        for a in attempts:
            a.moved = error

    def _out(self, replica: int, why: str) -> None:
        if self.placement.replicas[replica].available:
            import logging

            logging.getLogger(__name__).warning(
                "fleet member %d out of rotation: %s", replica, why[:300]
            )
        self.placement.set_available(replica, False)

    def score(self, request: ScoreRequest) -> ScoreResult:
        work = Work(_prompt_tokens(request.prompt), 1)
        failed: list[int] = []
        while True:
            replica = self.placement.choose(work, failed)
            ticket = self.placement.start(replica, work)
            try:
                out = self.members[replica].score(request)
            except Exception as exc:
                self.placement.finish(ticket)
                if not self._member_fault(replica, exc):
                    raise
                failed.append(replica)
                continue
            self.placement.finish(ticket, 1)
            return out

    def cache_prefix(self, prompt: str) -> None:
        """Ignored: the prefix's member would be chosen now, its children later (a fleet
        places each request by capacity)."""

    def stats(self) -> dict[str, Any]:
        members = []
        for i, (m, p) in enumerate(zip(self.members, self.placement.stats())):
            members.append({**p, "member": _describe(m), "failures": self.failures[i]})
        return {"policy": self.placement.policy, "retries": self.retries, "members": members}

    def flush_cache(self) -> bool:
        return all([m.flush_cache() for m in self.members])

    def shutdown(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- probes ----------------------------------------------------------------------------
    def _probe_loop(self) -> None:
        while not self._stop.wait(self.probe_interval_s):
            for i, member in enumerate(self.members):
                if self._stop.is_set():
                    return
                self._probe(i, member)

    def _probe(self, i: int, member: Backend) -> None:
        available = self.placement.replicas[i].available
        if _is_remote(member):
            base = member.base_url  # type: ignore[attr-defined]
            headers = dict(getattr(member, "_headers", {}))
            if not available:
                if _http_ok(base + "/health_generate", headers, timeout=10.0):
                    self._back(i)
                return
            load = _http_json(base + "/get_load", headers, timeout=2.0)
            if isinstance(load, list) and load and isinstance(load[0], dict):
                rate = sum(float(e.get("gen_tokens_per_s") or 0.0) for e in load)
                self.placement.report(i, rate or None)
                made = sum(int(e.get("generated_tokens") or 0) for e in load)
                if made != self._generated[i]:  # it generates: slow maybe, not hung
                    self._generated[i] = made
                    self.placement.touch(i)
        elif not available:
            try:
                from lmprog.core.sampling import SamplingParams

                member.generate(GenerateRequest("\n", SamplingParams(max_tokens=1)))
            except Exception:  # noqa: BLE001 - still failing: stays out
                return
            self._back(i)

    def _back(self, i: int) -> None:
        import logging

        logging.getLogger(__name__).warning("fleet member %d healthy again: back in rotation", i)
        self.placement.set_available(i, True)

    def __repr__(self) -> str:
        return f"Fleet({len(self.members)} members, policy={self.placement.policy!r})"


class _Call:
    """One generate call across its attempts: whether its caller saw output."""

    def __init__(self, stream: StreamCallback | None) -> None:
        self.stream = stream
        self.produced = False
        self.closed = False  # the caller's callback raised (it was cancelled)
        self.current: _Attempt | None = None
        self.lock = threading.Lock()


class _Attempt:
    """One try of a call on one member."""

    def __init__(self, fleet: Fleet, call: _Call, replica: int, ticket: Any) -> None:
        self.fleet, self.call, self.replica, self.ticket = fleet, call, replica, ticket
        self.moved: BaseException | None = None
        with call.lock:
            call.current = self

    def run(self, request: GenerateRequest) -> GenerateResult:
        placement = self.fleet.placement
        try:
            stream = self._piece if self.call.stream is not None else None
            result = self.fleet.members[self.replica].generate(request, stream)
        except BaseException:
            placement.finish(self.ticket)
            raise
        placement.finish(self.ticket, int(result.completion_tokens))
        return result

    def _piece(self, piece: str) -> None:
        self.fleet.placement.progress(self.ticket, 1.0)
        call = self.call
        with call.lock:
            if call.current is not self or self.moved is not None:
                raise _Moved(BackendError("the request moved to another member"))
            if call.stream is None:
                return
            call.produced = True
        try:
            call.stream(piece)
        except BaseException:
            call.closed = True
            raise


def _prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, str):
        return max(1, len(prompt) // 4)  # about 4 characters a token
    return len(prompt)


def _is_remote(member: Backend) -> bool:
    return hasattr(member, "base_url")


def _describe(member: Backend) -> str:
    return getattr(member, "base_url", None) or type(member).__name__


def _http_ok(url: str, headers: dict[str, str], timeout: float) -> bool:
    try:
        req = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 - unreachable, 5xx, timeout: not healthy
        return False


def _http_json(url: str, headers: dict[str, str], timeout: float) -> Any:
    try:
        req = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except Exception:  # noqa: BLE001 - no report this time
        return None
