"""Every backend ends cleanly when the process does: at a script's end with the implicit
default backend never shut down, at SIGINT in the middle of a generation, and when the
program raises while other requests are in flight.

Each case runs as its own Python process, as a user's script does (fixtures that shut their
backend down would hide what these catch). The failure these guard against was racy (an
engine thread freeing a tensor while the interpreter finalized: SIGABRT with "terminate
called without an active exception" in about half of the runs), so the plain exit runs
several times.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend is not installed")

RUNS = int(os.environ.get("LMPROG_EXIT_RUNS", "4"))
CRASH_MARKS = (
    "terminate called",
    "Fatal Python error",
    "Segmentation fault",
    "Aborted",
    "core dumped",
)

PLAIN = """
import lmprog as lp

@lp.function
def f(s):
    s += "The capital of France is" + lp.gen("x", max_tokens=4, temperature=0)

print("OUT", repr(f.run()["x"]))
"""

# a long generation on a worker thread while the main thread is interrupted
INTERRUPTED = """
import threading, lmprog as lp

@lp.function
def f(s):
    s += "Count from one to a thousand: one, two," + lp.gen("x", max_tokens=2000, temperature=0)

state = f.run(stream=True)
for piece in state.text_iter("x"):
    print("STARTED", flush=True)
    threading.Event().wait()
"""

# the program raises while forked branches are still generating
RAISES = """
import lmprog as lp

@lp.function
def f(s):
    s += "List three colors:"
    forks = s.fork(3)
    for i, b in enumerate(forks):
        b += lp.gen("x", max_tokens=200, temperature=0.8, seed=i)
    forks[0]["x"]  # the first branch is done; the others run on
    raise RuntimeError("the user's program failed")

f.run()
"""

RUNTIME = """
import torch, lmprog as lp

torch.set_num_threads(1)
lp.set_default_backend(lp.Runtime(device="cpu"))

@lp.function
def f(s):
    s += "The capital of France is" + lp.gen("x", max_tokens=4, temperature=0)

print("OUT", repr(f.run()["x"]))
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONFAULTHANDLER="1", OMP_NUM_THREADS="1", **extra)
    return env


def _run(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
    )


def _assert_no_crash(stderr: str) -> None:
    for mark in CRASH_MARKS:
        assert mark not in stderr, stderr[-3000:]


def test_implicit_backend_exits_cleanly_every_time():
    for _ in range(RUNS):
        done = _run(PLAIN)
        _assert_no_crash(done.stderr)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Paris" in done.stdout


def test_sigint_mid_generation_ends_cleanly():
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(INTERRUPTED)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        # SIGINT as a terminal delivers it: a pytest-xdist worker ignores SIGINT, an ignored
        # signal stays ignored across exec, and Python then installs no KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout.readline().startswith("STARTED"), proc.stderr.read()[-3000:]
        time.sleep(0.3)  # tokens are being generated
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    _assert_no_crash(stderr)
    assert "KeyboardInterrupt" in stderr
    # an uncaught KeyboardInterrupt ends the process by SIGINT (or with status 1 / 130)
    assert proc.returncode in (-signal.SIGINT, 1, 130), (proc.returncode, stderr[-3000:])


def test_program_raising_with_requests_in_flight_ends_cleanly():
    started = time.perf_counter()
    done = _run(RAISES)
    _assert_no_crash(done.stderr)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "RuntimeError: the user's program failed" in done.stderr
    # the branches still generating are cancelled at exit, not waited for (200 tokens each)
    assert time.perf_counter() - started < 120


def test_runtime_backend_exits_cleanly():
    for _ in range(2):
        done = _run(RUNTIME)
        _assert_no_crash(done.stderr)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Paris" in done.stdout
