"""LoRA adapters on the llama.cpp backend (issue 37): what k adapters decoding together cost,
beside the same requests on the base model. llama.cpp applies one adapter set per context, so
a step runs one llama_decode per adapter among its requests.

    python3 bench/bench_llamacpp_lora.py                     # the default model, 8 requests
    python3 bench/bench_llamacpp_lora.py --requests 8 --tokens 64 --threads 2

Rows: every request on the base model; then requests spread round-robin over k random PEFT
adapters (rank 8 on all seven projections, converted to GGUF LoRA on loading), the base
model's share 0. Each row: generated tokens/s over the wall time of the whole batch (greedy,
ignore_eos, the same prompt per request, its prefix cache flushed between rows).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))

from lora_testing import write_adapter

from lmprog.backends import LlamaCpp
from lmprog.core.models import resolve_model
from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams
from lmprog.runtime.models.loaders.gguf import read_gguf


def run(backend: LlamaCpp, names: list[str | None], tokens: int) -> float:
    """Generated tokens/s of len(names) concurrent requests, request i under names[i]."""
    backend.flush_cache()
    out: list = [None] * len(names)

    def one(i: int) -> None:
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True,
                                lora_path=names[i])  # fmt: skip
        out[i] = backend.generate(GenerateRequest(f"Story {i}: once upon a time", params))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(names))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(r.completion_tokens for r in out) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--adapters", type=int, nargs="+", default=[1, 2, 4, 8])
    args = ap.parse_args()
    source = resolve_model()
    config = read_gguf(source.path).config
    root = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    paths = {f"a{i}": str(write_adapter(root / f"a{i}", config, rank=8, std=0.02, seed=i))
             for i in range(max(args.adapters))}  # fmt: skip
    backend = LlamaCpp(n_ctx=4096, n_parallel=args.requests, n_threads=args.threads,
                       n_threads_batch=args.threads, lora_paths=paths)  # fmt: skip
    try:
        run(backend, [None] * 2, 4)  # warm-up
        base = run(backend, [None] * args.requests, args.tokens)
        print(f"base model, {args.requests} requests: {base:7.1f} tok/s")
        for k in args.adapters:
            names = [f"a{i % k}" for i in range(args.requests)]
            rate = run(backend, names, args.tokens)
            print(f"{k} adapter(s):                {rate:7.1f} tok/s  ({rate / base:.0%} of base)")
    finally:
        backend.shutdown()


if __name__ == "__main__":
    main()
