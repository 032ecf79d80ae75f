"""Speculation's host overhead per iteration (issue 33): plain decode steps vs verify steps.

A tiny random Llama (2 layers, hidden 64, a 1,024-token vocabulary: the default model's
tokenizer's first ids) on the CPU, so the forward pass costs little and what is measured is the engine's own work per step. Batch 1,
greedy. The speculating engines draft with an oracle that knows the plain run's output and
proposes it (a chain of k drafts, every one accepted; or a tree: a wrong first branch, the
true chain on the second, one wrong leaf), so the acceptance is known; one more engine
drafts with the n-gram proposer (its acceptance is what the random model's text gives). Each engine step is
split into phases by wrapping the engine's methods with perf_counter timers:

    propose   Speculator.propose (the proposer + cutting its drafts)
    choose    Speculator.choose
    schedule  Scheduler.schedule (the verify batch: entries, KV slots, masks)
    forward   ModelRunner.forward (inputs to the device + the model)
    process   StepOutputs.process, or .settle under overlap scheduling (sampling,
              verification, detokenizing, streaming)
    on_step   Speculator.on_step (acceptance statistics)
    results   Scheduler.process_results (accepted tokens to the requests, KV freed)
    kv_moves  ModelRunner.copy_kv (a tree's accepted path)
    publish   Engine._publish (the stats snapshot, once per loop)
    other     the rest of the step (the loop's own work; integrity checks off)

    PYTHONPATH=. python bench/bench_spec_overhead.py [--tokens 256] [--rounds 3] [--profile k8]
    python3 bench/bench_spec_overhead.py --model bundled --device cuda --dtype float32

With --model the rows are modes of one lp.Runtime's engine (its CUDA graphs, overlap
scheduling and all), switched between runs: the GPU's numbers, where perf_counter phases
count host time (launches are asynchronous: the device's time lands in the phase that
reads a result back, `process` or `forward`).

Prints per engine: steps, tokens per step, ms per step, ms per generated token and the phases
(ms per step); all engines run in one process, alternating, `--rounds` times (medians).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from lmprog.core.models import load_tokenizer, resolve_model
from lmprog.core.sampling import SamplingParams
from lmprog.runtime.config import SchedulerConfig
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.models import ModelConfig, build_model
from lmprog.runtime.speculative import Proposal, Proposer, SpeculativeConfig

TINY = ModelConfig(
    "llama",
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position=2048,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_ids=(2,),
)
PHASES = ("choose", "propose", "schedule", "forward", "process", "on_step", "results")
PHASES += ("kv_moves", "publish", "other")


class PerfectOracle(Proposer):
    """Drafts the known continuation (a chain, all right), or with tree=True a tree: a wrong
    first branch of one node, the true chain on the second, a wrong leaf under its first."""

    def __init__(self, vocab_size: int, k: int, tree: bool = False) -> None:
        self.v, self.k, self.tree = vocab_size, k, tree
        self.known: list[int] = []

    def propose(self, inputs: Any) -> list[Proposal]:
        out = []
        for inp in inputs:
            n = len(inp.token_ids)
            k = min(inp.max_tokens, self.k)
            if not self.tree:
                out.append(Proposal(tuple(self.known[n : n + k])))
                continue
            chain = self.known[n : n + max(0, k - 2)]
            if not chain:
                out.append(Proposal(()))
                continue
            ids = [(chain[0] + 1) % self.v, *chain, (chain[0] + 7) % self.v]
            parents = [-1, -1, *range(1, len(chain)), 1]
            out.append(Proposal(tuple(ids), parents=tuple(parents)))
        return out

    def release(self, rid: Any) -> None:
        pass


def timed(phases: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            phases[name] += time.perf_counter() - t

    return wrapper


def instrument(engine: Any) -> dict[str, float]:
    """Wrap the engine's step phases (engine thread only; set before any request)."""
    phases: dict[str, float] = defaultdict(float)
    spec, sched, runner = engine.speculator, engine.scheduler, engine.runner
    if spec is not None:
        spec.choose = timed(phases, "choose", spec.choose)
        spec.propose = timed(phases, "propose", spec.propose)
        spec.on_step = timed(phases, "on_step", spec.on_step)
    sched.schedule = timed(phases, "schedule", sched.schedule)
    sched.process_results = timed(phases, "results", sched.process_results)
    runner.forward = timed(phases, "forward", runner.forward)
    runner.copy_kv = timed(phases, "kv_moves", runner.copy_kv)
    engine._outputs.process = timed(phases, "process", engine._outputs.process)
    engine._outputs.settle = timed(phases, "process", engine._outputs.settle)  # (overlap)
    engine._publish = timed(phases, "publish", engine._publish)
    engine._step = timed(phases, "step", engine._step)
    return phases


def make_engine(model: Any, tok: Any, proposer: Proposer | None, k: int, method: str = "") -> Any:
    """proposer None: plain decoding, unless `method` names a built-in proposer (ngram)."""
    spec = None
    if proposer is not None or method:
        spec = SpeculativeConfig(method=method or "ngram", num_tokens=k, adaptive=False)
    return launch_engine(
        model,
        tok,
        eos_token_ids=(),
        max_total_tokens=8192,
        scheduler_config=SchedulerConfig(max_num_batched_tokens=512, max_running_requests=4),
        engine_config=EngineConfig(jump_forward=False, check_integrity=False, overlap=False),
        speculative=spec,
        proposer=proposer,
    )


def run_once(
    engine: Any, prompt: list[int], n: int, stream: bool = False, setup: Any = None
) -> tuple[list[int], dict[str, float], int]:
    """One request through `engine` (setup: switches its mode first): its output, the
    phases' seconds, the steps it took."""
    phases = engine._bench_phases
    if setup is not None:
        setup()
    phases.clear()
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    result = engine.submit(EngineRequest(tuple(prompt), params), stream).result(timeout=600)
    steps = engine._bench_steps[0]
    engine._bench_steps[0] = 0
    return list(result.token_ids), dict(phases), steps


def tiny_engines(args: Any, ks: list[int], oracles: list[PerfectOracle]) -> tuple[dict, dict, int]:
    """One engine per row on the tiny random Llama (CPU), each with its own proposer."""
    tok = load_tokenizer(resolve_model())
    config = replace(TINY, vocab_size=args.vocab)
    model = build_model(config, device="cpu", dtype="float32")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, w in model.named_parameters():
            w.fill_(1.0) if name.endswith("norm.weight") else w.normal_(0.0, args.std, generator=g)
    engines: dict[str, Any] = {"plain": make_engine(model, tok, None, 1)}
    for k in ks:
        oracles.append(PerfectOracle(args.vocab, k))
        engines[f"k{k}"] = make_engine(model, tok, oracles[-1], k)
    if args.tree_k:
        oracles.append(PerfectOracle(args.vocab, args.tree_k, tree=True))
        engines[f"tree{args.tree_k}"] = make_engine(model, tok, oracles[-1], args.tree_k)
    if args.ngram_k:
        engines[f"ngram{args.ngram_k}"] = make_engine(model, tok, None, args.ngram_k, "ngram")
    return engines, {}, args.vocab


def runtime_modes(args: Any, ks: list[int], oracles: list[PerfectOracle]) -> tuple[dict, dict, int]:
    """One lp.Runtime (--model: "bundled", or a preset with --dummy; --device, --dtype; its
    CUDA graphs on a GPU); each row a mode of its engine, switched before each run:
    speculation off (plain), or on with the row's proposer."""
    import lmprog as lp

    most = max([*ks, args.tree_k, args.ngram_k, 1])
    kw: dict[str, Any] = dict(
        device=args.device,
        dtype=args.dtype,
        speculative={"method": "ngram", "num_tokens": most, "adaptive": False},
        max_running_requests=4,
        num_threads=args.threads if args.device == "cpu" else None,
    )
    if args.model != "bundled":
        kw.update(model=args.model, load_format="dummy" if args.dummy else "auto")
    rt = lp.Runtime(**kw)
    engine = rt.engine
    spec = engine.speculator
    vocab = rt.model_config.vocab_size
    ngram = spec.proposer

    def mode(proposer: Proposer | None, name: str) -> Any:
        def setup() -> None:
            engine.set_speculation(proposer is not None)
            if proposer is not None:
                engine.call(lambda: spec.set_proposer(proposer, name))
            rt.flush_cache()

        return setup

    rows: dict[str, Any] = {"plain": mode(None, "plain")}
    for k in ks:
        oracles.append(PerfectOracle(vocab, k))
        rows[f"k{k}"] = mode(oracles[-1], f"k{k}")
    if args.tree_k:
        oracles.append(PerfectOracle(vocab, args.tree_k, tree=True))
        rows[f"tree{args.tree_k}"] = mode(oracles[-1], f"tree{args.tree_k}")
    if args.ngram_k:
        rows[f"ngram{args.ngram_k}"] = mode(ngram, f"ngram{args.ngram_k}")
    return {name: engine for name in rows}, rows, vocab


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", type=int, default=256, help="tokens generated per run")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--ks", default="2,4,8", help="chain lengths (drafts per verify)")
    p.add_argument("--tree-k", type=int, default=8, help="tree nodes per verify (0: no tree)")
    p.add_argument(
        "--ngram-k", type=int, default=8, help="the n-gram proposer's drafts (0: no such row)"
    )
    p.add_argument(
        "--std", type=float, default=0.3, help="weights' std (0.1: text that repeats itself)"
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="stream the pieces (each wakes this thread, which then takes the GIL)",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--model",
        default=None,
        help="None: the tiny random Llama (CPU, one engine per row); 'bundled' (the default "
        "model) or a preset (with --dummy): one lp.Runtime on --device, rows as its modes",
    )
    p.add_argument("--dummy", action="store_true", help="--model: random weights")
    p.add_argument(
        "--allow-differ",
        action="store_true",
        help="mark (*) rows whose output differs from plain instead of stopping (bf16)",
    )
    p.add_argument("--device", default="cpu", help="--model: the runtime's device")
    p.add_argument("--dtype", default="auto", help="--model: the runtime's dtype")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--vocab",
        type=int,
        default=1024,
        help="the model's vocabulary (the tokenizer's first ids; 49152: the whole, whose "
        "logits rows then dominate the forward's time on a CPU)",
    )
    p.add_argument("--profile", default=None, help="cProfile one run of this engine (e.g. k4)")
    p.add_argument("--sort", default="tottime", help="--profile: pstats sort key")
    p.add_argument("--top", type=int, default=30, help="--profile: rows printed")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ks = [int(x) for x in args.ks.split(",") if x]
    oracles: list[PerfectOracle] = []
    if args.model is None:
        engines, setups, vocab = tiny_engines(args, ks, oracles)
    else:
        engines, setups, vocab = runtime_modes(args, ks, oracles)
    prompt = [100 + (7 * i) % (vocab - 100) for i in range(args.prompt_len)]
    for e in {id(e): e for e in engines.values()}.values():
        e._bench_phases = e.call(lambda e=e: instrument(e))
        e._bench_steps = [0]
        inner = e._step

        def count(inner: Any = inner, c: list[int] = e._bench_steps) -> None:
            c[0] += 1
            inner()

        e._step = count  # the engine thread calls self._step: counted (set before requests)

    reference, _, _ = run_once(engines["plain"], prompt, args.tokens, setup=setups.get("plain"))
    for o in oracles:
        o.known = prompt + reference
    rows: dict[str, list[tuple[float, dict[str, float], int]]] = defaultdict(list)
    differ: set[str] = set()  # rows whose output differed from the plain one (--allow-differ)
    for _ in range(args.rounds):
        for name, e in engines.items():
            out, phases, steps = run_once(e, prompt, args.tokens, args.stream, setups.get(name))
            if out != reference:
                if not args.allow_differ:
                    raise SystemExit(f"{name}: output differs from the plain run's")
                differ.add(name)
            rows[name].append((phases["step"] + phases.get("publish", 0.0), phases, steps))
    if args.profile:
        e = engines[args.profile]
        setups.get(args.profile, lambda: None)()
        prof = cProfile.Profile()
        e.call(prof.enable)
        run_once(e, prompt, args.tokens, args.stream)
        e.call(prof.disable)
        pstats.Stats(prof).sort_stats(args.sort).print_stats(args.top)

    print(
        f"batch 1, {args.tokens} tokens, greedy, {args.rounds} rounds (medians), "
        f"{torch.get_num_threads()} thread(s); ms per step by phase"
    )
    head = ["engine", "steps", "tok/step", "ms/step", "ms/token", "vs plain", *PHASES]
    print(" | ".join(head))
    plain_tok = None
    for name, runs in rows.items():
        steps = runs[0][2]
        step_s = statistics.median(r[0] for r in runs)
        per_step = step_s / steps * 1e3
        per_token = step_s / args.tokens * 1e3
        plain_tok = plain_tok or per_token
        cells = []
        for ph in PHASES:
            if ph == "other":
                known = sum(statistics.median(r[1].get(q, 0.0) for r in runs) for q in PHASES[:-1])
                v = step_s - known
            else:
                v = statistics.median(r[1].get(ph, 0.0) for r in runs)
            cells.append(f"{v / steps * 1e3:.3f}")
        print(
            " | ".join(
                [
                    name + ("*" if name in differ else ""),
                    str(steps),
                    f"{args.tokens / steps:.2f}",
                    f"{per_step:.3f}",
                    f"{per_token:.3f}",
                    f"{plain_tok / per_token:.2f}x",
                    *cells,
                ]
            )
        )
    for e in {id(e): e for e in engines.values()}.values():
        e.shutdown()


if __name__ == "__main__":
    main()
