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

--method eagle (issue 33): a draft head (default: the EAGLE-3 head shipped for the bundled
model; --draft-model a head folder, --draft-dummy a random one shaped for the target). The
modes taking turns: "off", "ngram" (prompt lookup chains), "eagle" (the head's chains) and
"eagle-wW" for each width W of --tree-widths (trees of the head's top-W tokens per depth, at
most num_tokens nodes). --workload takes a comma-separated list; "chat", "json" (JSON
extraction) and "code" (code-like prompts) are assembled below, none taken from the head's
training prompts. A summary table per workload, batch and mode ends the run.

    python bench/bench_speculative.py --method eagle --workload chat,json,code --batches 8,32

--verify-cost (issue 33): no generation; the forward of one verify step (chain and token
tree of N nodes, N in --verify-nodes) against one plain decode step, at each batch of
--verify-batches, through the model runner as the engine calls it (CUDA graphs where they
serve), timed with CUDA events (synchronized) or the wall clock on a CPU, median of
--repeats; with a draft head (--method eagle) also the steps that capture its hidden states,
and the head's proposing of N drafts (a chain, and a tree of top --verify-width per depth)
per request in the steady state: the speedup at an accepted length L is then about
L / (verify + propose), both in decode steps.

    python bench/bench_speculative.py --verify-cost --preset llama-3.1-8b --dummy --device cuda
    python bench/bench_speculative.py --verify-cost --preset smollm2-135m --dummy \\
        --verify-nodes 4,8 --verify-batches 1,2 --repeats 3      # CPU smoke run
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


# --workload chat / json / code (issue 33): prompts written for this bench (the EAGLE-3 head
# was trained on scripts/train_draft_head.py's templates, none of which appear here)
CHAT = [
    "How do I make a good cup of green tea?",
    "What should I pack for a weekend hiking trip in the mountains?",
    "Describe how the gears on a bicycle work.",
    "What is the difference between weather and climate?",
    "Give me five tips for learning a new language as an adult.",
    "How does a refrigerator keep food cold?",
    "Tell me a short story about a lighthouse keeper and a storm.",
    "What are good habits for staying focused while studying?",
    "Explain why the sky is blue to a curious teenager.",
    "How should I prepare for my first job interview?",
    "What are the main differences between cats and dogs as pets?",
    "Suggest a simple weekly plan for someone who wants to start running.",
    "Why do leaves change color in autumn?",
    "Write a friendly email inviting my neighbours to a garden party on Saturday.",
    "What makes a good password, and how can I remember mine?",
    "Describe a typical day of an astronaut on the space station.",
]
_JSON_TEXTS = [
    (
        'keys "customer", "item", "quantity", "unit_price", "city"',
        [
            "Order 4521: Maria Lopez bought 3 blue notebooks at 4.50 dollars each, shipped to "
            "Denver.",
            "Kenji Sato ordered 12 ceramic mugs for 7.25 dollars apiece; deliver to Osaka.",
            "Please send 2 hiking backpacks (89.99 dollars each) to Grace Mwangi in Nairobi.",
            "Invoice for Tom Becker, Hamburg: 5 desk lamps, 23.00 dollars per lamp.",
        ],
    ),
    (
        'keys "title", "date", "time", "location", "organizer"',
        [
            "The Spring Book Fair opens on April 12 at 10 am in the Central Library, hosted by "
            "the Friends of Reading society.",
            "Join Dr. Priya Nair for a talk on ocean plastics, May 3, 6:30 pm, Hall B of the "
            "Science Museum.",
            "Community cleanup: Saturday June 8 at 9 am, meet at Riverside Park. Organized by "
            "Green Streets.",
            "Jazz night with the Blue Notes trio, July 19 from 8 pm at the Harbor Cafe; tickets "
            "from the Arts Council.",
        ],
    ),
    (
        'keys "product", "brand", "price", "rating", "in_stock"',
        [
            "The Nimbus X2 headphones by Soundwave cost 149 dollars, are rated 4.6 stars and "
            "are currently in stock.",
            "Brightline's 27-inch monitor sells for 299 dollars; customers rate it 4.2, but it "
            "is sold out.",
            "Trailmaster hiking boots from Peakwear, 120 dollars, 4.8 stars, available now.",
            "A 2-liter electric kettle by HomeBrew: 35 dollars, rated 3.9, out of stock.",
        ],
    ),
    (
        'keys "name", "email", "phone", "company", "role"',
        [
            "Hi, I'm Lena Fischer, head of marketing at Northwind Foods. Reach me at "
            "lena.fischer@northwind.example or 555-0142.",
            "Contact: Omar Haddad (omar@brightpath.example), senior engineer, BrightPath "
            "Labs, phone 555-0199.",
            "For billing questions write to Sofia Rossi, accountant at Vela Design, "
            "sofia@vela.example, tel. 555-0103.",
            "Dr. Ama Owusu, research director, Helix Bio; ama.owusu@helix.example; 555-0177.",
        ],
    ),
]
JSON_PROMPTS = [
    f"Extract the information in this text as a JSON object with {keys}. Reply with the JSON "
    f"only.\n\n{text}"
    for keys, texts in _JSON_TEXTS
    for text in texts
]
CODE = [
    "Complete this Python function:\n\n```python\ndef merge_sorted(a: list[int], b: list[int])"
    ' -> list[int]:\n    """Merge two sorted lists into one sorted list."""\n```',
    "Write a Python function that parses one line of a CSV file into a list of fields, "
    "handling quoted fields.",
    "Write a C function that returns the length of a null-terminated string without using strlen.",
    "Rewrite this loop as a list comprehension and explain the change:\n\n```python\nsquares "
    "= []\nfor x in range(20):\n    if x % 3 == 0:\n        squares.append(x * x)\n```",
    "Write a bash script that prints the number of lines of every .txt file in a directory.",
    "Write a Python class `Stack` with push, pop, peek and is_empty methods.",
    "Add type hints and a docstring to this function:\n\n```python\ndef area(w, h):\n    "
    "return w * h\n```",
    "Write a JavaScript function that debounces another function by a given delay.",
    "Write a Python function that returns the n most common words of a text file.",
    "Write a SQL query that lists each department with its number of employees and their "
    "average salary, highest average first.",
    "Fix the bug in this Python function:\n\n```python\ndef mean(xs):\n    total = 0\n    for "
    "x in xs:\n        total += x\n    return total / len(x)\n```",
    "Write a Python generator that yields the prime numbers below a given limit.",
    "Write a Rust function that reverses the words of a sentence.",
    "Write a Python function that flattens a nested list of any depth.",
    "Write a unit test with pytest for a function `is_leap_year(year)`.",
    "Write a Python dataclass for a 2D point with a method returning its distance to "
    "another point.",
]
WORKLOADS = ("copy", "repetitive", "chat", "json", "code")


def log(*args) -> None:
    print(*args, flush=True)


def text_prompts(rt, workload: str = "copy") -> list[list[int]]:
    tok = rt.tokenizer
    if workload in ("copy", "repetitive"):
        paras = REPETITIVE if workload == "repetitive" else PARAGRAPHS
        texts = [f"{task}\n\n{para}" for para in paras for task in TASKS]
    else:
        texts = {"chat": CHAT, "json": JSON_PROMPTS, "code": CODE}[workload]
    out = []
    for text in texts:
        msgs = [{"role": "user", "content": text}]
        chat = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(list(tok.encode(chat, add_special_tokens=False)))
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
    if args.method == "eagle":
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
    if args.method == "eagle":  # the head's proposer, reinstalled by set_mode
        args.head_proposer = rt.engine.speculator.proposer
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
    """off: no speculation; on / chain: the configured proposer; tree: n-gram token trees;
    with --method eagle: ngram, eagle (the head's chains), eagle-wW (its trees of width W)."""
    rt.engine.set_speculation(mode != "off")
    if mode == "off":
        return
    from lmprog.runtime.speculative.ngram import NgramProposer

    spec = rt.engine.speculator
    if args.method == "eagle":
        head = args.head_proposer
        if mode == "ngram":
            proposer, name = NgramProposer(args.ngram_min, args.ngram_max, 1), "ngram"
        else:
            width = int(mode.split("-w")[1]) if "-w" in mode else 1

            def install() -> None:
                head.tree_width = width  # (the engine thread: no propose() runs meanwhile)
                spec.set_proposer(head, mode)

            rt.engine.call(install)
            return
    elif args.tree_branches is None:
        return
    else:
        branches = args.tree_branches if mode == "tree" else 1
        proposer = NgramProposer(args.ngram_min, args.ngram_max, branches)
        name = f"ngram(branches={branches})"
    rt.engine.call(lambda: spec.set_proposer(proposer, name))


def modes_of(args) -> tuple[str, ...]:
    if args.method == "eagle":
        return ("off", "ngram", "eagle", *(f"eagle-w{w}" for w in args.widths))
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


# ---- --verify-cost ------------------------------------------------------------------------
def verify_steps(runner, batch: int, context: int, nodes: int | None, parents, vocab: int):
    """StepInputs of one step of `batch` requests (table rows 0 .. batch - 1) after a prefix
    of `context` tokens each: a plain decode (nodes None: one token per request), or a verify
    entry per request of its pending token and `nodes` drafts, a chain (parents None) or the
    token tree `parents`, with logits at every fed row as the engine's verify entries."""
    import numpy as np

    from lmprog.runtime.draft_tree import depths, mask_block
    from lmprog.runtime.executor.model_runner import StepInputs

    m = 1 if nodes is None else 1 + nodes
    width = context + m  # a row's columns; slot 1 + r * width + c
    g = np.random.default_rng(0)
    ids = g.integers(3, vocab, size=batch * m)
    if parents is None:
        offsets = list(range(m))
    else:
        offsets = [0, *(1 + d for d in depths(parents))]
    positions = np.array([context + o for _ in range(batch) for o in offsets])
    slots = np.array([1 + r * width + context + i for r in range(batch) for i in range(m)])
    rows = np.arange(batch)
    lens = np.full(batch, context + m)
    ext = np.full(batch, m)
    starts = np.arange(batch) * m
    logit_rows = np.arange(batch * m) if nodes is not None else starts
    host = np.concatenate([ids, positions, slots, rows, lens, ext, starts, logit_rows])
    tree = None
    if parents is not None:
        block = mask_block(1, parents, context + m).reshape(-1)
        tree = (np.tile(block, batch), np.arange(batch, dtype=np.int64) * block.size)
    return StepInputs(host.astype(np.int64), batch * m, batch, len(logit_rows), tree=tree)


def fill_rows(runner, batch: int, context: int, nodes: int) -> None:
    """Table rows 0 .. batch - 1: every column's slot (the K/V read are whatever the pool
    holds: random weights make any content equally good)."""
    width = context + 1 + nodes
    need = batch * width + 1
    if need > runner.kv.num_slots:
        raise SystemExit(f"--verify-cost needs {need} KV slots, the pool has {runner.kv.num_slots}")
    cols = torch.arange(width, dtype=torch.int32)
    for r in range(batch):
        runner.req_to_token[r, :width] = (1 + r * width + cols).to(runner.req_to_token.device)


def time_step(runner, step, capture, repeats: int) -> tuple[float, bool]:
    """Median seconds of the step's forward (runner.run / run_capture: input staging, table
    sync, the graphs' replay or the eager forward), and whether CUDA graphs served it."""
    cuda = runner.device.type == "cuda"

    def run():
        if capture is None:
            return runner.run(step)
        return runner.run_capture(step, capture)[0]

    def replays() -> int:
        return sum(getattr(g, "replays", 0) for g in (runner.graphs, runner.piecewise) if g)

    for _ in range(2):  # Triton compiles, first-use allocations
        run()
    before = replays()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2], replays() - before == repeats


def time_propose(proposer, batch: int, context: int, nodes: int, width: int, repeats: int):
    """Median seconds of the EAGLE head proposing at most `nodes` drafts (a chain, or a tree
    of its top-`width` per depth) for each of `batch` requests in the steady state: before
    each call every request hands over the features of one more token (a verify step that
    accepted nothing), so a call is one fed feature per request and the draft steps.
    Random features: what is timed does not depend on them."""
    from lmprog.runtime.speculative.proposer import ProposalInput

    cuda = proposer.device.type == "cuda"
    g = torch.Generator().manual_seed(0)
    feats = proposer.head.fc.in_features  # the target's captured layers, concatenated

    def features(n: int) -> torch.Tensor:
        return torch.randn(n, feats, generator=g).to(proposer.device, proposer.dtype)

    rids = [("verify-cost", r) for r in range(batch)]
    tokens = [[3 + (r * 7 + i) % 500 for i in range(context + 1)] for r in range(batch)]
    saved, proposer.tree_width = proposer.tree_width, width
    try:
        for rid in rids:
            proposer.observe(rid, 0, features(context))
        proposer.propose([ProposalInput(rid, t, nodes) for rid, t in zip(rids, tokens)])
        times, empty = [], 0
        for i in range(repeats + 2):  # two warm-up calls
            for rid, t in zip(rids, tokens):
                t.append(3 + i)
                proposer.observe(rid, len(t) - 2, features(1))
            inputs = [ProposalInput(rid, t, nodes) for rid, t in zip(rids, tokens)]
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = proposer.propose(inputs)
            if cuda:
                torch.cuda.synchronize()
            if i >= 2:
                times.append(time.perf_counter() - start)
            empty += sum(not p.token_ids for p in out)
        if empty:
            log(f"   (warning: {empty} empty proposals while timing the head)")
    finally:
        for rid in rids:
            proposer.release(rid)
        proposer.tree_width = saved
    times.sort()
    return times[len(times) // 2]


def verify_cost(rt, args) -> list[dict]:
    """Every (batch, step kind) measured on the engine thread (between steps: idle)."""
    from lmprog.runtime.speculative.head_proposer import tree_nodes

    runner = rt.engine.runner
    capture = args.head_proposer.capture if args.method == "eagle" else None
    vocab = rt.model_config.vocab_size
    most = max(args.verify_nodes)
    rows_out: list[dict] = []

    def tree_of(n: int) -> tuple[int, ...]:
        w = args.verify_width
        parents = tree_nodes([[0] * w for _ in range(-(-n // w))], w).parents
        assert parents is not None
        return parents[:n]

    def measure() -> None:
        for b in args.verify_batches:
            fill_rows(runner, b, args.verify_context, most)
            kinds = [("decode", None, None)]
            for n in args.verify_nodes:
                kinds += [(f"chain {n}", n, None), (f"tree {n}", n, tree_of(n))]
            base = {}
            for name, n, parents in kinds:
                step = verify_steps(runner, b, args.verify_context, n, parents, vocab)
                for cap in (None, capture) if capture is not None else (None,):
                    s, graph = time_step(runner, step, cap, args.verify_repeats)
                    key = cap is not None
                    base.setdefault(key, s)  # the first kind measured: decode
                    row = {
                        "batch": b,
                        "step": name + (" +capture" if key else ""),
                        "ms": s * 1000,
                        "x_decode": s / base[False],
                        "graph": graph,
                    }
                    rows_out.append(row)
                    log(
                        f"   batch {b:3d} {row['step']:22s} {row['ms']:8.3f} ms "
                        f"x{row['x_decode']:.2f} of a decode step "
                        f"({'graphs' if graph else 'eager'})"
                    )
            if capture is not None:  # the head's side of a speculative step
                from lmprog.runtime.speculative.head_proposer import tree_depth

                w = args.verify_width
                for n in args.verify_nodes:
                    for name, width in ((f"propose chain {n}", 1), (f"propose tree {n}", w)):
                        s = time_propose(
                            args.head_proposer, b, args.verify_context, n, width,
                            args.verify_repeats,
                        )  # fmt: skip
                        row = {"batch": b, "step": name, "ms": s * 1000}
                        row.update(x_decode=s / base[False], graph=False)
                        rows_out.append(row)
                        log(
                            f"   batch {b:3d} {name:22s} {row['ms']:8.3f} ms "
                            f"x{row['x_decode']:.2f} of a decode step "
                            f"({tree_depth(n, width)} head steps)"
                        )
            runner.req_to_token[: max(args.verify_batches)].zero_()

    rt.engine.call(measure)  # (ModelRunner.run enters inference mode on that thread)
    return rows_out


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
    p.add_argument("--method", default="ngram", choices=["ngram", "draft", "eagle"])
    p.add_argument(
        "--draft-model",
        default=None,
        help="draft model, preset, or 'self' (--method draft); a head's folder (--method eagle, "
        "default: the head shipped for the bundled model)",
    )
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
    p.add_argument(
        "--tree-widths",
        default="2,4",
        help="--method eagle: the head's tree widths to run beside its chains ('' for none)",
    )
    p.add_argument("--no-adaptive", action="store_true")
    p.add_argument("--draft-cost", type=float, default=None)
    p.add_argument("--max-step-tokens", type=int, default=None)
    p.add_argument(
        "--workload",
        default="copy",
        help=f"comma-separated, of {', '.join(WORKLOADS)}: copy-heavy paragraphs, texts whose "
        "phrases recur, chat questions, JSON extraction, code-like prompts",
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
    p.add_argument(
        "--verify-cost",
        action="store_true",
        help="time verify steps of chains and token trees against a decode step (no generation)",
    )
    p.add_argument("--verify-nodes", default="8,16,32", help="--verify-cost: drafts per entry")
    p.add_argument("--verify-batches", default="1,8", help="--verify-cost: requests per step")
    p.add_argument("--verify-context", type=int, default=1024, help="--verify-cost: prefix length")
    p.add_argument(
        "--verify-width", type=int, default=4, help="--verify-cost: the trees' top-w per depth"
    )
    p.add_argument("--verify-repeats", type=int, default=20, help="--verify-cost: timed runs")
    args = p.parse_args()
    if args.method == "draft" and not args.draft_model:
        p.error("--method draft needs --draft-model")
    if args.tree_branches is not None and (args.method != "ngram" or args.tree_branches < 2):
        p.error("--tree-branches needs --method ngram and at least 2 branches")
    args.workloads = [w.strip() for w in args.workload.split(",") if w.strip()]
    bad = [w for w in args.workloads if w not in WORKLOADS]
    if bad or not args.workloads:
        p.error(f"--workload: unknown {bad}; known: {', '.join(WORKLOADS)}")
    args.widths = [int(w) for w in args.tree_widths.split(",") if w.strip()]
    if any(w < 2 for w in args.widths):
        p.error("--tree-widths: each width must be >= 2 (width 1 is the chain, always run)")
    args.verify_nodes = [int(n) for n in args.verify_nodes.split(",") if n.strip()]
    args.verify_batches = [int(b) for b in args.verify_batches.split(",") if b.strip()]
    if args.verify_cost and (
        not args.verify_nodes
        or not args.verify_batches
        or min(args.verify_nodes + args.verify_batches) < 1
        or args.verify_width < 1
        or args.verify_repeats < 1
    ):
        p.error("--verify-cost needs positive --verify-nodes, --verify-batches and counts")
    return args


def summary(results: list[tuple[str, str, dict]]) -> None:
    """One markdown table: per workload, batch and mode, tokens/s, ratio, tokens per verify
    (the mean accepted length) and identical outputs."""
    log(
        "\n| workload | batch | mode | tok/s | x off | tokens per verify | drafts accepted | "
        "identical |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    for workload, batch, r in results:
        n = r.get("n", r.get("size"))
        for mode, m in r["modes"].items():
            ratio = m.get("speedup", m.get("ratio"))
            per, accepted, same = "1.00", "-", "-"
            if mode != "off":
                verified = m["per_verify"] > 0  # else no verify step ran
                per = f"{m['per_verify']:.2f}" if verified else "- (none)"
                accepted = f"{m['acceptance']:.0%}" if verified else "-"
                same = f"{m['identical']}/{n}"
            log(
                f"| {workload} | {batch} | {mode} | {m['tok_s']:.1f} | {ratio:.2f}x | {per} | "
                f"{accepted} | {same} |"
            )


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
        if args.verify_cost:
            log(
                f"\n== verify cost: {args.verify_context}-token prefixes, trees of top-"
                f"{args.verify_width} per depth, median of {args.verify_repeats}"
            )
            verify_cost(rt, args)
            return
        results = []
        text = args.preset is None or not args.dummy
        for workload in args.workloads if text else ["random"]:
            if text:
                prompts = text_prompts(rt, workload)
                params = {"temperature": 0.0}
            else:
                prompts = random_prompts(rt.model_config.vocab_size, 16, args.prompt_len)
                params = {"temperature": 0.0, "ignore_eos": True}
            if not results:
                warm_up(rt, prompts, params, args)
            log(
                f"\n== {workload}, batch 1: {args.prompts} prompts, <= {args.max_tokens} tokens"
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
            results.append((workload, "1", one))
            log(f"   total: {one['tokens']} decode tokens")
            for mode, m in one["modes"].items():
                log(
                    f"   {mode:8s} {m['tok_s']:7.1f} tok/s, speedup x{m['speedup']:.2f}, "
                    f"acceptance {m['acceptance']:.0%}, {m['per_verify']:.2f} tokens per "
                    f"verify, identical outputs {m['identical']}/{one['n']}"
                )
            for size in [int(b) for b in args.batches.split(",") if b.strip()]:
                log(
                    f"\n== {workload}, batch {size}: {size} requests at once, <= "
                    f"{args.batch_max_tokens} tokens"
                )
                r = batched(
                    rt,
                    prompts,
                    {**params, "max_tokens": args.batch_max_tokens},
                    size,
                    args.repeats,
                    args,
                )
                results.append((workload, str(size), r))
                for mode, m in r["modes"].items():
                    log(
                        f"   {mode:8s} {m['tok_s']:7.1f} tok/s, ratio x{m['ratio']:.2f}; "
                        f"{m['verified']} drafts verified (acceptance {m['acceptance']:.0%}, "
                        f"{m['per_verify']:.2f} tokens per verify); identical outputs "
                        f"{m['identical']}/{size}"
                    )
        summary(results)
    finally:
        rt.shutdown()


if __name__ == "__main__":
    main()
