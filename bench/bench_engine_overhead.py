"""The engine's Python per decode step (issue 5: the GPU must not wait on Python).

    python3 bench/bench_engine_overhead.py                     # batch 1, 64, 256; no tokenizer
    python3 bench/bench_engine_overhead.py --stub              # the engine alone (no model)
    python3 bench/bench_engine_overhead.py --tokenizer         # + the default model's tokenizer
    python3 bench/bench_engine_overhead.py --batches 256 --phases    # + time per engine part
    python3 bench/bench_engine_overhead.py --batches 256 --profile   # + cProfile of the steps

A tiny random Llama on the CPU (bench_gpu.smoke_config; torch attention, one thread), so the
forward pass is small and the engine's own work dominates. N requests (8-token random
prompts, greedy, ignore_eos) decode together; only the steps where all N decode are counted.
Per step: the cycle (from one model call's start to the next one's: sampling, accept,
process_results, publish, schedule, building the step's tensors, the model) and the time in
the model call; the engine's work is the difference (on a GPU, the time the device idles).
Printed: medians over the counted steps. The tiny model's forward evicts the CPU caches
between steps; --stub replaces it by a table lookup, leaving the caches to the engine as on a
GPU host. Without --tokenizer the engine has no text to produce, as with an architecture
preset on the H200 (bench_gpu, bench_poisson); with it, token ids are detokenized
incrementally as in serving (SmolLM2's 49k vocabulary).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import smoke_config


def build_engine(args, max_running: int):
    from lmprog.runtime.config import CacheConfig, SchedulerConfig
    from lmprog.runtime.engine.launch import launch_engine
    from lmprog.runtime.models import build_model

    cfg, tok = smoke_config(), None
    if args.tokenizer:
        from lmprog.core.models import load_tokenizer, resolve_model

        tok = load_tokenizer(resolve_model())
        cfg = replace(cfg, vocab_size=len(tok))
    net = build_model(cfg, dtype="float32")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.3, generator=g)
    engine = launch_engine(
        net,
        tok,
        eos_token_ids=cfg.eos_token_ids,
        max_total_tokens=max_running * 256,
        context_length=256,
        cache_config=CacheConfig(radix_cache=True),
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=max(512, 16 * max_running), max_running_requests=max_running
        ),
    )
    return engine, cfg.vocab_size


# (name, object holding the method, method name): engine parts timed with --phases.
PHASES = [
    ("schedule", lambda e: e.scheduler, "schedule"),
    ("runner.build", lambda e: e.runner, "build"),
    ("outputs.process", lambda e: e._outputs, "process"),
    ("  sampler.sample", lambda e: e._outputs.sampler, "sample"),
    ("process_results", lambda e: e.scheduler, "process_results"),
    ("publish", lambda e: e, "_publish"),
]


class StepClock:
    """Wraps the model call inside runner.forward: start and duration of each, with the
    batch shape. A step's cycle runs from one model call's start to the next one's."""

    def __init__(self, engine) -> None:
        self.records: list[tuple[float, float, int, bool]] = []  # (start, dur, B, decode-only)
        self.calls: dict[str, list[tuple[float, float]]] = {}
        model = engine.runner.model

        def timed_model(fb, kv):
            start = time.perf_counter()
            logits = model(fb, kv)
            self.records.append(
                (start, time.perf_counter() - start, fb.batch_size, fb.is_decode_only)
            )
            return logits

        engine.runner.model = timed_model  # the CPU path calls it directly (no graphs)

    def time_phases(self, engine) -> None:
        """Also time the per-step calls of the engine's parts (see PHASES)."""
        for name, owner, attr in PHASES:
            obj = owner(engine)
            setattr(obj, attr, self._timed(self.calls.setdefault(name, []), getattr(obj, attr)))

    @staticmethod
    def _timed(calls: list, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                calls.append((start, time.perf_counter() - start))

        return timed

    def decode_cycles(self, batch: int) -> list[tuple[float, float, float]]:
        """(cycle start, cycle, model) of consecutive decode-only steps of `batch` requests."""
        out = []
        for (s0, d0, b0, dec0), (s1, _, b1, dec1) in zip(self.records, self.records[1:]):
            if dec0 and b0 == batch and dec1 and b1 == batch:
                out.append((s0, s1 - s0, d0))
        return out

    def phase_medians(self, batch: int) -> dict[str, float]:
        """Median time per counted cycle of each phase (its calls that start in the cycle)."""
        cycles = self.decode_cycles(batch)
        return {
            name: statistics.median(
                sum(d for s, d in calls if s0 <= s < s0 + c) for s0, c, _ in cycles
            )
            for name, calls in self.calls.items()
        }


def stub_model(vocab: int):
    """A stand-in for the model: logits looked up by each wanted position's input token in a
    fixed random table (a few us), so the CPU's caches stay the engine's, as on a GPU host."""
    table = torch.randn(4096, vocab, generator=torch.Generator().manual_seed(0))

    def model(fb, kv):
        return table[fb.input_ids[fb.logits_indices] % table.shape[0]]

    return model


def profiled(engine, profiler: cProfile.Profile) -> None:
    """cProfile every engine step."""
    step = engine._step

    def profiled_step():
        profiler.enable()
        try:
            step()
        finally:
            profiler.disable()

    engine._step = profiled_step


def measure(args, batch: int) -> dict:
    from lmprog.core.sampling import SamplingParams
    from lmprog.runtime.engine.io import EngineRequest

    engine, vocab = build_engine(args, batch)
    if args.stub:
        engine.runner.model = stub_model(vocab)
    clock = StepClock(engine)
    if args.phases:
        clock.time_phases(engine)
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiled(engine, profiler)
    gen = torch.Generator().manual_seed(batch)
    params = SamplingParams(max_tokens=args.steps + 2, temperature=0.0, ignore_eos=True)
    try:
        for _ in range(args.repeats):
            prompts = torch.randint(3, vocab, (batch, 8), generator=gen).tolist()
            handles = [
                engine.submit(EngineRequest(tuple(p), params), stream=args.stream) for p in prompts
            ]
            for h in handles:
                h.result(timeout=600)
    finally:
        engine.shutdown()
    cycles = clock.decode_cycles(batch)
    assert cycles, "no decode-only steps were seen"
    total = statistics.median(c for _, c, _ in cycles)
    model = statistics.median(m for _, _, m in cycles)
    python = statistics.median(c - m for _, c, m in cycles)
    if profiler is not None:
        s = io.StringIO()
        pstats.Stats(profiler, stream=s).sort_stats("tottime").print_stats(args.profile_lines)
        print(s.getvalue())
    if args.phases:
        for name, t in clock.phase_medians(batch).items():
            print(f"        {name:24s} {t * 1e3:7.3f} ms")
    return {"batch": batch, "steps": len(cycles), "total": total, "model": model, "python": python}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,64,256", help="comma-separated batch sizes")
    p.add_argument("--steps", type=int, default=40, help="decode steps per request")
    p.add_argument("--repeats", type=int, default=2, help="rounds of N requests per batch size")
    p.add_argument(
        "--tokenizer",
        action="store_true",
        help="detokenize with the default model's tokenizer (49k vocabulary)",
    )
    p.add_argument("--stream", action="store_true", help="stream text pieces to the handles")
    p.add_argument(
        "--stub",
        action="store_true",
        help="replace the model by a table lookup (the engine's work alone)",
    )
    p.add_argument("--phases", action="store_true", help="time the engine's parts per step")
    p.add_argument("--profile", action="store_true", help="cProfile the engine steps")
    p.add_argument("--profile-lines", type=int, default=30)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    model = "a stub model (table lookup)" if args.stub else "tiny Llama on the CPU"
    print(
        f"{model}, greedy ignore_eos, {args.steps} decode steps per request, "
        f"tokenizer: {'SmolLM2' if args.tokenizer else 'none'}, stream: {args.stream}"
    )
    print(
        f"{'batch':>6s} {'steps':>6s} {'ms/step':>9s} {'model':>9s} {'engine Python':>14s} "
        f"{'us/request':>11s}"
    )
    for b in (int(x) for x in args.batches.split(",")):
        r = measure(args, b)
        print(
            f"{r['batch']:6d} {r['steps']:6d} {r['total'] * 1e3:9.2f} {r['model'] * 1e3:9.2f} "
            f"{r['python'] * 1e3:14.2f} {r['python'] * 1e6 / b:11.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
