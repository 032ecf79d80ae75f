"""Placement by measured capacity and lmprog's Fleet over unlike members (issue 35, sections
2 and 3): members that fail, hang or answer 5xx leave the rotation, requests their callers saw
nothing of run elsewhere, the others fail clearly, and members come back once healthy."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lmprog.backends.fleet import Fleet
from lmprog.core.errors import BackendError, ContextLengthError
from lmprog.core.placement import Placement, Work
from lmprog.core.protocol import Backend, GenerateRequest, GenerateResult
from lmprog.core.sampling import SamplingParams


# ---- placement -----------------------------------------------------------------------------
def _measure(p, replica, seconds, tokens=50, prompt=8):
    t = p.start(replica, Work(prompt, tokens))
    p.replicas[replica].busy_since -= seconds  # as if it took that long
    p.finish(t, tokens)


def test_capacity_placement_sends_work_where_it_ends_first():
    p = Placement(2, "capacity", warmup=1)
    _measure(p, 0, 1.0)  # ~51 tokens/s
    _measure(p, 1, 0.25)  # ~204 tokens/s: four times as fast
    assert p.stats()[1]["capacity"] > 3 * p.stats()[0]["capacity"]
    placed = []
    for _ in range(10):
        i = p.choose(Work(8, 50))
        p.start(i, Work(8, 50))
        placed.append(i)
    assert placed.count(1) == 8 and placed.count(0) == 2  # four to one, as the capacities


def test_least_outstanding_and_round_robin_ignore_capacity():
    lo, rr = Placement(2, "least_outstanding"), Placement(3, "round_robin")
    _measure(lo, 1, 0.1)
    picks = []
    for _ in range(4):
        i = lo.choose(Work(8, 50))
        lo.start(i, Work(8, 50))
        picks.append(i)
    assert picks == [0, 1, 0, 1]
    assert [rr.choose(Work(1, 1)) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    rr.set_available(1, False)
    assert [rr.choose(Work(1, 1)) for _ in range(4)] == [0, 2, 0, 2]
    assert rr.choose(Work(1, 1), exclude=[0]) == 2
    rr.set_available(2, False)
    with pytest.raises(BackendError, match="2 of 3 are out of rotation, 1 already failed"):
        rr.choose(Work(1, 1), exclude=[0])


def test_costs_and_reported_capacity():
    p = Placement(2, "capacity", costs=[1.0, 3.0])
    p.report(0, 100.0)
    p.report(1, 200.0)  # twice as fast but three times the cost
    assert p.choose(Work(8, 50)) == 0
    with pytest.raises(ValueError, match="policy"):
        Placement(2, "fastest")


# ---- the fleet over local fakes ------------------------------------------------------------
class Fake(Backend):
    """A member: `mode` "ok" (a token every `delay` s), "fail" (raises before output),
    "fail_late" (raises after one piece), "hang" (blocks until released)."""

    def __init__(self, name, delay=0.001, mode="ok"):
        self.name, self.delay, self.mode = name, delay, mode
        self.calls, self.release = 0, threading.Event()

    def generate(self, request, stream=None):
        self.calls += 1
        mode = self.mode
        if mode == "fail":
            raise BackendError("the runtime engine failed: planted")
        if mode == "hang":
            self.release.wait(30)
        if mode == "too_long":
            raise ContextLengthError("the prompt is too long")
        text = ""
        for i in range(request.params.max_tokens):
            time.sleep(self.delay)
            piece = f"{self.name}{i} "
            text += piece
            if stream is not None:
                stream(piece)
            if mode == "fail_late":
                raise BackendError("the runtime engine failed: planted after output")
        return GenerateResult(
            text, (), "length", prompt_tokens=3, completion_tokens=len(text.split())
        )

    def score(self, request):
        raise NotImplementedError

    @property
    def chat_template(self):
        return None

    @property
    def tokenizer(self):
        return None


def gen(fleet, n=3, stream=None):
    # ignore_eos: a real worker samples (temperature 1), and an end of text within n tokens
    # would make "n tokens" a flaky count
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    return fleet.generate(GenerateRequest("Hi there", params), stream)


def test_a_failing_member_is_skipped_and_its_requests_retried():
    bad, good = Fake("b", mode="fail"), Fake("g")
    fleet = Fleet([bad, good], "round_robin", probe_interval_s=3600)
    try:
        outs = [gen(fleet).text for _ in range(4)]
        assert all(o.startswith("g0") for o in outs)
        assert (
            fleet.retries >= 1 and bad.calls >= 1 and fleet.stats()["members"][0]["failures"] >= 1
        )
    finally:
        fleet.shutdown()


def test_output_already_seen_is_not_retried_and_client_errors_pass_through():
    fleet = Fleet([Fake("a", mode="fail_late"), Fake("b")], "round_robin", probe_interval_s=3600)
    try:
        pieces = []
        with pytest.raises(BackendError, match="after output"):
            gen(fleet, stream=pieces.append)
        assert pieces == ["a0 "] and fleet.retries == 0
        fleet.members[0].mode = "too_long"
        with pytest.raises(ContextLengthError):
            gen(fleet)  # round robin: member 1, then member 0's client error
            gen(fleet)
    finally:
        fleet.shutdown()


def test_a_hung_member_leaves_the_rotation_and_comes_back():
    hung, good = Fake("h", mode="hang"), Fake("g")
    fleet = Fleet([hung, good], "round_robin", hang_timeout_s=0.3, probe_interval_s=0.2)
    try:
        started = time.monotonic()
        out = gen(fleet)  # first to the hung member, moved after 0.3 s without progress
        assert out.text.startswith("g0") and time.monotonic() - started < 5
        assert not fleet.stats()["members"][0]["available"]
        assert all(gen(fleet).text.startswith("g0") for _ in range(3))
        hung.mode = "ok"
        hung.release.set()
        deadline = time.monotonic() + 10
        while not fleet.stats()["members"][0]["available"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert any(gen(fleet).text.startswith("h0") for _ in range(2))
    finally:
        fleet.shutdown()


def test_capacity_fleet_gives_the_faster_member_more():
    slow, fast = Fake("s", delay=0.02), Fake("f", delay=0.004)
    fleet = Fleet([slow, fast], "capacity", probe_interval_s=3600)
    try:
        threads = [threading.Thread(target=gen, args=(fleet, 10)) for _ in range(24)]
        for t in threads:
            t.start()
            time.sleep(0.01)
        for t in threads:
            t.join()
        assert fast.calls > 2 * slow.calls, (fast.calls, slow.calls)
        caps = [m["capacity"] for m in fleet.stats()["members"]]
        assert caps[1] > 2 * caps[0], caps
    finally:
        fleet.shutdown()


# ---- remote members: a real lmprog server beside ones that answer 500 or hang --------------
class _Bad(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "500"  # per server class: "500", "hang", "ok" (health only)

    def _send(self, status, body):
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        if self.path == "/get_model_info":
            return self._send(200, {"model_path": "smollm2-135m-instruct"})
        if self.path == "/health_generate":
            return self._send(200 if self.server.mode == "ok" else 503, {})
        return self._send(200, [{"dp_rank": 0, "num_reqs": 0, "gen_tokens_per_s": 0.0}])

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.server.mode == "hang":
            self.server.release.wait(30)
        return self._send(500, {"error": {"message": "planted internal error"}})

    def log_message(self, *args):
        pass


def _bad_server(mode):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Bad)
    srv.mode, srv.release, srv.daemon_threads = mode, threading.Event(), True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.mark.e2e
def test_remote_members_that_answer_500_or_hang_or_die():
    from lmprog.serve.processes import Fleet as Workers

    err, err_url = _bad_server("500")
    hang, hang_url = _bad_server("hang")
    with Workers.start(["--num-threads", "1"], ["--num-threads", "1"]) as workers:
        fleet = Fleet(
            [err_url, hang_url, *workers.urls],
            "round_robin",
            hang_timeout_s=4.0,
            probe_interval_s=0.3,
        )
        try:
            for url in workers.urls:  # a first generation is slower: warm each worker up
                Fleet([url], probe_interval_s=3600).generate(
                    GenerateRequest("Hi", SamplingParams(max_tokens=1))
                )
            outs = [gen(fleet, 4) for _ in range(4)]
            assert all(o.completion_tokens == 4 for o in outs)
            members = fleet.stats()["members"]
            assert [m["available"] for m in members] == [False, False, True, True]
            assert fleet.retries >= 2
            # a worker dies: its requests go to the last one
            workers.workers[0].stop()
            outs = [gen(fleet, 3) for _ in range(3)]
            assert all(o.completion_tokens == 3 for o in outs)
            assert not fleet.stats()["members"][2]["available"]
            # the 500 server heals: a probe puts it back in rotation
            err.mode = "ok"
            deadline = time.monotonic() + 10
            while not fleet.stats()["members"][0]["available"]:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            hang.release.set()
            fleet.shutdown()
            err.shutdown()
            hang.shutdown()
