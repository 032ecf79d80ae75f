"""Speculative decoding (issue 6): acceptance rate and speedup against plain decoding, both
measured in the same run on the same engine (`Engine.set_speculation` switches it per run).

    python bench/bench_speculative.py                       # CPU, default model, n-gram
    python bench/bench_speculative.py --threads 2 --batches 1,8,64
    python bench/bench_speculative.py --tree-branches 3 --batches 8   # none vs chain vs tree
    python bench/bench_speculative.py --tree-branches 3 --workload repetitive --batches ''
    python bench/bench_speculative.py --device cuda --preset llama-3.1-8b --dummy
    python bench/bench_speculative.py --device cuda --preset llama-3.1-8b --dummy \\
        --method draft --draft-model llama-3.2-1b --draft-dummy
    python bench/bench_speculative.py --device cuda --preset llama-3.1-8b --dummy \\
        --method draft --draft-model self --draft-cost 0   # the target drafts for itself
        # (upper bound; --draft-cost 0, else the measured proposing cost, a whole step per
        # draft, rightly stops it)

Workload. With a tokenizer (the default model): copy-heavy chat requests whose answers copy
the input — repeat / rewrite / fix / extract over a few paragraphs (summarization and
extraction as in the issue), greedy, natural stops, at most --max-tokens tokens. With a
dummy preset (random weights, no tokenizer): random token-id prompts, greedy, ignore_eos;
what the drafts are worth then depends on how repetitive the random model's output is, so
those numbers measure the machinery (verify cost, back-off), not a real acceptance rate.

1. batch 1: per prompt, decode tokens/s with speculation off and on, prefill excluded
   (time of an n-token generation minus that of a 1-token one, cache flushed; the two modes
   take turns within each repeat, the best repeat counts). Outputs must be identical.
2. batch B (--batches): B requests submitted together (prompts cycled), output tokens/s of
   the whole run (prefill included, cache flushed), off vs on: at large batches the
   adaptive rule stops speculating (compute-bound steps), so the ratio should stay ~1.

--tree-branches B (n-gram only): three modes take turns instead of two: "off", "chain" (the
n-gram chain) and "tree" (n-gram token trees of up to B continuations, ngram_branches=B),
each with num_tokens drafts at most; "on" in the tables is the chain, "tree" beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARAGRAPHS = [
    "The city council met on Tuesday evening to discuss the new public library. The building will "
    "have three floors, a reading garden on the roof and a children's section with two hundred "
    "computers. Construction starts in April and should be finished by the end of next year. The "
    "mayor said the library would be open every day from eight in the morning until ten at night.",
    "Our quarterly results were strong. Revenue grew by twelve percent to four hundred million "
    "dollars, driven by the new cloud storage products. Operating costs stayed flat, and the "
    "company hired three hundred engineers in Berlin and Toronto. The board approved a dividend "
    "of forty cents per share, payable on the first of June.",
    "To reset the router, unplug it from the wall and wait thirty seconds. Plug it back in and "
    "wait until the green light stops blinking. Then open a browser, go to the settings page and "
    "log in with the password printed on the bottom of the device. Choose a new network name and "
    "save the changes.",
    "Dr. Amelia Hart, a marine biologist from Plymouth, has studied coral reefs for twenty years. "
    "In her new book she describes how rising water temperatures bleach the reefs, and how small "
    "changes in fishing rules helped two reefs in the Pacific recover within a decade.",
]
# --workload repetitive: texts whose phrases recur with different endings, so that the
# sequence's suffix occurs in several places (what n-gram token trees are for)
REPETITIVE = [
    "The cat sat on the mat. The cat sat on the hat. The cat sat on the bat. The dog ran to the "
    "park. The dog ran to the lake. The dog ran to the gate. The bird flew over the house. The "
    "bird flew over the river. The bird flew over the tree.",
    "Step one: open the box. Step two: open the bag. Step three: open the lid. Then close the "
    "box, then close the bag, then close the lid. Check the box twice, check the bag once, check "
    "the lid again.",
]
TASKS = [
    "Repeat the following text exactly, word for word.",
    "Fix the punctuation of the following text and return the whole corrected text.",
    "Rewrite the following text in the past tense, changing as little as possible.",
    "Extract every sentence of the following text that contains a number, one per line.",
]


def log(*args) -> None:
    print(*args, flush=True)


def text_prompts(rt, workload: str = "copy") -> list[list[int]]:
    tok = rt.tokenizer
    out = []
    for para in REPETITIVE if workload == "repetitive" else PARAGRAPHS:
        for task in TASKS:
            msgs = [{"role": "user", "content": f"{task}\n\n{para}"}]
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            out.append(list(tok.encode(text, add_special_tokens=False)))
    return out


def random_prompts(vocab: int, n: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(n)]


def make_runtime(args):
    import lmprog as lp

    spec = {
        "method": "ngram" if args.method == "draft" and args.draft_model == "self" else args.method,
        "num_tokens": args.num_tokens,
        "adaptive": not args.no_adaptive,
        "ngram_min": args.ngram_min,
        "ngram_max": args.ngram_max,
        "draft_cost": args.draft_cost,
        "max_step_tokens": args.max_step_tokens,
    }
    if args.method == "draft" and args.draft_model != "self":
        spec.update(
            draft_model=args.draft_model, draft_load_format="dummy" if args.draft_dummy else "auto"
        )
    kw = dict(
        device=args.device,
        dtype=args.dtype,
        speculative=spec,
        max_running_requests=args.max_running,
        max_num_batched_tokens=args.chunk,
        num_threads=args.threads if args.device == "cpu" else None,
        quantization=args.quantization,
    )
    if args.kv_tokens:
        kw["max_total_tokens"] = args.kv_tokens
    if args.preset:
        kw.update(model=args.preset, load_format="dummy" if args.dummy else "auto")
    rt = lp.Runtime(**kw)
    if args.method == "draft" and args.draft_model == "self":
        use_self_as_draft(rt)
    return rt


def use_self_as_draft(rt) -> None:
    """Swap in a draft-model proposer that runs the target's own module (own KV pool): every
    greedy draft is accepted, so this bounds what any draft model could give."""
    from lmprog.runtime.speculative.draft import DraftModelProposer

    spec = rt.engine.speculator

    def swap() -> None:
        spec.proposer = DraftModelProposer(
            rt.engine.runner.model, vocab_size=rt.model_config.vocab_size
        )
        spec.name = "draft(self)"

    rt.engine.call(swap)


def generate(rt, prompt: list[int], params: dict):
    rt.flush_cache()
    return rt.generate_offline([prompt], params)[0]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def spec_counters(rt) -> tuple[int, int, int]:
    s = rt.stats()
    return s["spec_verified_tokens"], s["spec_accepted_tokens"], s["spec_verify_steps"]


def set_mode(rt, mode: str, args) -> None:
    """off: no speculation; on / chain: the configured proposer; tree: n-gram token trees."""
    rt.engine.set_speculation(mode != "off")
    if args.tree_branches is None or mode == "off":
        return
    from lmprog.runtime.speculative.ngram import NgramProposer

    branches = args.tree_branches if mode == "tree" else 1
    spec = rt.engine.speculator
    proposer = NgramProposer(args.ngram_min, args.ngram_max, branches)
    rt.engine.call(lambda: spec.set_proposer(proposer, f"ngram(branches={branches})"))


def modes_of(args) -> tuple[str, ...]:
    return ("off", "on") if args.tree_branches is None else ("off", "on", "tree")


def batch1(rt, prompts: list[list[int]], params: dict, repeats: int, args) -> dict:
    """Decode tokens/s (prefill excluded) per mode, per prompt and in total; acceptance and
    identical outputs of each speculating mode against "off"."""
    modes = modes_of(args)
    tot = dict.fromkeys(modes, 0.0)
    tokens = 0
    identical = dict.fromkeys(modes, 0)
    counters = {m: [0, 0, 0] for m in modes}
    for i, prompt in enumerate(prompts):
        best = dict.fromkeys(modes, float("inf"))
        outs, delta = {}, {m: [0, 0, 0] for m in modes}
        for _ in range(repeats):
            for mode in modes:
                set_mode(rt, mode, args)
                t1, _ = timed(lambda: generate(rt, prompt, {**params, "max_tokens": 1}))
                before = spec_counters(rt)
                tn, out = timed(lambda: generate(rt, prompt, params))
                after = spec_counters(rt)
                if tn - t1 < best[mode]:
                    best[mode] = max(tn - t1, 1e-9)
                    delta[mode] = [a - b for a, b in zip(after, before)]
                outs[mode] = out
        n = outs["off"].completion_tokens - 1
        tokens += n
        line = f"   prompt {i:2d}: {n + 1:4d} tokens  off {n / best['off']:7.1f} tok/s"
        for mode in modes:
            tot[mode] += best[mode]
            counters[mode] = [c + d for c, d in zip(counters[mode], delta[mode])]
            identical[mode] += outs["off"].token_ids == outs[mode].token_ids
            if mode == "off":
                continue
            d = delta[mode]
            per = (d[1] + d[2]) / d[2] if d[2] else 0.0
            line += (
                f"  {mode} {n / best[mode]:7.1f} tok/s x{best['off'] / best[mode]:.2f} "
                f"({per:.2f}/verify)"
            )
        log(line)
    out = {"tokens": tokens, "n": len(prompts), "modes": {}}
    for mode in modes:
        verified, accepted, verifies = counters[mode]
        out["modes"][mode] = {
            "tok_s": tokens / tot[mode],
            "speedup": tot["off"] / tot[mode],
            "identical": identical[mode],
            "acceptance": accepted / verified if verified else 0.0,
            "per_verify": (accepted + verifies) / verifies if verifies else 0.0,
        }
    return out


def warm_up(rt, prompts: list[list[int]], params: dict, args) -> None:
    """Compile and capture what the measured runs use (Triton kernels, extend shapes) in
    every mode, so that no timed run pays for it."""
    for mode in modes_of(args):
        set_mode(rt, mode, args)
        generate(rt, prompts[0], {**params, "max_tokens": 16})
        rt.flush_cache()
        rt.generate_offline(prompts[:8], {**params, "max_tokens": 4})


def batched(rt, prompts: list[list[int]], params: dict, size: int, repeats: int, args) -> dict:
    modes = modes_of(args)
    batch = [prompts[i % len(prompts)] for i in range(size)]
    for mode in modes:  # the batch's own prefill shapes
        set_mode(rt, mode, args)
        rt.flush_cache()
        rt.generate_offline(batch, {**params, "max_tokens": 2})
    best = dict.fromkeys(modes, float("inf"))
    outs, tokens = {}, {}
    delta = {m: [0, 0, 0] for m in modes}
    for _ in range(repeats):
        for mode in modes:
            set_mode(rt, mode, args)
            rt.flush_cache()
            before = spec_counters(rt)
            t, res = timed(lambda: rt.generate_offline(batch, params))
            delta[mode] = [a - b for a, b in zip(spec_counters(rt), before)]
            best[mode] = min(best[mode], t)
            outs[mode] = [r.token_ids for r in res]
            tokens[mode] = sum(r.completion_tokens for r in res)
    out = {"size": size, "modes": {}}
    for mode in modes:
        d = delta[mode]
        out["modes"][mode] = {
            "tok_s": tokens[mode] / best[mode],
            "ratio": (tokens[mode] / best[mode]) / (tokens["off"] / best["off"]),
            "identical": sum(a == b for a, b in zip(outs["off"], outs[mode])),
            "verified": d[0],
            "acceptance": d[1] / d[0] if d[0] else 0.0,
            "per_verify": (d[1] + d[2]) / d[2] if d[2] else 0.0,
        }
    return out


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--preset", default=None, help="architecture preset or model (default: the bundled model)"
    )
    p.add_argument("--dummy", action="store_true", help="random weights (load_format='dummy')")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default=None, choices=[None, "int4"])
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--method", default="ngram", choices=["ngram", "draft"])
    p.add_argument("--draft-model", default=None, help="draft model, preset, or 'self'")
    p.add_argument("--draft-dummy", action="store_true", help="random draft weights")
    p.add_argument("--num-tokens", type=int, default=8)
    p.add_argument("--ngram-min", type=int, default=2)
    p.add_argument("--ngram-max", type=int, default=4)
    p.add_argument(
        "--tree-branches",
        type=int,
        default=None,
        help="also run n-gram token trees of this many branches (modes off / chain / tree)",
    )
    p.add_argument("--no-adaptive", action="store_true")
    p.add_argument("--draft-cost", type=float, default=None)
    p.add_argument("--max-step-tokens", type=int, default=None)
    p.add_argument(
        "--workload",
        default="copy",
        choices=["copy", "repetitive"],
        help="copy: the copy-heavy paragraphs; repetitive: texts whose phrases recur",
    )
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--prompts", type=int, default=8, help="batch-1 prompts")
    p.add_argument("--batches", default="64", help="comma-separated batch sizes ('' for none)")
    p.add_argument("--batch-max-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=256, help="dummy prompts' length")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-running", type=int, default=64)
    p.add_argument("--chunk", type=int, default=2048)
    p.add_argument("--kv-tokens", type=int, default=None)
    args = p.parse_args()
    if args.method == "draft" and not args.draft_model:
        p.error("--method draft needs --draft-model")
    if args.tree_branches is not None and (args.method != "ngram" or args.tree_branches < 2):
        p.error("--tree-branches needs --method ngram and at least 2 branches")
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    rt = make_runtime(args)
    log(
        f"model {rt.model_name} on {rt.device} ({rt.dtype}), speculative "
        f"{rt.stats()['speculative']}, num_tokens {args.num_tokens}, adaptive "
        f"{not args.no_adaptive}; loaded in {time.perf_counter() - t0:.1f} s"
    )
    try:
        text = args.preset is None or not args.dummy
        if text:
            prompts = text_prompts(rt, args.workload)
            params = {"temperature": 0.0}
        else:
            prompts = random_prompts(rt.model_config.vocab_size, 16, args.prompt_len)
            params = {"temperature": 0.0, "ignore_eos": True}
        warm_up(rt, prompts, params, args)
        log(
            f"\n== batch 1: {args.prompts} {args.workload} prompts, <= {args.max_tokens} tokens"
            if text
            else f"\n== batch 1: {args.prompts} random prompts, {args.max_tokens} tokens"
        )
        one = batch1(
            rt,
            prompts[: args.prompts],
            {**params, "max_tokens": args.max_tokens},
            args.repeats,
            args,
        )
        log(f"   total: {one['tokens']} decode tokens")
        for mode, m in one["modes"].items():
            log(
                f"   {mode:5s} {m['tok_s']:7.1f} tok/s, speedup x{m['speedup']:.2f}, acceptance "
                f"{m['acceptance']:.0%}, {m['per_verify']:.2f} tokens per verify, identical "
                f"outputs {m['identical']}/{one['n']}"
            )
        for size in [int(b) for b in args.batches.split(",") if b.strip()]:
            log(f"\n== batch {size}: {size} requests at once, <= {args.batch_max_tokens} tokens")
            r = batched(
                rt,
                prompts,
                {**params, "max_tokens": args.batch_max_tokens},
                size,
                args.repeats,
                args,
            )
            for mode, m in r["modes"].items():
                log(
                    f"   {mode:5s} {m['tok_s']:7.1f} tok/s, ratio x{m['ratio']:.2f}; "
                    f"{m['verified']} drafts verified (acceptance {m['acceptance']:.0%}, "
                    f"{m['per_verify']:.2f} tokens per verify); identical outputs "
                    f"{m['identical']}/{size}"
                )
    finally:
        rt.shutdown()


if __name__ == "__main__":
    main()
