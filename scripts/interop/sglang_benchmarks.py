"""SGLang's benchmark programs (`benchmark/<name>/bench_sglang.py` of an SGLang checkout) run
against lmprog with only the import changed: `import sglang as sgl` becomes `import lmprog as
sgl`, and the program runs in process on a lmprog backend (`--via dsl`) or through
`lp.RuntimeEndpoint` against `lmprog serve` (`--via endpoint`). `--frontend sglang` keeps
SGLang's own frontend (the program unchanged) through `sgl.RuntimeEndpoint` against
`lmprog serve`.

    git clone --depth 1 https://github.com/sgl-project/sglang /tmp/sglang
    .venv/bin/python scripts/interop/sglang_benchmarks.py /tmp/sglang line_retrieval \\
        [--backend llamacpp|runtime] [--via dsl|endpoint] [--frontend lmprog|sglang] [-n 3]

Only the benchmark's harness imports are answered here, as SGLang's own would need its server
stack or the network: `sglang.test.test_utils` (`add_common_sglang_args_and_parse`,
`select_sglang_backend`: the backend chosen above), `sglang.utils` (`dump_state_text`,
`normalize_base_url`), `sglang.srt.utils.hf_transformers_utils.get_tokenizer` (lmprog's
tokenizer of the model the backend names) and `datasets.load_dataset` (no model hub here).
The data are small sets made here in the benchmarks' formats: line_retrieval's
`lines_*.json` (gen_data.py needs a word list from the network) and `-n` json_schema items
in NousResearch/json-mode-eval's shape (a system and a user message, a schema).

Supported: line_retrieval (`s.fork(n, position_ids_offset)`, `join(mode="concate_and_append")`,
`run_batch(..., backend=...)`) and json_schema (`gen(json_schema=...)` in a chat,
`global_config.default_backend.get_server_info()["tokenizer_path"]`). Each prints SGLang's
own summary lines (accuracy, latency); a 135M model's accuracy is not the point here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import types
from pathlib import Path

# the harness names the benchmarks import, answered by this module
HARNESS = "lmprog_sglang_bench_harness"
REWRITES = {
    "from sglang.test.test_utils import": f"from {HARNESS} import",
    "from sglang.utils import": f"from {HARNESS} import",
    "from sglang.srt.utils.hf_transformers_utils import": f"from {HARNESS} import",
    "from datasets import": f"from {HARNESS} import",
}
PROGRAM_IMPORT = ("import sglang as sgl", "import lmprog as sgl")
BENCH_ARGS = {
    "line_retrieval": ["--src-index", "{lines}", "--num-queries-per-src", "{n}"],
    "json_schema": ["--num-jsons", "{n}", "--max-tokens", "128"],
}

_backend = None  # what select_sglang_backend returns


# ---- the harness (SGLang's names) ---------------------------------------------------------


def add_common_sglang_args_and_parse(parser: argparse.ArgumentParser) -> argparse.Namespace:
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--host", type=str, default="http://127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--backend", type=str, default="srt")
    parser.add_argument("--result-file", type=str, default="result.jsonl")
    return parser.parse_args(_bench_argv)


def select_sglang_backend(args: argparse.Namespace):
    return _backend


def dump_state_text(filename: str, states, mode: str = "w") -> None:
    with open(filename, mode) as f:
        for i, state in enumerate(states):
            text = state.text() if hasattr(state, "text") else str(state)
            f.write(f"{'=' * 40} {i} {'=' * 40}\n{text}\n")


def normalize_base_url(host: str, port: int) -> str:
    host = host if "://" in host else f"http://{host}"
    return f"{host.rstrip('/')}:{port}"


def get_tokenizer(path: str):
    from lmprog.core.models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model(path))


def load_dataset(path: str):
    return {"train": json_schema_items(_n_items)}


# ---- data ---------------------------------------------------------------------------------

WORDS = (
    "amber basil cedar delta ember fjord garnet harbor indigo juniper kestrel lagoon meadow "
    "nectar orchid pebble quartz raven saffron tundra umber velvet willow yarrow zephyr"
).split()


def line_data(num_lines: int, seed: int = 0) -> dict:
    """A line_retrieval data file's fields: lines `Line <a-b>: The REGISTER_CONTENT is
    <6 digits>.`, no redirections (every line one hop)."""
    rng = random.Random(seed)
    indices: list[str] = []
    while len(indices) < num_lines:
        index = f"{rng.choice(WORDS)}-{rng.choice(WORDS)}"
        if index not in indices:
            indices.append(index)
    values = [f"{rng.randrange(1_000_000):06}" for _ in indices]
    lines = [f"Line {i}: The REGISTER_CONTENT is {v}." for i, v in zip(indices, values)]
    shots = " ".join(f"The REGISTER_CONTENT of Line {indices[k]} is {values[k]}." for k in (0, 1))
    return {
        "prefix": "Below are lines, each with a REGISTER_CONTENT value. Remember them.",
        "suffix": f"That was the last line. {shots} The REGISTER_CONTENT of Line ??? is",
        "lines": lines,
        "indices": indices,
        "values": values,
        "links": [[] for _ in lines],
        "group_by_num_hoops": {"1": list(range(num_lines))},
        "contains_ring": [],
    }


_SCHEMA_ITEMS = [
    (
        "Extract the person described as JSON.",
        "Ada Lovelace, born 1815, wrote the first published algorithm.",
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "born": {"type": "integer"}},
            "required": ["name", "born"],
        },
    ),
    (
        "Answer with a JSON object for the product.",
        "A red mug that holds 350 ml and costs 8.5 dollars; it is in stock.",
        {
            "type": "object",
            "properties": {
                "color": {"type": "string", "enum": ["red", "green", "blue"]},
                "price": {"type": "number"},
                "in_stock": {"type": "boolean"},
            },
            "required": ["color", "price", "in_stock"],
        },
    ),
    (
        "List the cities mentioned as JSON.",
        "We flew from Lisbon to Oslo, then took a train to Bergen.",
        {
            "type": "object",
            "properties": {"cities": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
            "required": ["cities"],
        },
    ),
    (
        "Describe the meeting as JSON.",
        "The budget review is on Monday at 10, in room 4, with three attendees.",
        {
            "type": "object",
            "properties": {
                "topic": {"type": "string", "maxLength": 40},
                "room": {"type": "integer", "minimum": 1},
                "attendees": {"type": "integer"},
            },
            "required": ["topic", "room"],
        },
    ),
]
_n_items = len(_SCHEMA_ITEMS)


def json_schema_items(n: int) -> list[dict]:
    """`n` items in NousResearch/json-mode-eval's shape (made here; cycled past four)."""
    items = []
    for k in range(n):
        system, user, schema = _SCHEMA_ITEMS[k % len(_SCHEMA_ITEMS)]
        items.append(
            {
                "prompt": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": user},
                ],
                "schema": json.dumps(schema),
            }
        )
    return items


# ---- running one benchmark ----------------------------------------------------------------

_bench_argv: list[str] = []


def load_bench(source: str, frontend: str) -> types.ModuleType:
    """bench_sglang.py's module with only its imports changed (see the module docstring)."""
    if frontend == "lmprog":
        old, new = PROGRAM_IMPORT
        if old not in source:
            raise SystemExit(f"the benchmark has no {old!r} line")
        source = source.replace(old, new)
    for old, new in REWRITES.items():
        source = source.replace(old, new)
    if "from sglang" in source.replace("from sglang.global_config", ""):
        raise SystemExit("the benchmark imports more of sglang than this script answers")
    # global_config: lmprog's own; SGLang 0.5's frontend has it at the top level only
    where = "lmprog" if frontend == "lmprog" else "sglang"
    source = source.replace("from sglang.global_config import", f"from {where} import")
    module = types.ModuleType("bench_sglang")
    module.__file__ = "bench_sglang.py"
    module.__dict__["__lmprog_source__"] = source
    exec(compile(source, "bench_sglang.py", "exec"), module.__dict__)
    return module


def main() -> None:
    global _backend, _bench_argv, _n_items
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sglang", help="an SGLang source checkout (its benchmark/ folder)")
    parser.add_argument("bench", choices=sorted(BENCH_ARGS))
    parser.add_argument("--backend", choices=["llamacpp", "runtime"], default="llamacpp")
    parser.add_argument("--via", choices=["dsl", "endpoint"], default="dsl")
    parser.add_argument("--frontend", choices=["lmprog", "sglang"], default="lmprog")
    parser.add_argument("-n", type=int, default=3, help="items (queries, schemas)")
    parser.add_argument("--lines", type=int, default=40, help="line_retrieval: lines in context")
    args = parser.parse_args()
    if args.frontend == "sglang":
        args.via = "endpoint"  # SGLang's frontend reaches lmprog through its server
    source = (Path(args.sglang) / "benchmark" / args.bench / "bench_sglang.py").read_text()

    import lmprog as lp
    from lmprog.serve import Server

    backend = lp.LlamaCpp() if args.backend == "llamacpp" else lp.Runtime(device="cpu")
    _n_items = args.n
    sys.modules[HARNESS] = sys.modules[__name__]
    with contextlib.ExitStack() as stack:
        stack.callback(backend.shutdown)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sglang-bench-")))
        os.chdir(work)  # the benchmark writes its outputs into the working directory
        _bench_argv = [a.format(n=args.n, lines=args.lines - 1) for a in BENCH_ARGS[args.bench]]
        if args.bench == "line_retrieval":
            (work / "lines.json").write_text(json.dumps(line_data(args.lines)))
            _bench_argv += ["--data-path", "lines.json"]
        if args.via == "dsl":
            _backend = backend
        else:
            srv = stack.enter_context(Server(backend, stats_interval_s=None).start())
            if args.frontend == "sglang":
                import sglang

                _backend = sglang.RuntimeEndpoint(srv.url)
            else:
                _backend = lp.RuntimeEndpoint(srv.url)
        bench = load_bench(source, args.frontend)
        parsed = add_common_sglang_args_and_parse(_bench_parser(bench))
        print(f"{args.bench}: {args.frontend} frontend, {args.via} on {args.backend}", flush=True)
        bench.main(parsed)
        print((work / "result.jsonl").read_text().strip())


def _bench_parser(bench: types.ModuleType) -> argparse.ArgumentParser:
    """The benchmark's own argument parser: its `__main__` block up to the harness call."""
    import ast

    tree = ast.parse(bench.__dict__["__lmprog_source__"])
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            body = []
            for stmt in node.body:
                if "add_common_sglang_args_and_parse" in ast.unparse(stmt):
                    break
                body.append(stmt)
            scope = dict(vars(bench))
            exec(compile(ast.Module(body=body, type_ignores=[]), "bench_sglang.py", "exec"), scope)
            return scope["parser"]
    raise SystemExit("the benchmark has no __main__ block building its parser")


if __name__ == "__main__":
    main()
