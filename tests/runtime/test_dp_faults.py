"""Faults of data-parallel replicas (issue 35, section 3), over engines that hand out real
RequestHandles and fail, die or hang when told: a request is moved to another replica when
its caller saw no output yet and fails clearly otherwise; a hung replica leaves the rotation
and comes back when it steps again."""

from __future__ import annotations

import itertools
import time

import pytest

from lmprog.core.errors import BackendError, ContextLengthError
from lmprog.core.sampling import SamplingParams
from lmprog.runtime.data_parallel.replicas import ReplicaGroup
from lmprog.runtime.engine.io import EngineRequest, RequestHandle


class StepEngine:
    """An engine's surface whose requests end, fail and step only when the test says."""

    def __init__(self):
        self.alive, self.handles, self.aborted, self.steps = True, [], [], 0
        self._rids = itertools.count()

    def submit(self, request, stream=True):
        if not self.alive:
            raise BackendError("the runtime engine is shut down; create a new Runtime")
        h = RequestHandle(next(self._rids), self.abort, stream)
        h.request = request
        self.handles.append(h)
        return h

    def pending(self):
        return [h for h in self.handles if h.finished_at is None]

    def abort(self, rid):
        self.aborted.append(rid)

    def die(self):
        """Its thread ends: every pending request fails (what Engine._fail_everything does)."""
        for h in self.pending():
            h.put_error(BackendError("the runtime engine failed: RuntimeError('boom')"))
        self.alive = False

    def stats(self):
        return {"steps": self.steps, "kv_capacity": 4096, "num_running": len(self.pending())}

    def flush_cache(self):
        return True

    def check_integrity(self):
        pass

    def shutdown(self, timeout=None):
        if self.alive:
            for h in self.pending():
                h.put_error(BackendError("the runtime was shut down before the request finished"))
        self.alive = False


def req(i, guide=None):
    return EngineRequest((7, 8, 9, 100 + i), SamplingParams(max_tokens=4), guide=guide)


def group_of(n=2, **kw):
    engines = [StepEngine() for _ in range(n)]
    return ReplicaGroup(engines, hang_timeout_s=kw.pop("hang_timeout_s", None), **kw), engines


def home(engines):
    return next(e for e in engines if e.pending())


def test_requests_of_a_dying_replica_without_output_run_elsewhere(caplog):
    group, (a, b) = group_of()
    quiet, talking = group.submit(req(0)), group.submit(req(1))
    assert len(a.pending()) == 2  # the shared prefix routed both to replica 0
    a.pending()[1].put_piece("Hello")  # the second one streamed output
    assert list(_take_pieces(talking, 1)) == ["Hello"]
    with caplog.at_level("WARNING", logger="lmprog.runtime.data_parallel.replicas"):
        a.die()
    assert len(b.pending()) == 1 and b.pending()[0].request.prompt_ids == req(0).prompt_ids
    b.pending()[0].put_piece("fine")
    b.pending()[0].put_result("result-from-b")
    assert list(quiet.pieces()) == ["fine"] and quiet.result() == "result-from-b"
    with pytest.raises(BackendError, match="engine failed"):
        talking.result()  # it had output: failed, not retried
    assert group.retries == 1 and "submitted again to replica 1" in caplog.text
    assert group.stats()["dp_retries"] == 1
    # the dead replica is out; new requests go to the other one
    group.submit(req(5))
    assert len(b.pending()) == 1 and len(a.handles) == 2


def _take_pieces(handle, n):
    it = handle.pieces()
    for _ in range(n):
        yield next(it)


def test_a_failed_step_is_retried_on_each_other_replica_once_then_fails():
    group, engines = group_of(3)
    outer = group.submit(req(0))
    seen = []
    for _ in range(3):
        (h,) = [h for e in engines for h in e.pending()]
        seen.append(next(e for e in engines if h in e.handles))
        h.put_error(BackendError("the model step failed: RuntimeError('nan')"))
    assert len(set(map(id, seen))) == 3  # each replica tried once
    with pytest.raises(BackendError, match="model step failed"):
        outer.result(timeout=5)
    assert group.retries == 2 and all(e.alive for e in engines)


def test_errors_of_the_request_itself_are_not_retried():
    group, engines = group_of()
    outer = group.submit(req(0))
    (h,) = [h for e in engines for h in e.pending()]
    h.put_error(ContextLengthError("the prompt is too long"))
    with pytest.raises(ContextLengthError):
        outer.result(timeout=5)
    assert group.retries == 0 and sum(len(e.handles) for e in engines) == 1


def test_a_retried_constrained_request_gets_a_fresh_guide():
    class Guide:
        copies = 0

        def copy(self):
            Guide.copies += 1
            return Guide()

    guide = Guide()
    group, (a, b) = group_of()
    group.submit(req(0, guide=guide))
    first = home([a, b])
    first.die()
    (moved,) = [h for e in (a, b) for h in e.pending()]
    assert moved.request.guide is not guide and isinstance(moved.request.guide, Guide)


def test_aborts_follow_the_request_and_nothing_is_retried_after_an_abort():
    group, (a, b) = group_of()
    outer = group.submit(req(0))
    first = home([a, b])
    outer.abort()
    assert first.aborted == [first.handles[0].rid]
    first.die()  # fails it: aborted requests are not moved
    with pytest.raises(BackendError):
        outer.result(timeout=5)
    assert group.retries == 0


def test_a_hung_replica_leaves_the_rotation_and_returns_when_it_steps(caplog):
    group, (a, b) = group_of(hang_timeout_s=0.3)
    try:
        quiet, talking = group.submit(req(0)), group.submit(req(1))
        hung = home([a, b])
        assert len(hung.pending()) == 2  # the shared prefix routed both there
        other = b if hung is a else a
        hung.pending()[1].put_piece("partial")
        assert list(_take_pieces(talking, 1)) == ["partial"]
        with caplog.at_level("WARNING", logger="lmprog.runtime.data_parallel.replicas"):
            _wait(lambda: group.router.suspended[group.replicas.index(hung)])
            _wait(lambda: other.pending())
        assert "made no step" in caplog.text
        (moved,) = other.pending()
        assert moved.request.prompt_ids == req(0).prompt_ids
        assert sorted(hung.aborted) == sorted(h.rid for h in hung.handles)
        with pytest.raises(BackendError, match="hung"):
            talking.result(timeout=5)  # it had output
        moved.put_result("done elsewhere")
        assert quiet.result(timeout=5) == "done elsewhere"
        # while suspended, new requests go to the other replica
        group.submit(req(2))
        assert len(other.pending()) == 1 and len(hung.pending()) == 2
        # the hung engine wakes up: its late events are dropped, it is back in rotation
        hung.pending()[0].put_result("late")
        hung.steps += 1
        _wait(lambda: not group.router.suspended[group.replicas.index(hung)])
        assert quiet.result() == "done elsewhere" and group.hangs == 1
        assert group.stats()["replicas"][group.replicas.index(hung)]["suspended"] is False
    finally:
        group.shutdown()


def test_no_retry_after_the_group_shuts_down():
    group, engines = group_of()
    outer = group.submit(req(0))
    group.shutdown()
    with pytest.raises(BackendError, match="shut down"):
        outer.result(timeout=5)
    assert group.retries == 0


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
