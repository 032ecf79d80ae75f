"""FP8 accuracy on the bundled model's real weights: fp8 against bf16 in one run.

    python3 scripts/gpu/fp8_accuracy.py           # on the GPU (after stage.sh c): bf16 baseline
    python3 scripts/gpu/fp8_accuracy.py --cpu     # anywhere: the fp32 model is the baseline

Variants, each against the baseline: the model in fp32 (on the GPU: how far bf16 itself is
from fp32), FP8 weights (`quantization="fp8"`: e4m3 per channel, per-token activations),
FP8 weights with an FP8 KV cache (`kv_cache_dtype="fp8_e4m3"`).

1. Teacher-forced logprobs over a few texts (chat turns, JSON, arithmetic, code): for every
   position, |logprob difference| of the actual next token (mean, p99, max), KL(baseline ||
   variant) of the next-token distributions (mean), top-1 agreement.
2. Greedy outputs of DSL programs (chat, select, regex, JSON schema, grammar, fork) through
   `lp.Runtime`: how many give the baseline's text, and where the first that differs does.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lmprog as lp
from lmprog.runtime.assemble import assemble_model
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool

TEXTS = [
    "<|im_start|>user\nWhat is the capital of France? Answer in one word.<|im_end|>\n"
    "<|im_start|>assistant\nParis.<|im_end|>\n",
    'Extract the city as JSON: "Lyon, in France, has half a million people."\n'
    '{"name": "Lyon", "country": "France", "population_millions": 0.5}',
    "Question: A farmer has 12 sheep and buys 7 more. How many sheep does he have?\n"
    "Answer: 12 + 7 = 19. He has 19 sheep.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n\nprint([fibonacci(i) for i in range(10)])",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
    "How vexingly quick daft zebras jump!",
]


def variants(cpu: bool) -> list[tuple[str, dict]]:
    base = "float32" if cpu else "bfloat16"
    out = [("fp8 weights", {"dtype": base, "quantization": "fp8"}),
           ("fp8 weights + fp8 KV", {"dtype": base, "quantization": "fp8",
                                     "kv_cache_dtype": "fp8_e4m3"})]  # fmt: skip
    if not cpu:
        out.insert(0, ("fp32 (bf16's own distance)", {"dtype": "float32"}))
    return out


# ---------------------------------------------------------------- teacher-forced logprobs


def forward_logprobs(net, ids: list[int], kv_cache_dtype: str) -> torch.Tensor:
    """fp32 log-softmax at every position of one prompt (prefill in chunks of 64, so later
    chunks read the earlier tokens' K/V from the pool as decoding does)."""
    n, dev = len(ids), net.device
    kv = KVPool.for_model(net.config, n + 1, net.dtype, dev, kv_cache_dtype=kv_cache_dtype)
    table = torch.arange(1, n + 2, dtype=torch.int32, device=dev)[None, : n + 1].contiguous()
    out = []
    with torch.inference_mode():
        for start in range(0, n, 64):
            chunk = ids[start : start + 64]
            end = start + len(chunk)
            batch = ForwardBatch.build(input_ids=chunk, out_cache_loc=range(start + 1, end + 1),
                                       req_pool_indices=[0], seq_lens=[end],
                                       extend_lens=[len(chunk)], req_to_token=table,
                                       logits_indices=range(len(chunk)))  # fmt: skip
            out.append(net(batch, kv).float().log_softmax(-1).cpu())
    return torch.cat(out)


def compare_logprobs(base: list[torch.Tensor], other: list[torch.Tensor], texts_ids) -> dict:
    diffs, kls, agree, total = [], [], 0, 0
    for lb, lo, ids in zip(base, other, texts_ids):
        target = torch.tensor(ids[1:])[:, None]
        diffs.append((lb[:-1].gather(1, target) - lo[:-1].gather(1, target)).abs().flatten())
        kls.append((lb.exp() * (lb - lo)).sum(-1))
        agree += int((lb.argmax(-1) == lo.argmax(-1)).sum())
        total += lb.shape[0]
    d, kl = torch.cat(diffs), torch.cat(kls)
    return {"mean": d.mean().item(), "p99": d.quantile(0.99).item(), "max": d.max().item(),
            "kl": kl.mean().item(), "top1": agree / total, "positions": total}  # fmt: skip


def logprob_section(args, device: str) -> None:
    base_dtype = "float32" if args.cpu else "bfloat16"
    from lmprog.core.models import load_tokenizer, resolve_model

    tokenizer = load_tokenizer(resolve_model(None))
    texts_ids = [tokenizer.encode(t) for t in TEXTS]
    net = assemble_model(None, device=device, dtype=base_dtype)
    base = [forward_logprobs(net, ids, "auto") for ids in texts_ids]
    del net
    print(f"\n== teacher-forced next-token logprobs, {sum(map(len, texts_ids))} positions over "
          f"{len(TEXTS)} texts; baseline: {base_dtype}")  # fmt: skip
    print(f"  {'variant':30s} {'|dlogp| mean':>12s} {'p99':>7s} {'max':>7s} {'KL mean':>9s} "
          f"{'top-1 agree':>11s}")  # fmt: skip
    for name, opts in variants(args.cpu):
        net = assemble_model(None, device=device, dtype=opts["dtype"],
                             quantization=opts.get("quantization"))  # fmt: skip
        got = [forward_logprobs(net, ids, opts.get("kv_cache_dtype", "auto")) for ids in texts_ids]
        del net
        r = compare_logprobs(base, got, texts_ids)
        print(f"  {name:30s} {r['mean']:12.4f} {r['p99']:7.3f} {r['max']:7.3f} "
              f"{r['kl']:9.5f} {r['top1']:11.1%}")  # fmt: skip


# ---------------------------------------------------------------- greedy DSL programs


@lp.function
def chat(s, question):
    s += lp.system("You are a helpful, terse assistant.")
    s += lp.user(question)
    s += lp.assistant(lp.gen("answer", max_tokens=48, stop="\n\n"))


@lp.function
def pick(s, text):
    s += lp.user(f"Is this review positive or negative?\n\n{text}")
    s += lp.assistant("It is " + lp.select("label", choices=["positive", "negative"]) + ".")


@lp.function
def phone(s, name):
    s += lp.user(f"Invent a phone number for {name}.")
    s += lp.assistant(lp.gen("number", regex=r"\(\d{3}\) \d{3}-\d{4}", max_tokens=20))


@lp.function
def person(s, text):
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"name": {"type": "string", "maxLength": 20},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"]}  # fmt: skip
    s += lp.user(f"Extract the person as JSON.\n\n{text}")
    s += lp.assistant(lp.gen("person", json_schema=schema, max_tokens=40))


@lp.function
def arithmetic(s):
    s += lp.user("Write a sum of small numbers.")
    s += lp.assistant(lp.gen("sum", ebnf='root ::= num ("+" num){1,3}\nnum ::= [1-9]',
                             max_tokens=12))  # fmt: skip


@lp.function
def ideas(s, topic):
    s += lp.user(f"Give one short idea about {topic}.")
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += lp.assistant(lp.gen("idea", max_tokens=24, stop="\n", temperature=0))
        f += lp.user("One more, different." if i else "Shorter, please.")
        f += lp.assistant(lp.gen("more", max_tokens=16, stop="\n"))
    s += lp.user("Summarize: " + " / ".join(f["more"] for f in forks))
    s += lp.assistant(lp.gen("summary", max_tokens=24, stop="\n"))


PROGRAMS = [
    (chat, {"question": "What is the capital of Italy?"}),
    (chat, {"question": "Name three primary colors."}),
    (chat, {"question": "Explain what a hash table is in two sentences."}),
    (pick, {"text": "The food was cold and the waiter was rude."}),
    (pick, {"text": "A wonderful evening, we will come back!"}),
    (phone, {"name": "Ada Lovelace"}),
    (person, {"text": "Alan Turing was 41 years old in 1953."}),
    (arithmetic, {}),
    (ideas, {"topic": "saving energy at home"}),
]


def run_programs(device: str, opts: dict) -> list[str]:
    rt = lp.Runtime(device=device, max_total_tokens=16384, **opts)
    try:
        return [fn.run(**kw, backend=rt, temperature=0).text() for fn, kw in PROGRAMS]
    finally:
        rt.shutdown()
        del rt
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next runtime's pool starts from free memory


def programs_section(args, device: str) -> None:
    base_dtype = "float32" if args.cpu else "bfloat16"
    base = run_programs(device, {"dtype": base_dtype})
    print(f"\n== greedy outputs of {len(PROGRAMS)} DSL programs; baseline: {base_dtype}")
    for name, opts in variants(args.cpu):
        got = run_programs(device, opts)
        same = sum(a == b for a, b in zip(base, got))
        print(f"  {name:30s} {same}/{len(base)} identical texts")
        for (fn, kw), a, b in zip(PROGRAMS, base, got):
            if a != b:
                at = next(i for i, (x, y) in enumerate(zip(a + "\0", b + "\0")) if x != y)
                print(f"    {fn.__name__}{tuple(kw.values())}: differs at char {at} of "
                      f"{len(a)}: {a[at:at + 40]!r} vs {b[at:at + 40]!r}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpu", action="store_true", help="run on the CPU, the fp32 model as baseline")
    p.add_argument("--skip-programs", action="store_true")
    args = p.parse_args()
    device = "cpu" if args.cpu else "cuda"
    if device == "cuda":
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    t0 = time.perf_counter()
    logprob_section(args, device)
    if not args.skip_programs:
        programs_section(args, device)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
