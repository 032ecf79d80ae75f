"""JSON decoding end to end with and without jump-forward, on the bundled model (issue 3).

Each backend runs the same JSON-extraction prompts one at a time, at temperature 0, once
with jump-forward on and once off, and reports forward passes per output (runtime: engine
steps; each request runs alone, so one step = one forward pass of that request), generated
tokens, wall time, and whether the outputs are identical.

    python bench/bench_jump_forward.py [--n 8] [--whitespace ""]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import lmprog as lp
from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams

SCHEMA = {  # fixed keys: most of the output is forced by the schema
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "occupation": {"type": "string", "maxLength": 20},
        "city": {"type": "string", "maxLength": 20},
        "married": {"type": "boolean"},
    },
    "required": ["name", "age", "occupation", "city", "married"],
    "additionalProperties": False,
}
PEOPLE = [
    ("Ada", 36, "mathematician", "London"),
    ("Alan", 41, "logician", "Manchester"),
    ("Grace", 85, "admiral", "Arlington"),
    ("Linus", 28, "programmer", "Helsinki"),
    ("Marie", 66, "chemist", "Paris"),
    ("Ken", 50, "engineer", "Berkeley"),
    ("Hedy", 45, "inventor", "Vienna"),
    ("Edsger", 72, "professor", "Austin"),
]


def prompts(backend, n: int) -> list[str]:
    t = backend.chat_template
    out = []
    for name, age, job, city in (PEOPLE * 4)[:n]:
        text = f"{name} is a {age}-year-old {job} from {city}, and is married."
        out.append(
            t.role_prefix("user", first=True)
            + f"Extract the person as JSON.\n{text}"
            + t.role_suffix("user")
            + t.role_prefix("assistant")
        )
    return out


def run(backend, texts: list[str], constraint) -> tuple[list[str], float, int, int]:
    params = SamplingParams(max_tokens=96, temperature=0)
    before = backend.stats().get("steps", 0)
    tokens = 0
    t0 = time.perf_counter()
    outs = []
    for text in texts:
        result = backend.generate(GenerateRequest(text, params, constraint))
        json.loads(result.text)
        outs.append(result.text)
        tokens += result.completion_tokens
    elapsed = time.perf_counter() - t0
    return outs, elapsed, backend.stats().get("steps", 0) - before, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument(
        "--whitespace", default=None, help="JSON whitespace regex (default: lmprog's)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    constraint = lp.Constraint.from_json_schema(SCHEMA, whitespace=args.whitespace)
    print(
        f"schema: 5 fixed keys; whitespace={args.whitespace!r}; {args.n} prompts, temperature 0\n"
    )
    print(
        "| backend | jump-forward | forward passes / output | tokens / output | wall s | identical |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    makers = {
        "runtime": lambda jf: lp.Runtime(device="cpu", jump_forward=jf),
        "llamacpp": lambda jf: lp.LlamaCpp(jump_forward=jf),
    }
    for name, make in makers.items():
        rows = {}
        for jf in (False, True):
            backend = make(jf)
            texts = prompts(backend, args.n)
            run(backend, texts[:1], constraint)  # warm-up: index build, caches
            rows[jf] = run(backend, texts, constraint)
            backend.shutdown()
        same = rows[True][0] == rows[False][0]
        for jf in (False, True):
            outs, secs, steps, toks = rows[jf]
            passes = f"{steps / len(outs):.1f}" if steps else "n/a"
            print(
                f"| {name} | {'on' if jf else 'off'} | {passes} | {toks / len(outs):.1f} | {secs:.2f} | {same} |"
            )
        off, on = rows[False], rows[True]
        if off[2] and on[2]:
            print(
                f"| {name} | saving | {1 - on[2] / off[2]:.1%} fewer passes | | {off[1] / on[1]:.2f}x faster | |"
            )
        else:
            print(f"| {name} | saving | | | {off[1] / on[1]:.2f}x faster | |")


if __name__ == "__main__":
    main()
