"""SGLang-paper style workloads on the CPU, the bundled model (issue 4's benchmark).

Workloads: 5-shot MMLU-like multiple choice, tree-of-thought (three levels of fork(2)),
4-turn chat, JSON extraction. Each runs through the DSL on:
  runtime/cache-on   lp.Runtime(radix_cache=True)
  runtime/cache-off  lp.Runtime(radix_cache=False)
  llamacpp           lp.LlamaCpp(n_threads=1)
and prints wall time, programs/s, generated tokens/s, the cache hit rate, and the ratio of
cache-on to cache-off throughput (target on the few-shot workload: >= 3x).

    python bench/bench_workloads.py [--workloads fewshot,tot,chat,json] [--n 32]

On a GPU (issue 5): `--gpu-shape llama-3.1-8b --tokenizer DIR` runs the two runtime backends
on CUDA with random bf16 weights of that architecture, its vocabulary resized to the
tokenizer's (DIR: a saved Hugging Face tokenizer folder, e.g. the bundled model's, written by
`--save-tokenizer DIR` on a machine that has the model). Outputs are then random text under
the same prompts, prefixes, forks and constraints, so the cache on/off ratios measure the
runtime's prefix sharing at that model size; stop strings rarely fire, so gens run to their
max_tokens.

    python bench/bench_workloads.py --save-tokenizer .tok
    python3 bench/bench_workloads.py --gpu-shape llama-3.1-8b --tokenizer .tok \
        --backends runtime-cache-on,runtime-cache-off --n 64
"""

from __future__ import annotations

import argparse
import random
import time

import torch

import lmprog as lp

SUBJECTS = ["astronomy", "biology", "chemistry", "geography", "history", "physics"]


def _mc_question(rng: random.Random, i: int) -> tuple[str, str]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    options = [a + b, a + b + rng.randint(1, 9), a + b - rng.randint(1, 9), a * 2]
    rng.shuffle(options)
    letter = "ABCD"[options.index(a + b)]
    body = f"Question {i} ({rng.choice(SUBJECTS)}): what is {a} + {b}?\n" + "".join(
        f"{'ABCD'[k]}. {o}\n" for k, o in enumerate(options)
    )
    return body, letter


def _few_shot_header(rng: random.Random) -> str:
    header = "The following are multiple choice questions with answers. Think carefully.\n\n"
    for i in range(5):
        body, letter = _mc_question(rng, i)
        header += (
            body
            + f"Answer: {letter}. This is the correct option because the sum is computed digit by digit.\n\n"
        )
    return header


@lp.function
def mmlu(s, header, question):
    s += header
    s += question + "Answer:" + lp.gen("answer", max_tokens=2, temperature=0)


@lp.function
def tree_of_thought(s, problem):
    s += lp.system("You solve problems step by step.")
    s += lp.user(f"Problem: {problem}")
    level = [s]
    for depth in range(3):
        next_level = []
        for node in level:
            forks = node.fork(2)
            forks += lambda i: lp.assistant(
                lp.gen(f"step{depth}", max_tokens=12, temperature=0.7, seed=depth * 10 + i)
            )
            next_level.extend(forks)
        level = next_level
    for leaf in level:
        leaf.sync()


@lp.function
def chat(s, topic):
    s += lp.system("You are a helpful assistant. Answer in one sentence.")
    for turn in range(4):
        s += lp.user(f"Tell me fact number {turn + 1} about {topic}.")
        s += lp.assistant(lp.gen(f"reply{turn}", max_tokens=16, temperature=0))


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 16},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@lp.function
def extract(s, text):
    s += lp.system("Extract the person described in the text as JSON.")
    s += lp.user(text)
    s += lp.assistant(lp.gen("json", json_schema=SCHEMA, max_tokens=48, temperature=0))


def workloads(n: int) -> dict[str, tuple[object, list[dict]]]:
    rng = random.Random(0)
    header = _few_shot_header(rng)
    names = ["Ada", "Alan", "Grace", "Linus", "Ken", "Barbara", "Edsger", "Donald"]
    cities = ["Paris", "London", "Oslo", "Rome"]
    return {
        "fewshot": (
            mmlu,
            [{"header": header, "question": _mc_question(rng, 100 + i)[0]} for i in range(n)],
        ),
        "tot": (
            tree_of_thought,
            [{"problem": f"Plan a {k}-day trip."} for k in range(2, 2 + max(2, n // 8))],
        ),
        "chat": (chat, [{"topic": t} for t in (SUBJECTS * 4)[: max(2, n // 4)]]),
        "json": (
            extract,
            [
                {"text": f"{names[i % 8]} is {20 + i} years old and lives in {cities[i % 4]}."}
                for i in range(max(2, n // 2))
            ],
        ),
    }


def run(backend, name: str, func, batch: list[dict]) -> dict:
    t0 = time.perf_counter()
    states = func.run_batch(batch, backend=backend, num_threads=8)
    elapsed = time.perf_counter() - t0
    errors = [st.error() for st in states if st.error() is not None]
    if errors:
        raise RuntimeError(f"{name}: {len(errors)} programs failed, first: {errors[0]!r}")
    return {"seconds": elapsed, "programs/s": len(batch) / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", default="fewshot,tot,chat,json")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--backends", default="runtime-cache-on,runtime-cache-off,llamacpp")
    parser.add_argument("--gpu-shape", help="random-weight architecture preset on CUDA")
    parser.add_argument("--tokenizer", help="tokenizer folder for --gpu-shape")
    parser.add_argument("--device", default="cuda", help="device for --gpu-shape")
    parser.add_argument("--save-tokenizer", help="write the bundled model's tokenizer here, exit")
    args = parser.parse_args()
    if args.save_tokenizer:
        from lmprog.core.models import load_tokenizer, resolve_model

        load_tokenizer(resolve_model()).save_pretrained(args.save_tokenizer)
        return
    torch.set_num_threads(2)
    chosen = args.workloads.split(",")
    loads = {k: v for k, v in workloads(args.n).items() if k in chosen}
    runtime = (
        _gpu_runtime(args)
        if args.gpu_shape
        else (lambda radix: lp.Runtime(device="cpu", radix_cache=radix))
    )
    makers = {
        "runtime-cache-on": lambda: runtime(True),
        "runtime-cache-off": lambda: runtime(False),
        "llamacpp": lambda: lp.LlamaCpp(n_threads=1),
    }
    results: dict[tuple[str, str], dict] = {}
    for bname in args.backends.split(","):
        backend = makers[bname]()
        for wname, (func, batch) in loads.items():
            func.run_batch(batch[:1], backend=backend)  # warm-up (compiles constraint indexes)
            before = backend.stats()
            r = run(backend, wname, func, batch)
            after = backend.stats()
            r["hit_rate"] = _hit_rate(before, after)
            results[(bname, wname)] = r
            print(
                f"{bname:18s} {wname:8s} {r['seconds']:7.2f} s  {r['programs/s']:7.2f} prog/s  "
                f"cache hit {r['hit_rate']}",
                flush=True,
            )
        backend.shutdown()
    print("\n| workload | backend | seconds | programs/s | cache hit rate | vs cache off |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (bname, wname), r in results.items():
        off = results.get(("runtime-cache-off", wname))
        ratio = f"{r['programs/s'] / off['programs/s']:.2f}x" if off else "-"
        print(
            f"| {wname} | {bname} | {r['seconds']:.2f} | {r['programs/s']:.2f} | {r['hit_rate']} | {ratio} |"
        )


def _gpu_runtime(args):
    """A maker of CUDA runtimes with random weights of args.gpu_shape in the tokenizer's
    vocabulary (see the module docstring)."""
    import dataclasses

    from transformers import AutoTokenizer

    from lmprog.runtime.models import PRESETS

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    name = f"{args.gpu_shape}-vocab{len(tok)}"
    PRESETS[name] = dataclasses.replace(  # this process only
        PRESETS[args.gpu_shape],
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_ids=(tok.eos_token_id,),
    )
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(f"runtime backends: {name}, random weights on {where}")
    return lambda radix: lp.Runtime(
        model=name,
        load_format="dummy",
        device=args.device,
        tokenizer=tok,
        radix_cache=radix,
        max_total_tokens=200_000,
        max_running_requests=128,
        max_num_batched_tokens=8192,
    )


def _hit_rate(before: dict, after: dict) -> str:
    """Cache hit rate over the run: reused prompt tokens / prompt tokens, from stats() deltas."""
    for hit_key, total_key in (
        ("cached_tokens", "prompt_tokens"),
        ("tokens_reused", "prompt_tokens"),
    ):
        if hit_key in after and total_key in after:
            hits = after[hit_key] - before.get(hit_key, 0)
            total = after[total_key] - before.get(total_key, 0)
            return f"{hits / total:.1%}" if total else "n/a"
    return "n/a"


if __name__ == "__main__":
    main()
