"""A simulator of placement over fleets of unequal replicas (issue 35, section 2): the same
lmprog Placement (lmprog/core/placement.py) that lp.Fleet uses, driven by a simulated clock,
in front of simulated servers; capacity-aware vs least-outstanding vs round-robin on the same
arrivals. Deterministic and machine-independent, so it measures the policies where the
loopback run (bench/bench_fleet.py) is at the mercy of a shared 2-core machine.

    .venv/bin/python bench/sim_fleet.py            # the fleets below, 5 seeds each, ~1 minute

Server model: replica i decodes `speed_i` tokens/s for one request (30 for the slowest: the
bundled model on one llama.cpp thread here); b requests at once share
speed_i * b**0.4 tokens/s (batching gains sublinearly: the bundled model on llama.cpp measured
about 1.7x at 4 at once), processor-sharing; a request's work is its output tokens plus its
prompt tokens / 8 (Placement's own model). Workload: Poisson arrivals, prompts of 15-200
tokens, outputs of 8 (50%), 48 (35%) or 128 (15%) tokens; the offered load is a fraction of
the fleet's capacity at 4 requests each.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from lmprog.core.placement import Placement, Work

BATCH_EXP = 0.4
FLEETS = {
    # the loopback bench's shape: a worker twice as fast as the other two (1 vs 2 threads)
    "3 workers, 2:1:1": [60.0, 30.0, 30.0],
    # generations side by side (H100, A100, L40S-like ratios), 8 replicas
    "8 replicas, 3:3:2:2:2:1:1:1": [90.0, 90.0, 60.0, 60.0, 60.0, 30.0, 30.0, 30.0],
    # one old card kept in service beside fast ones
    "4 replicas, 4:4:4:1": [120.0, 120.0, 120.0, 30.0],
}


def workload(n: int, rate: float, seed: int) -> list[tuple[float, int, int]]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append((t, rng.randint(15, 200), rng.choices([8, 48, 128], [50, 35, 15])[0]))
    return out


def simulate(speeds: list[float], jobs, policy: str) -> dict[str, float]:
    now = [0.0]
    placement = Placement(len(speeds), policy, clock=lambda: now[0])
    active: list[dict[int, float]] = [{} for _ in speeds]  # job -> work left
    tickets, done_at = {}, {}
    arrivals = list(enumerate(jobs))
    heapq.heapify(arrivals)
    a = 0

    def rate_each(i: int) -> float:
        b = len(active[i])
        return speeds[i] * b**BATCH_EXP / b if b else 0.0

    while a < len(jobs) or any(active):
        # the next completion under the current rates
        nxt, who = float("inf"), None
        for i, act in enumerate(active):
            if act:
                j, left = min(act.items(), key=lambda kv: kv[1])
                t = now[0] + left / rate_each(i)
                if t < nxt:
                    nxt, who = t, (i, j)
        arrival = jobs[a][0] if a < len(jobs) else float("inf")
        step_to = min(nxt, arrival)
        dt = step_to - now[0]
        for i, act in enumerate(active):
            r = rate_each(i)
            for j in act:
                act[j] -= r * dt
        now[0] = step_to
        if arrival <= nxt:
            t, prompt, tokens = jobs[a]
            work = Work(prompt, tokens)
            i = placement.choose(work)
            tickets[a] = placement.start(i, work)
            active[i][a] = tokens + prompt / placement.prefill_ratio
            a += 1
        else:
            i, j = who
            del active[i][j]
            placement.finish(tickets[j], jobs[j][2])
            done_at[j] = now[0]
    lat = sorted(done_at[j] - jobs[j][0] for j in range(len(jobs)))
    span = max(done_at.values()) - jobs[0][0]
    return {
        "throughput": sum(t for _, _, t in jobs) / span,
        "p50": lat[len(lat) // 2],
        "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--loads", default="0.7,0.9", help="offered load, fractions of capacity")
    args = ap.parse_args()
    mean_work = 0.5 * 8 + 0.35 * 48 + 0.15 * 128 + 107.5 / 8
    for name, speeds in FLEETS.items():
        capacity = sum(s * 4**BATCH_EXP for s in speeds)  # tokens/s at 4 requests each
        for load in (float(x) for x in args.loads.split(",")):
            rate = load * capacity / mean_work
            rows = {}
            for policy in ("capacity", "least_outstanding", "round_robin"):
                runs = [
                    simulate(speeds, workload(args.requests, rate, seed), policy)
                    for seed in range(args.seeds)
                ]
                rows[policy] = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
            print(
                f"{name}, offered load {load:.0%} ({args.requests} requests x {args.seeds} seeds):"
            )
            base = rows["least_outstanding"]
            for policy, r in rows.items():
                print(
                    f"  {policy:<18} {r['throughput']:7.2f} tok/s (x{r['throughput'] / base['throughput']:.2f})"
                    f"  p50 {r['p50']:7.1f} s  p99 {r['p99']:7.1f} s"
                    f" ({100 * (1 - r['p99'] / base['p99']):+.0f}% vs least-outstanding)"
                )


if __name__ == "__main__":
    main()
