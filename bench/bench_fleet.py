"""Placement over unequal workers (issue 35, "Measured"): three `lmprog serve` llama.cpp
workers of deliberately unequal speed on loopback, a mixed open-loop workload placed by
lmprog's Fleet (capacity-aware, least-outstanding, round-robin) and, as baselines in the same
run, by SGLang's router (sglang-router: round_robin, power_of_two, cache_aware) in front of
the same workers; then the cache hit rate of a shared-prefix workload on one worker and
through the router with cache-aware routing on and off.

    .venv/bin/python bench/bench_fleet.py                       # threads 2,1,1; ~8 minutes
    .venv/bin/python bench/bench_fleet.py --threads 1,1,2 --requests 60 --rate 2.0

Throughput: completion tokens over the span from the first arrival to the last answer.
Latency: each request's end-to-end seconds (p50, p99). Every request asks for exactly its
max_new_tokens (ignore_eos) at temperature 0, so each policy gets the same work. Worker
caches are flushed between runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from lmprog.backends.fleet import Fleet
from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams
from lmprog.serve.processes import Fleet as Workers
from lmprog.serve.processes import SGLangRouter, get_json, sglang_router_available

WORDS = (
    "the river city garden winter light engine number story market paper forest signal "
    "morning window letter island bridge travel music season table orange stone"
).split()


def post(url: str, body: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    req = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def workload(n: int, seed: int) -> list[tuple[str, int]]:
    """(prompt, max_new_tokens): prompts of 10-150 words, outputs of 8 (50%), 48 (35%) or
    128 (15%) tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 150)))
        tokens = rng.choices([8, 48, 128], weights=[50, 35, 15])[0]
        out.append((f"Continue this text: {words}", tokens))
    return out


def body(prompt: str, tokens: int) -> dict[str, Any]:
    return {
        "text": prompt,
        "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0},
    }


def run_open_loop(send, jobs: list[tuple[str, int]], rate: float, seed: int) -> dict[str, float]:
    """Poisson arrivals at `rate` per second; send(prompt, tokens) -> completion tokens."""
    rng = random.Random(seed + 1)
    arrivals, t = [], 0.0
    for _ in jobs:
        t += rng.expovariate(rate)
        arrivals.append(t)
    latencies: list[float] = [0.0] * len(jobs)
    tokens = [0] * len(jobs)
    errors = [0]
    start = time.perf_counter()

    def one(i: int) -> None:
        delay = start + arrivals[i] - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t0 = time.perf_counter()
        try:
            tokens[i] = send(*jobs[i])
        except Exception as exc:  # a failed request counts, and is reported
            errors[0] += 1
            print(f"  request {i} failed: {exc}", file=sys.stderr)
        latencies[i] = time.perf_counter() - t0

    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(one, range(len(jobs))))
    span = time.perf_counter() - start
    lat = sorted(latencies)
    return {
        "throughput": sum(tokens) / span,
        "p50": lat[len(lat) // 2],
        "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "mean": sum(lat) / len(lat),
        "span": span,
        "errors": errors[0],
    }


def flush(urls: list[str]) -> None:
    for u in urls:
        req = urllib.request.Request(u + "/flush_cache", b"", method="POST")
        try:
            urllib.request.urlopen(req, timeout=30).read()
        except Exception:  # busy: the cache stays; the next run starts warmer
            pass


def calibrate(urls: list[str]) -> list[float]:
    """Each worker alone: tokens/s of 4 concurrent 32-token requests."""
    rates = []
    for u in urls:
        post(u, body("Hello there", 4))  # warm
        t0 = time.perf_counter()
        threads = [
            threading.Thread(target=post, args=(u, body(f"Story {i} about a dragon", 32)))
            for i in range(4)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        rates.append(128 / (time.perf_counter() - t0))
    return rates


def hit_rate(urls: list[str], send, jobs: list[str]) -> float:
    """Cached / prompt tokens over `jobs` (sent 4 at a time), from the workers' counters."""

    def counters() -> tuple[int, int]:
        c = p = 0
        for u in urls:
            s = get_json(u + "/server_info").get("stats", {})
            c += int(s.get("cached_tokens", 0))
            p += int(s.get("prompt_tokens", 0))
        return c, p

    c0, p0 = counters()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send, jobs))
    c1, p1 = counters()
    return (c1 - c0) / max(p1 - p0, 1)


def shared_prefix_jobs(seed: int, groups: int = 6, per_group: int = 8) -> list[str]:
    rng = random.Random(seed)
    heads = [
        f"You are assistant number {g}. " + " ".join(rng.choice(WORDS) for _ in range(120)) + "\n"
        for g in range(groups)
    ]
    jobs = [
        h + f"Question {q}: name a {rng.choice(WORDS)}." for h in heads for q in range(per_group)
    ]
    rng.shuffle(jobs)
    return jobs


LMPROG_POLICIES = ("capacity", "least_outstanding", "round_robin")
SGLANG_POLICIES = ("round_robin", "power_of_two", "cache_aware")


def run_policy(kind: str, policy: str, urls: list[str], jobs, rate: float, seed: int):
    """One open-loop run placed by lmprog's Fleet or by sglang-router with `policy`."""
    if kind == "fleet":
        fleet = Fleet(urls, policy, probe_interval_s=1.0)

        def send(prompt: str, tokens: int) -> int:
            params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0)
            return fleet.generate(GenerateRequest(prompt, params)).completion_tokens

        try:
            out = run_open_loop(send, jobs, rate, seed)
        finally:
            fleet.shutdown()
        out["split"] = [m["finished"] for m in fleet.stats()["members"]]
        return out
    with SGLangRouter.start(urls, policy) as router:

        def send(prompt: str, tokens: int) -> int:
            return post(router.url, body(prompt, tokens))["meta_info"]["completion_tokens"]

        return run_open_loop(send, jobs, rate, seed)


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("throughput", "p50", "p99", "mean", "span", "errors"):
        vals = sorted(r[key] for r in runs)
        out[key] = vals[len(vals) // 2]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="2,1,1", help="llama.cpp threads of each worker")
    ap.add_argument(
        "--cpus",
        default=None,
        help="taskset CPU list of each worker, ';'-separated (e.g. '0;1;1': the first worker "
        "has a core to itself, the other two share one)",
    )
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument(
        "--rate", type=float, default=None, help="arrivals/s (default: 0.8 x calibrated)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repetitions")
    ap.add_argument("--skip-sglang", action="store_true")
    ap.add_argument("--skip-hit-rate", action="store_true")
    args = ap.parse_args()
    log = logging.getLogger("lmprog.backends.fleet")  # members out of and back in rotation
    log.addHandler(logging.StreamHandler(sys.stdout))
    log.setLevel(logging.WARNING)
    threads = [t.strip() for t in args.threads.split(",")]
    jobs = workload(args.requests, args.seed)
    mean_tokens = sum(t for _, t in jobs) / len(jobs)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start")
    prefixes = [["taskset", "-c", c] for c in args.cpus.split(";")] if args.cpus else None
    print(f"workers: threads {threads}" + (f", cpus {args.cpus.split(';')}" if args.cpus else ""))
    worker_args = [["--num-threads", t, "--max-running-requests", "8"] for t in threads]
    with Workers.start(*worker_args, prefixes=prefixes) as w:
        urls = w.urls
        rates = calibrate(urls)
        for t, r in zip(threads, rates):
            print(f"worker with {t} thread(s): {r:.1f} tokens/s alone (4 x 32 tokens at once)")
        rate = args.rate or 0.8 * sum(rates) / mean_tokens
        print(
            f"workload: {len(jobs)} requests, {sum(t for _, t in jobs)} output tokens "
            f"(mean {mean_tokens:.0f}), Poisson arrivals at {rate:.2f}/s\n"
        )
        runners = [(f"lmprog {p}", "fleet", p) for p in LMPROG_POLICIES]
        if not args.skip_sglang and sglang_router_available():
            runners += [(f"sglang-router {p}", "router", p) for p in SGLANG_POLICIES]
        results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in runners}
        for r in range(args.rounds):  # interleaved, each round in another order
            print(f"round {r + 1} of {args.rounds}:")
            order = runners[r % len(runners) :] + runners[: r % len(runners)]
            for name, kind, policy in order:
                flush(urls)
                results[name].append(run_policy(kind, policy, urls, jobs, rate, args.seed + r))
                _row(name, results[name][-1])
        print(f"\nmedians of {args.rounds} rounds:")
        med = {name: _median(rs) for name, rs in results.items()}
        for name, _, _ in runners:
            _row(name, med[name])
        base, cap = med["lmprog least_outstanding"], med["lmprog capacity"]
        print(
            f"\ncapacity vs least-outstanding (medians): throughput "
            f"x{cap['throughput'] / base['throughput']:.2f}, "
            f"p99 {100 * (1 - cap['p99'] / base['p99']):+.0f}% lower"
        )
        if not args.skip_hit_rate:
            print(
                "\nshared-prefix workload (6 prefixes of ~150 tokens x 8 questions, 8 tokens out):"
            )
            prefix_jobs = shared_prefix_jobs(args.seed)
            flush(urls)
            single = hit_rate([urls[0]], lambda p: post(urls[0], body(p, 8)), prefix_jobs)
            print(f"  one worker:                          hit rate {100 * single:.1f}%")
            if sglang_router_available():
                for policy in ("cache_aware", "round_robin"):
                    flush(urls)
                    with SGLangRouter.start(urls, policy) as router:
                        hr = hit_rate(
                            urls, lambda p, u=router.url: post(u, body(p, 8)), prefix_jobs
                        )
                    print(
                        f"  sglang-router {policy:<12} {len(urls)} workers: hit rate {100 * hr:.1f}%"
                    )
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


def _row(name: str, r: dict[str, Any]) -> None:
    split = f"  split {r['split']}" if "split" in r else ""
    print(
        f"{name:<30} {r['throughput']:6.1f} tok/s  p50 {r['p50']:6.2f} s  p99 {r['p99']:6.2f} s"
        f"  ({r['errors']} errors, {r['span']:.0f} s){split}",
        flush=True,
    )


if __name__ == "__main__":
    main()
