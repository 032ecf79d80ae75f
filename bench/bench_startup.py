"""Start-up of the runtime backend (issue 16, item 1): `import lmprog` through `lp.Runtime()`,
and `lmprog serve --backend runtime` until it listens, each in a fresh process.

Cold: an empty `LMPROG_CACHE_DIR` (tokenizer, GGUF index and dequantized weights built; for
each measure);
warm: the processes after it, reusing that cache. Several source trees (`--trees`, each put
first on PYTHONPATH, each with its own cache folder) run alternately, so a busy neighbour
hurts them alike; the table gives the cold run and the warm runs' min / median / max, in
wall-clock seconds and in CPU seconds of the measured process (less sensitive to neighbours
on a shared machine; torch's threads can make it exceed the wall time).

    python bench/bench_startup.py --runs 5
    python bench/bench_startup.py --runs 5 --trees /tmp/old,.     # a tree before, and this one
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONSTRUCT = """
import time; t0, c0 = time.perf_counter(), time.process_time()
import lmprog as lp
rt = lp.Runtime(device="cpu")
t1, c1 = time.perf_counter(), time.process_time()
rt.generate("Hello", {"max_tokens": 8, "temperature": 0})
print(f"RESULT {t1 - t0:.3f} {c1 - c0:.3f} {time.perf_counter() - t1:.3f}")
rt.shutdown()
"""


def construct(tree: str, cache: Path) -> tuple[float, float, float]:
    """Seconds from `import lmprog` through lp.Runtime() (wall, and CPU of the process),
    and of a first 8-token gen (wall)."""
    out = subprocess.run(
        [sys.executable, "-c", CONSTRUCT],
        env=_env(tree, cache),
        cwd=cache.parent,  # not a checkout: `python -c` puts the working folder first
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("RESULT"))
    built, cpu, first = map(float, line.split()[1:])
    return built, cpu, first


def serve(tree: str, cache: Path) -> tuple[float, float]:
    """Seconds from starting `lmprog serve --backend runtime` until its 'listening on' line:
    wall, and the server process's CPU time until then (from /proc)."""
    began = time.perf_counter()
    args = [sys.executable, "-m", "lmprog.serve", "--backend", "runtime", "--port", "0"]
    env, cwd = _env(tree, cache), cache.parent
    proc = subprocess.Popen(args, env=env, cwd=cwd, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if re.search(r"listening on \S+/v1", line):
                return time.perf_counter() - began, _cpu_seconds(proc.pid)
        raise RuntimeError(f"lmprog serve exited ({proc.wait()}) without listening")
    finally:
        proc.terminate()
        proc.wait(60)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _env(tree: str, cache: Path) -> dict[str, str]:
    env = dict(os.environ, LMPROG_CACHE_DIR=str(cache), LMPROG_LOG_LEVEL="info")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="warm runs per tree and measure")
    parser.add_argument("--trees", default=".", help="comma-separated source trees")
    parser.add_argument("--no-serve", action="store_true", help="skip lmprog serve")
    args = parser.parse_args()
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    root = Path(tempfile.mkdtemp(prefix="lmprog-startup-"))
    caches = {t: root / f"cache{i}" for i, t in enumerate(trees)}
    rows: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    try:
        for rnd in range(args.runs + 1):
            for tree in trees:
                kind = "cold" if rnd == 0 else "warm"
                built, cpu, first = construct(tree, caches[tree])
                rows[tree].setdefault(f"{kind} lp.Runtime()", []).append(built)
                rows[tree].setdefault(f"{kind} lp.Runtime() CPU", []).append(cpu)
                rows[tree].setdefault(f"{kind} first gen", []).append(first)
                if not args.no_serve:
                    if kind == "cold":  # the server's cold start too
                        shutil.rmtree(caches[tree])
                    ready, ready_cpu = serve(tree, caches[tree])
                    rows[tree].setdefault(f"{kind} serve ready", []).append(ready)
                    rows[tree].setdefault(f"{kind} serve ready CPU", []).append(ready_cpu)
                print(f"round {rnd} {tree}: {built:.2f} s", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| tree | measure | cold | warm min / median / max |\n| --- | --- | --- | --- |")
    for tree, measures in rows.items():
        for name in [m for m in measures if m.startswith("warm")]:
            what = name.removeprefix("warm ")
            cold, warm = measures[f"cold {what}"][0], measures[name]
            low, mid, high = min(warm), statistics.median(warm), max(warm)
            print(f"| {tree} | {what} | {cold:.2f} s | {low:.2f} / {mid:.2f} / {high:.2f} s |")


if __name__ == "__main__":
    main()
