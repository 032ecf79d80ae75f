"""The scheduler's bookkeeping per decode step (schedule + process_results), no model.

    python3 bench/bench_scheduler.py                        # 1, 64 and 256 running requests
    python3 bench/bench_scheduler.py --running 64 --steps 1000
    python3 bench/bench_scheduler.py --running 64 --max-us 5000   # exit 1 above 5 ms/step

N requests (256-token prompts, ignore_eos, no prefix sharing) are admitted and prefilled,
then every step decodes all N: the scheduler builds the batch and records one token per
request, as the engine's loop does around the model call. Printed per N: the median and the
best time per step over `--repeats` runs of `--steps` steps, and the median per request.
This was a test's bound (< 5 ms at 64 running; ~0.1-0.2 ms expected), moved here because a
loaded machine fails any wall-clock bound; tests/runtime/test_scheduler_sim.py keeps the
steady decode state's correctness checks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmprog.core.sampling import SamplingParams
from lmprog.runtime.config import SchedulerConfig
from lmprog.runtime.request import Req
from lmprog.runtime.scheduler import Scheduler

PROMPT_LEN = 256


def decoding_scheduler(running: int, decode_steps: int) -> Scheduler:
    """A scheduler with `running` requests past their prefill, each with room for
    `decode_steps` more tokens (and those decoded while the others were prefilled)."""
    context = 2 * (PROMPT_LEN + decode_steps)
    s = Scheduler(
        2 * running * context,
        context,  # room to spare: no retraction
        SchedulerConfig(max_num_batched_tokens=4096, max_running_requests=running),
    )
    for i in range(running):
        s.submit(
            Req(
                i,
                list(range(i * 1000, i * 1000 + PROMPT_LEN)),
                SamplingParams(max_tokens=100_000, ignore_eos=True),
            )
        )
    while any(r.pending_len > 1 for r in s.requests.running_reqs()) or s.num_waiting:
        b = s.schedule()
        append_tokens(b, [[1] if e.sample else [] for e in b.entries])
        s.process_results(b)
    return s


def append_tokens(b, tokens) -> None:
    """The decoding side of a minimal driver: each entry's tokens appended to its request
    (the engine's DecodeStates do this through ReqOutputs)."""
    for e, toks in zip(b.entries, tokens):
        e.req.token_ids.extend(toks)


def time_steps(s: Scheduler, running: int, steps: int) -> float:
    """Seconds per step over `steps` decode steps."""
    tokens = [[7]] * running
    t0 = time.perf_counter()
    for _ in range(steps):
        b = s.schedule()
        append_tokens(b, tokens)
        s.process_results(b)
    elapsed = time.perf_counter() - t0
    assert len(b.entries) == running and b.num_decodes == running, "not every request decoded"
    return elapsed / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--running", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--max-us",
        type=float,
        default=None,
        help="exit 1 when a median time per step exceeds this many microseconds",
    )
    args = ap.parse_args()
    print(f"scheduler bookkeeping per decode step ({args.steps} steps, median of {args.repeats})")
    print(f"{'running':>7} | {'us/step':>9} | {'best':>9} | {'us/request':>10}")
    print(f"{'-' * 7}-+-{'-' * 9}-+-{'-' * 9}-+-{'-' * 10}")
    worst = 0.0
    for n in args.running:
        s = decoding_scheduler(n, args.steps * args.repeats)
        times = [time_steps(s, n, args.steps) for _ in range(args.repeats)]
        s.check_integrity()
        median = statistics.median(times) * 1e6
        worst = max(worst, median)
        print(f"{n:>7} | {median:>9.1f} | {min(times) * 1e6:>9.1f} | {median / n:>10.2f}")
    if args.max_us is not None and worst > args.max_us:
        print(f"over the bound: {worst:.1f} us/step > {args.max_us:g}")
        sys.exit(1)


if __name__ == "__main__":
    main()
