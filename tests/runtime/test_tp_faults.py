"""Faults of a tensor-parallel group (TP=2 on the CPU): a worker killed mid-run, one hung
past the collective timeout, one dying while the engine idles, and rank 0 dying. Each time
the caller gets a BackendError naming what broke, within the timeout, the engine stops,
and no process of the group is left running. The workers live as long as rank 0's process,
not the thread that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from tp_testing import leftover_workers, write_tiny, write_tiny_with_tokenizer

import lmprog as lp
from lmprog.core.errors import BackendError
from lmprog.core.sampling import SamplingParams as SP
from lmprog.runtime.assemble import assemble_model
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.parallel import ParallelError
from lmprog.runtime.parallel.start import start_tensor_parallel

LONG = SP(max_tokens=480, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("tiny"))


def start(folder, timeout_s=30.0):
    build = {"model": str(folder), "dtype": "float32"}
    tp = start_tensor_parallel(2, build, device="cpu", timeout_s=timeout_s)
    net = assemble_model(**build, tp=tp)
    engine = launch_engine(net, None, eos_token_ids=(0,), max_total_tokens=1024, tp=tp)
    return engine, tp.workers[0]


def wait_running(engine, steps=3):
    deadline = time.monotonic() + 30
    while engine.stats()["steps"] < steps:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.01)


def assert_down(engine, worker):
    deadline = time.monotonic() + 10
    while engine.alive and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not engine.alive
    with pytest.raises(BackendError, match="shut down"):
        engine.submit(EngineRequest((1, 2, 3), SP(max_tokens=1)))
    assert worker.poll() is not None
    assert leftover_workers() == []


def test_a_worker_killed_mid_run_fails_the_pending_requests(tiny):
    engine, worker = start(tiny)
    handles = [engine.submit(EngineRequest((5, 6, 7 + i), LONG), stream=False) for i in range(3)]
    wait_running(engine)
    os.kill(worker.pid, signal.SIGKILL)
    began = time.monotonic()
    for h in handles:
        with pytest.raises(ParallelError, match=r"tp_size=2\) broke: rank 1 exited"):
            h.result(timeout=30)
    assert time.monotonic() - began < 10
    assert_down(engine, worker)


def test_a_hung_worker_is_caught_by_the_collective_timeout(tiny):
    engine, worker = start(tiny, timeout_s=3.0)
    handle = engine.submit(EngineRequest((5, 6, 7), LONG), stream=False)
    wait_running(engine)
    os.kill(worker.pid, signal.SIGSTOP)
    began = time.monotonic()
    try:
        with pytest.raises(ParallelError, match=r"hung past the 3 s timeout"):
            handle.result(timeout=30)
        assert 2.5 < time.monotonic() - began < 15
    finally:
        if worker.poll() is None:  # only if the engine failed to clean up
            os.kill(worker.pid, signal.SIGKILL)
    assert_down(engine, worker)


def test_a_worker_dying_while_idle_stops_the_engine(tiny):
    engine, worker = start(tiny)
    engine.submit(EngineRequest((5, 6, 7), SP(max_tokens=2)), stream=False).result(timeout=30)
    os.kill(worker.pid, signal.SIGKILL)
    assert_down(engine, worker)


def test_workers_exit_when_rank_0_dies(tiny):
    script = textwrap.dedent(
        f"""
        import os, sys
        from lmprog.runtime.parallel.start import start_tensor_parallel
        tp = start_tensor_parallel(2, {{"model": {str(tiny)!r}}}, device="cpu")
        print(tp.workers[0].pid, flush=True)
        sys.stdin.readline()  # killed while waiting here
        """
    )
    rank0 = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        pid = int(rank0.stdout.readline())
        rank0.kill()
        rank0.wait(10)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "a worker outlived rank 0"
    finally:
        rank0.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_group_dropped_before_its_engine_starts_leaves_no_worker(tiny):
    import gc

    tp = start_tensor_parallel(2, {"model": str(tiny)}, device="cpu")
    worker = tp.workers[0]
    assert worker.poll() is None
    del tp  # e.g. lp.Runtime failed between starting the group and launching its engine
    gc.collect()
    assert worker.poll() is not None
    assert leftover_workers() == []


def test_a_runtime_built_in_a_thread_that_exits_keeps_its_workers(tmp_path):
    """The kernel's parent-death signal fires when the spawning *thread* exits: workers must
    not be tied to it (lp.Runtime built on a short-lived thread, a server's start-up one)."""
    folder = write_tiny_with_tokenizer(tmp_path / "tiny")
    built = []

    def build():
        built.append(lp.Runtime(str(folder), device="cpu", max_total_tokens=512, tp_size=2))

    builder = threading.Thread(target=build)
    builder.start()
    builder.join()
    (rt,) = built
    try:
        (worker,) = leftover_workers()
        time.sleep(1.5)  # a worker tied to the thread is gone by now, and rank 0 knows it
        result = rt.generate([5, 6, 7, 8], {"max_tokens": 4, "temperature": 0, "ignore_eos": True})
        assert result.completion_tokens == 4
        assert leftover_workers() == [worker]
    finally:
        rt.shutdown()
    assert leftover_workers() == []
