"""Interpreter overhead on a zero-latency fake backend (issue 2's benchmark).

A program of 50 appends and 10 gens (60 primitives):
- `run()` of one program: time per primitive (target < 2 ms);
- `run_batch()` of 1,000 such programs at num_threads 1, 2, 4, 8: programs/s.
With a zero-latency backend the work is pure Python under the GIL, so threads cannot add
throughput here; `--latency` (seconds per gen, e.g. 0.001) shows how the batch overlaps
backend time.

    python bench/bench_interpreter.py [--programs 1000] [--latency 0.0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fakes import FakeBackend

import lmprog as lp

APPENDS, GENS = 50, 10


@lp.function
def program(s, topic):
    for i in range(APPENDS):
        s += f"line {i} about {topic}\n"
        if i % 5 == 4:
            s += lp.gen(f"g{i // 5}", max_tokens=4)


def per_primitive(backend: FakeBackend, repeats: int) -> tuple[float, float]:
    program.run("warmup", backend=backend)
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        state = program.run(f"topic {r}", backend=backend)
        times.append(time.perf_counter() - t0)
        assert state[f"g{GENS - 1}"]
    n = APPENDS + GENS
    return statistics.median(times) / n * 1e3, min(times) / n * 1e3


def batch_rate(backend: FakeBackend, programs: int, threads: int) -> float:
    items = [{"topic": f"t{i}"} for i in range(programs)]
    t0 = time.perf_counter()
    states = program.run_batch(items, num_threads=threads, backend=backend)
    elapsed = time.perf_counter() - t0
    assert all(s.error() is None for s in states)
    return programs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument(
        "--latency", type=float, default=0.0, help="seconds per gen in the fake backend"
    )
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    backend = FakeBackend(latency=args.latency)
    median_ms, best_ms = per_primitive(backend, args.repeats)
    print(
        f"program of {APPENDS} appends + {GENS} gens, fake backend latency {args.latency * 1e3:g} ms/gen"
    )
    print(f"run(): {median_ms:.4f} ms per primitive (median of {args.repeats}; best {best_ms:.4f})")
    print(f"\nrun_batch of {args.programs} programs")
    print(f"{'num_threads':>11} | {'programs/s':>10} | {'primitives/s':>12}")
    print(f"{'-' * 11}-+-{'-' * 10}-+-{'-' * 12}")
    for threads in (1, 2, 4, 8):
        rate = batch_rate(backend, args.programs, threads)
        print(f"{threads:>11} | {rate:>10.1f} | {rate * (APPENDS + GENS):>12.0f}")


if __name__ == "__main__":
    main()
