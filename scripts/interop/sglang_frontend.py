"""SGLang's own frontend (`import sglang as sgl`, `sgl.RuntimeEndpoint`) against `lmprog serve`'s
native API on loopback: every program of SGLang's `sglang/test/test_programs.py`, unchanged,
each printed PASS / FAIL / TIMEOUT with its error and time.

    .venv/bin/python scripts/interop/sglang_frontend.py [--backend llamacpp|runtime] [-k NAME]

SGLang is not a dependency of lmprog; `bash scripts/setup.sh --test` installs its frontend
into the venv without its server stack: `sglang` with `--no-deps` and the packages its
frontend and `sglang.srt.utils` (which test_programs.py imports) import at import time, at
the versions of requirements/lock.txt. By hand:

    .venv/bin/pip install --no-deps sglang==0.5.23 psutil pybase64 pillow msgspec pyzmq \
        ipython traitlets

tests/serve/test_sglang_frontend.py runs every program this way against both backends' servers.
Programs run as SGLang's own suite runs them (test/lang/test_srt_backend.py): `test_select`
with `check_answer=False`, the others with their defaults. Each runs on a daemon thread with a
timeout, so a program whose request never returns is reported instead of hanging the run.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import threading
import time
import traceback
from dataclasses import dataclass

# as SGLang's test/lang/test_srt_backend.py calls them; the others take their defaults
KWARGS = {"test_select": {"check_answer": False}}


@dataclass
class Outcome:
    name: str
    status: str  # "PASS", "FAIL" or "TIMEOUT"
    seconds: float
    error: BaseException | None = None

    def describe(self) -> str:
        text = f"{self.status} {self.name} ({self.seconds:.1f} s)"
        if self.error is not None:
            where = traceback.extract_tb(self.error.__traceback__)
            at = f" at {where[-1].filename}:{where[-1].lineno}" if where else ""
            text += f": {type(self.error).__name__}: {str(self.error)[:300]!r}{at}"
        return text


def programs() -> dict:
    """SGLang's test programs by name (`test_*` functions of its test_programs.py)."""
    from sglang.test import test_programs

    return {
        name: fn
        for name, fn in vars(test_programs).items()
        if name.startswith("test_") and inspect.isfunction(fn)
    }


def use_server(url: str) -> None:
    """Make `sgl.RuntimeEndpoint(url)` SGLang's default backend."""
    import sglang as sgl

    sgl.set_default_backend(sgl.RuntimeEndpoint(url))


def run_program(name: str, timeout_s: float = 120.0) -> Outcome:
    """Run one of SGLang's test programs on the default backend, within `timeout_s`."""
    fn = programs()[name]
    box: dict = {}

    def target() -> None:
        try:
            fn(**KWARGS.get(name, {}))
        except BaseException as exc:  # noqa: BLE001 - reported as the program's outcome
            box["error"] = exc

    start = time.perf_counter()
    thread = threading.Thread(target=target, name=f"sglang-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    seconds = time.perf_counter() - start
    if thread.is_alive():
        return Outcome(name, "TIMEOUT", seconds, TimeoutError(f"no result in {timeout_s:g} s"))
    error = box.get("error")
    return Outcome(name, "FAIL" if error is not None else "PASS", seconds, error)


def start_backend(kind: str):
    import lmprog as lp

    if kind == "llamacpp":
        return lp.LlamaCpp()
    return lp.Runtime(device="cpu", max_total_tokens=8192)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["llamacpp", "runtime"], default="llamacpp")
    parser.add_argument("-k", help="run only programs whose name contains this")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per program")
    args = parser.parse_args()
    from lmprog.serve import Server

    names = [n for n in programs() if not args.k or args.k in n]
    backend = start_backend(args.backend)
    passed = 0
    with contextlib.ExitStack() as stack:
        stack.callback(backend.shutdown)
        srv = stack.enter_context(Server(backend, stats_interval_s=None).start())
        use_server(srv.url)
        start = time.perf_counter()
        for name in names:
            outcome = run_program(name, args.timeout)
            passed += outcome.status == "PASS"
            print(outcome.describe(), flush=True)
        print(f"{time.perf_counter() - start:.1f} s for {len(names)} programs")
    print(f"{passed}/{len(names)} passed on the {args.backend} server")


if __name__ == "__main__":
    main()
