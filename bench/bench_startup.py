"""Start-up of the backends, each measure in a fresh process: the runtime (issue 16, item 1):
`import lmprog` through `lp.Runtime()`, and `lmprog serve --backend runtime` until it
listens; llama.cpp (issue 28, section 4): `import lmprog` through `lp.LlamaCpp()` and its
first 8-token gen (target: together <= 0.8 s, warm), and what a process's first JSON-schema
gen costs beyond a plain one (target: <= 50 ms): as the first gen after construction (a
process whose first gen is the schema's, against one whose first gen is plain), and after
plain gens (the first schema's gen against a second, new schema's, which has no one-time
set-up left).

Cold: an empty `LMPROG_CACHE_DIR` (tokenizer, GGUF index and dequantized weights built; for
each measure) and no bytecode cached; warm: the processes after it, reusing that cache and
the bytecode. Several source trees (`--trees`, each put first on PYTHONPATH, each with its
own cache folder) run alternately, so a busy neighbour hurts them alike; the table gives the
cold run and the warm runs' min / median / max, in wall-clock seconds and in CPU seconds of
the measured process (less sensitive to neighbours on a shared machine; torch's threads can
make it exceed the wall time).

    python bench/bench_startup.py --runs 5
    python bench/bench_startup.py --runs 5 --trees /tmp/old,.     # a tree before, and this one
    python bench/bench_startup.py --runs 9 --backends llamacpp
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
rt.generate_offline("Hello", {"max_tokens": 8, "temperature": 0})
print(f"RESULT {t1 - t0:.3f} {c1 - c0:.3f} {time.perf_counter() - t1:.3f}")
rt.shutdown()
"""


LLAMACPP = """
import sys, time; t0 = time.perf_counter()
import lmprog as lp
from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams
from lmprog.fsm.constraint import Constraint
b = lp.LlamaCpp()
t1 = time.perf_counter()
def gen(prompt, constraint=None):
    t = time.perf_counter()
    b.generate(GenerateRequest(prompt, SamplingParams(max_tokens=8, temperature=0), constraint))
    return time.perf_counter() - t
def schema(a, b):
    props = {a: {"type": "string"}, b: {"type": "integer"}}
    return Constraint.from_json_schema({"type": "object", "properties": props, "required": [a, b]})
if sys.argv[1] == "json":  # the first gen of the process is the schema's
    import lmprog.backends.llamacpp as llamacpp
    index_of, ready = llamacpp._constraint_index, []
    def timed(constraint, tokenizer, t=time.perf_counter):
        start = t()
        future = index_of(constraint, tokenizer)
        future.add_done_callback(lambda _: ready.append(t() - start))
        return future
    llamacpp._constraint_index = timed
    print(f"RESULT {t1 - t0:.3f} {gen('Hello', schema('name', 'age')):.3f} {ready[0]:.3f}")
else:
    first = gen("Hello")
    prompt = "Describe a person as JSON:"
    gen(prompt)  # its KV cached: both schemas' gens below reuse it alike
    first_json = gen(prompt, schema("name", "age"))
    new_json = gen(prompt, schema("title", "year"))
    torch = int("torch" in sys.modules)
    print(f"RESULT {t1 - t0:.3f} {first:.3f} {first_json:.3f} {new_json:.3f} {torch}")
b.shutdown()
"""


def llamacpp(tree: str, cache: Path, first: str) -> list[float]:
    """`first` "plain": [import lmprog + lp.LlamaCpp(), first 8-token gen, then after a second
    plain gen: the first JSON-schema gen, a new schema's gen, torch imported (0/1)]; "json":
    [construction, the first gen, a JSON-schema one, the time from that gen's call until its
    constraint index was ready (the set-up it waited for, if longer than the prefill)].
    Seconds, wall clock."""
    done = subprocess.run(
        [sys.executable, "-c", LLAMACPP, first],
        env=_env(tree, cache),
        cwd=cache.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        raise RuntimeError(f"the llama.cpp measure failed in {tree}:\n{done.stderr}")
    out = done.stdout
    line = next(line for line in out.splitlines() if line.startswith("RESULT"))
    return [float(x) for x in line.split()[1:]]


def llamacpp_rows(tree: str, cache: Path, kind: str, rows: dict[str, list[float]]) -> float:
    """One round of the llama.cpp measures into `rows`; returns construction + first gen."""
    built, first, first_json, new_json, torch = llamacpp(tree, cache, "plain")
    _, json_first, index_ready = llamacpp(tree, cache, "json")
    for name, value in (
        ("llama.cpp: lp.LlamaCpp()", built),
        ("llama.cpp: first 8-token gen", first),
        ("llama.cpp: lp.LlamaCpp() + first gen (target <= 0.8 s)", built + first),
        ("llama.cpp: first gen JSON schema - plain (target <= 0.05 s)", json_first - first),
        ("llama.cpp: first gen JSON schema: its constraint index ready after", index_ready),
        ("llama.cpp: first JSON gen - a new schema's, after plain gens", first_json - new_json),
        ("llama.cpp: torch imported by these gens (1 = yes)", torch),
    ):
        rows.setdefault(f"{kind} {name}", []).append(value)
    return built + first


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
    # Bytecode cached as an installed package has it (the cold round writes it, outside the
    # trees): without it each process compiles every module again (~0.2 s here).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(cache.parent / "pycache")
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="warm runs per tree and measure")
    parser.add_argument("--trees", default=".", help="comma-separated source trees")
    parser.add_argument("--no-serve", action="store_true", help="skip lmprog serve")
    parser.add_argument(
        "--backends", default="runtime,llamacpp", help="comma-separated: runtime, llamacpp"
    )
    args = parser.parse_args()
    backends = set(args.backends.split(","))
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    root = Path(tempfile.mkdtemp(prefix="lmprog-startup-"))
    caches = {t: root / f"cache{i}" for i, t in enumerate(trees)}
    rows: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    try:
        for rnd in range(args.runs + 1):
            for tree in trees:
                kind = "cold" if rnd == 0 else "warm"
                if "llamacpp" in backends:
                    own = caches[tree].with_name(caches[tree].name + "-llamacpp")  # its own cold
                    took = llamacpp_rows(tree, own, kind, rows[tree])
                    print(f"round {rnd} {tree}: llama.cpp {took:.2f} s", file=sys.stderr)
                if "runtime" not in backends:
                    continue
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
    print("| tree | measure | cold | warm min / median / max (s) |\n| --- | --- | --- | --- |")
    for tree, measures in rows.items():
        for name in [m for m in measures if m.startswith("warm")]:
            what = name.removeprefix("warm ")
            cold, warm = measures[f"cold {what}"][0], measures[name]
            low, mid, high = min(warm), statistics.median(warm), max(warm)
            print(f"| {tree} | {what} | {cold:.3f} | {low:.3f} / {mid:.3f} / {high:.3f} |")


if __name__ == "__main__":
    main()
