"""Constrained decoding engines side by side on the default model's tokenizer (issue 3).

Engines: lmprog (its JSON-schema compiler + TokenIndex/Guide/masks), outlines-core used directly
(`build_regex_from_schema` + `Index`), xgrammar and llguidance (bench extras:
`pip install xgrammar llguidance`; an engine that does not import is reported as missing).

Measured, on ten JSON schemas from small to large:
- compile time, cold and cached (lmprog: memory LRU and disk cache; xgrammar: its compiler
  cache; outlines-core and llguidance have no cache of their own);
- per-token mask time p50/p99 while walking the tokens of a valid instance of each schema:
  "mask" = compute the allowed set as a 32-bit bitmask (lmprog: its cached per-state rows),
  "apply" = leave [1, 49k] float32 logits masked in place (bitmask fill + apply: lmprog's
  `apply_bitmask_`, xgrammar's CPU apply kernel for the others). Three passes; the first visit
  of a state is in p99;
- whether each engine accepts the canonical tokens of each valid instance;
- conformance on the JSON-Schema-Test-Suite through `bench/conformance.py` (if present);
- jump-forward: decode steps (forward passes) per output on a fixed-key schema, with and
  without jump-forward, for a "model" that writes a fixed document (it always picks the
  longest allowed token continuing the document; both runs must produce the same text).

    python bench/bench_fsm.py [--passes 3] [--json results.json] [--skip-conformance]

Single-threaded (torch.set_num_threads(1), xgrammar max_threads=1); disk caches go to a
temporary folder so runs do not depend on earlier ones.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
if os.environ.get("LMPROG_BENCH_CACHE_DIR"):
    os.environ["LMPROG_CACHE_DIR"] = os.environ["LMPROG_BENCH_CACHE_DIR"]
else:  # a fresh cache, removed at exit (index files of large schemas take hundreds of MB)
    os.environ["LMPROG_CACHE_DIR"] = tempfile.mkdtemp(prefix="lmprog-bench-")
    atexit.register(shutil.rmtree, os.environ["LMPROG_CACHE_DIR"], ignore_errors=True)

import torch

torch.set_num_threads(1)

from lmprog.core.models import load_tokenizer, resolve_model  # noqa: E402
from lmprog.fsm.index import TokenIndex, clear_memory_cache  # noqa: E402
from lmprog.fsm.jump import jump_forward  # noqa: E402
from lmprog.fsm.mask import allowed_bitmask, apply_bitmask_  # noqa: E402
from lmprog.fsm.vocab import TokenVocab  # noqa: E402

S = {"type": "string"}
SHORT = {"type": "string", "maxLength": 24}
INT = {"type": "integer"}
NUM = {"type": "number"}
BOOL = {"type": "boolean"}


def obj(props: dict, required: list | None = None) -> dict:
    """additionalProperties false, as structured-output APIs require (OpenAI strict mode), so all
    engines compile the same language (outlines-core ignores the keyword, xgrammar's strict mode
    assumes false; lmprog and llguidance follow the schema)."""
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


# (name, schema, a valid instance), small to large. Strings are unbounded unless the field
# says otherwise (as pydantic emits them); bounded strings multiply index states.
SCHEMAS: list[tuple[str, dict, Any]] = [
    ("integer", INT, 42),
    ("enum", {"enum": ["red", "green", "blue"]}, "green"),
    ("point", obj({"x": NUM, "y": NUM}), {"x": 1.5, "y": -2}),
    (
        "tags",
        {
            "type": "array",
            "items": {"type": "string", "maxLength": 10},
            "minItems": 1,
            "maxItems": 5,
        },
        ["ai", "json", "fsm"],
    ),
    (
        "person",
        obj({"name": S, "age": INT, "email": {"type": "string", "format": "email"}, "admin": BOOL}),
        {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "admin": True},
    ),
    (
        "event",
        obj(
            {
                "title": S,
                "date": {"type": "string", "format": "date"},
                "location": obj({"city": S, "country": S}),
            }
        ),
        {
            "title": "Launch",
            "date": "2024-05-01",
            "location": {"city": "Paris", "country": "France"},
        },
    ),
    (
        "product",
        obj(
            {
                "id": {"type": "string", "format": "uuid"},
                "name": S,
                "price": NUM,
                "in_stock": BOOL,
                "tags": {"type": "array", "items": {"enum": ["new", "sale", "eco"]}, "maxItems": 3},
                "size": obj({"w": NUM, "h": NUM, "d": NUM}),
            }
        ),
        {
            "id": "123e4567-e89b-12d3-a456-426614174000",
            "name": "Lamp",
            "price": 19.99,
            "in_stock": True,
            "tags": ["new", "eco"],
            "size": {"w": 10, "h": 30.5, "d": 10},
        },
    ),
    (
        "order",
        obj(
            {
                "order_id": INT,
                "customer": obj({"name": S, "email": {"type": "string", "format": "email"}}),
                "items": {
                    "type": "array",
                    "maxItems": 4,
                    "items": obj({"sku": SHORT, "qty": INT, "price": NUM}),
                },
                "status": {"enum": ["new", "paid", "shipped"]},
                "note": S,
            },
            required=["order_id", "customer", "items", "status"],
        ),
        {
            "order_id": 7,
            "customer": {"name": "Bob", "email": "bob@x.io"},
            "items": [{"sku": "A1", "qty": 2, "price": 3.5}, {"sku": "B2", "qty": 1, "price": 10}],
            "status": "paid",
        },
    ),
    (
        "config",
        obj(
            {f"opt{i}": [S, INT, BOOL, {"type": ["string", "null"]}][i % 4] for i in range(12)},
            required=[f"opt{i}" for i in range(0, 12, 2)],
        ),
        {
            "opt0": "a",
            "opt1": 1,
            "opt2": True,
            "opt3": None,
            "opt4": "b",
            "opt6": False,
            "opt8": "c",
            "opt10": False,
        },
    ),
    (
        "catalog",
        obj(
            {
                "store": S,
                "open": BOOL,
                "rating": NUM,
                "address": obj(
                    {"street": S, "city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}
                ),
                "products": {
                    "type": "array",
                    "maxItems": 3,
                    "items": obj(
                        {
                            "name": S,
                            "price": NUM,
                            "qty": INT,
                            "kind": {"enum": ["book", "food", "toy"]},
                            "dims": obj({"w": NUM, "h": NUM}),
                        }
                    ),
                },
                "owner": obj(
                    {
                        "first": S,
                        "last": S,
                        "phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"},
                    }
                ),
                "hours": {
                    "type": "array",
                    "maxItems": 7,
                    "items": {"type": "string", "maxLength": 12},
                },
                "updated": {"type": "string", "format": "date"},
            }
        ),
        {
            "store": "Corner",
            "open": True,
            "rating": 4.5,
            "address": {"street": "1 Main St", "city": "Springfield", "zip": "12345"},
            "products": [
                {
                    "name": "Atlas",
                    "price": 12.0,
                    "qty": 3,
                    "kind": "book",
                    "dims": {"w": 20, "h": 30},
                }
            ],
            "owner": {"first": "Ann", "last": "Lee", "phone": "555-1234"},
            "hours": ["9-17", "9-17"],
            "updated": "2024-01-31",
        },
    ),
]

# Jump-forward: every key fixed and required, so keys and punctuation are forced; enum values
# are forced once their first token decides them. "character" is SGLang's jump-forward example
# (LMSYS blog, 2024-02) as a JSON schema; "person" has only free values.
CHARACTER = obj(
    {
        "name": S,
        "house": {"enum": ["Gryffindor", "Slytherin", "Ravenclaw", "Hufflepuff"]},
        "blood status": {"enum": ["Pure-blood", "Half-blood", "Muggle-born"]},
        "occupation": {
            "enum": [
                "student",
                "teacher",
                "auror",
                "ministry of magic",
                "death eater",
                "order of the phoenix",
            ]
        },
        "wand": obj({"wood": S, "core": S, "length": NUM}),
        "alive": {"enum": ["Alive", "Deceased"]},
        "patronus": S,
        "bogart": S,
    }
)
CHARACTER_DOCS = [
    {
        "name": "Harry Potter",
        "house": "Gryffindor",
        "blood status": "Half-blood",
        "occupation": "student",
        "wand": {"wood": "Holly", "core": "Phoenix feather", "length": 11},
        "alive": "Alive",
        "patronus": "Stag",
        "bogart": "Dementor",
    },
    {
        "name": "Hermione Granger",
        "house": "Gryffindor",
        "blood status": "Muggle-born",
        "occupation": "student",
        "wand": {"wood": "Vine", "core": "Dragon heartstring", "length": 10.75},
        "alive": "Alive",
        "patronus": "Otter",
        "bogart": "Failure",
    },
    {
        "name": "Severus Snape",
        "house": "Slytherin",
        "blood status": "Half-blood",
        "occupation": "teacher",
        "wand": {"wood": "Unknown", "core": "Unknown", "length": 0},
        "alive": "Deceased",
        "patronus": "Doe",
        "bogart": "Unknown",
    },
    {
        "name": "Luna Lovegood",
        "house": "Ravenclaw",
        "blood status": "Pure-blood",
        "occupation": "student",
        "wand": {"wood": "Unknown", "core": "Unknown", "length": 9},
        "alive": "Alive",
        "patronus": "Hare",
        "bogart": "Her mother",
    },
    {
        "name": "Cedric Diggory",
        "house": "Hufflepuff",
        "blood status": "Pure-blood",
        "occupation": "student",
        "wand": {"wood": "Ash", "core": "Unicorn hair", "length": 12.25},
        "alive": "Deceased",
        "patronus": "Dog",
        "bogart": "Voldemort",
    },
]
PERSON = obj({"name": S, "age": INT, "email": S, "city": S, "admin": BOOL, "score": NUM})
PERSON_DOCS = [
    {
        "name": "Ada Lovelace",
        "age": 36,
        "email": "ada@example.org",
        "city": "London",
        "admin": True,
        "score": 9.5,
    },
    {"name": "Bob", "age": 7, "email": "b@x.io", "city": "Paris", "admin": False, "score": 0},
    {
        "name": "Chen Wei",
        "age": 52,
        "email": "chen@wei.cn",
        "city": "Beijing",
        "admin": False,
        "score": 71.25,
    },
    {
        "name": "Dana",
        "age": 29,
        "email": "dana@mail.com",
        "city": "Lagos",
        "admin": True,
        "score": -3,
    },
    {
        "name": "Eve O'Neil",
        "age": 41,
        "email": "eve@o.ie",
        "city": "Dublin",
        "admin": True,
        "score": 100,
    },
]
JUMP_CASES = [("character", CHARACTER, CHARACTER_DOCS), ("person", PERSON, PERSON_DOCS)]


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ms(seconds: float) -> float:
    return seconds * 1e3


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


# ---- engines ---------------------------------------------------------------------------------
# Each engine: setup(tok) once; compile(schema) -> compiled; matcher(compiled) -> a cursor with
# mask() (allowed set only), apply(logits) (mask + apply in place), accept(token) -> bool.


class LmprogEngine:
    name = "lmprog"
    has_cache = True

    def setup(self, tok: Any) -> None:
        from lmprog.fsm.constraint import Constraint

        self.tok, self.Constraint = tok, Constraint
        self.vocab = TokenVocab.from_tokenizer(tok)
        self.vocab.outlines_vocabulary  # noqa: B018 - built once per tokenizer, like the others' setup
        self.constraints: dict[str, Any] = {}
        self.regex_ms: dict[str, float] = {}

    def constraint(self, schema: dict) -> Any:
        """Compiled once per schema, as `gen(json_schema=...)` does; the time is kept apart."""
        key = json.dumps(schema, sort_keys=True)
        if key not in self.constraints:
            self.constraints[key], seconds = timed(lambda: self.Constraint.from_json_schema(schema))
            self.regex_ms[key] = ms(seconds)
        return self.constraints[key]

    def compile(self, schema: dict) -> Any:
        return TokenIndex.get(self.constraint(schema), self.tok)

    def cold(self, schema: dict) -> Any:
        """Nothing cached: schema -> regex, then build, serialize and write the disk entry."""
        clear_memory_cache()
        self.constraints.pop(json.dumps(schema, sort_keys=True), None)
        return self.compile(schema)

    def from_disk(self, schema: dict) -> Any:
        """A new process: the memory cache is empty, the disk entry exists."""
        clear_memory_cache()
        return self.compile(schema)

    def matcher(self, compiled: Any) -> Any:
        return _LmprogCursor(compiled.new_guide(), self.vocab.size)

    def text_matcher(self, schema: Any) -> Callable[[str], bool]:
        """Conformance at the regex level (Constraint.matches); the token index is exact for the
        regex (tests/fsm), and building 383 indexes would take tens of minutes."""
        return self.Constraint.from_json_schema(schema).matches


class _LmprogCursor:
    def __init__(self, guide: Any, width: int) -> None:
        self.guide, self.width = guide, width

    def mask(self) -> None:
        allowed_bitmask([self.guide], self.width)

    def apply(self, logits: torch.Tensor) -> None:
        apply_bitmask_(logits, allowed_bitmask([self.guide], self.width))

    def accept(self, token: int) -> bool:
        if not self.guide.is_allowed(token):
            return False
        self.guide.advance(token)
        return True


class _BitmaskCursor:
    """Shared by the bitmask engines: fill a [1, ceil(V/32)] int32 bitmask, apply on CPU."""

    def __init__(
        self, fill: Callable[[torch.Tensor], Any], accept: Callable[[int], bool], words: int
    ) -> None:
        import xgrammar as xgr

        self._fill, self._accept, self._apply = fill, accept, xgr.apply_token_bitmask_inplace
        self.bitmask = torch.full((1, words), -1, dtype=torch.int32)

    def mask(self) -> None:
        self._fill(self.bitmask)

    def apply(self, logits: torch.Tensor) -> None:
        self._fill(self.bitmask)
        self._apply(logits, self.bitmask)

    def accept(self, token: int) -> bool:
        return bool(self._accept(token))


class OutlinesCoreEngine:
    name = "outlines-core"
    has_cache = False

    def setup(self, tok: Any) -> None:
        self.vocab = TokenVocab.from_tokenizer(tok)
        self.ovocab = self.vocab.outlines_vocabulary

    def compile(self, schema: dict) -> Any:
        from outlines_core import Index
        from outlines_core.json_schema import build_regex_from_schema

        return Index(build_regex_from_schema(json.dumps(schema)), self.ovocab)

    cold = compile

    def matcher(self, compiled: Any) -> Any:
        from outlines_core import Guide

        guide = Guide(compiled)

        def fill(bitmask: torch.Tensor) -> None:
            guide.write_mask_into(bitmask.data_ptr(), bitmask.numel(), bitmask.element_size())

        def accept(token: int) -> bool:
            if not guide.accepts_tokens([token]):
                return False
            guide.advance(token, return_tokens=False)
            return True

        return _BitmaskCursor(fill, accept, (self.vocab.size + 31) // 32)

    def text_matcher(self, schema: Any) -> Callable[[str], bool]:
        """The language of its regex, read by Python's re (outlines-core's Rust regex cannot be
        run on a text directly; a regex re cannot parse counts as a refusal)."""
        import re

        from outlines_core.json_schema import build_regex_from_schema

        compiled = re.compile(build_regex_from_schema(json.dumps(schema)))
        return lambda text: compiled.fullmatch(text) is not None


class XGrammarEngine:
    name = "xgrammar"
    has_cache = True

    def setup(self, tok: Any) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(
            tok, vocab_size=len(tok), stop_token_ids=[tok.eos_token_id]
        )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)

    def compile(self, schema: dict) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema))

    def cold(self, schema: dict) -> Any:
        self.compiler.clear_cache()
        return self.compile(schema)

    def matcher(self, compiled: Any) -> Any:
        m = self.xgr.GrammarMatcher(compiled)
        return _BitmaskCursor(
            m.fill_next_token_bitmask, m.accept_token, (self.info.vocab_size + 31) // 32
        )

    def text_matcher(self, schema: Any) -> Callable[[str], bool]:
        compiled = self.compile(schema)

        def match(text: str) -> bool:
            m = self.xgr.GrammarMatcher(compiled)
            return bool(m.accept_string(text)) and bool(m.is_completed())

        return match


class LLGuidanceEngine:
    name = "llguidance"
    has_cache = False

    def setup(self, tok: Any) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg, self.tok = llguidance, tok
        self.lltok = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok))

    def compile(self, schema: dict) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        matcher = self.llg.LLMatcher(self.lltok, grammar)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return grammar

    cold = compile

    def matcher(self, compiled: Any) -> Any:
        import llguidance.torch as lt

        m = self.llg.LLMatcher(self.lltok, compiled)
        return _BitmaskCursor(
            lambda bm: lt.fill_next_token_bitmask(m, bm, 0),
            m.consume_token,
            (self.lltok.vocab_size + 31) // 32,
        )

    def text_matcher(self, schema: Any) -> Callable[[str], bool]:
        grammar = self.compile(schema)

        def match(text: str) -> bool:
            m = self.llg.LLMatcher(self.lltok, grammar)
            return (
                bool(m.consume_tokens(self.tok.encode(text, add_special_tokens=False)))
                and m.is_accepting()
            )

        return match


ENGINES = [LmprogEngine, OutlinesCoreEngine, XGrammarEngine, LLGuidanceEngine]


# ---- measurements ----------------------------------------------------------------------------


def measure_engine(engine: Any, tok: Any, passes: int) -> dict:
    result: dict[str, Any] = {"engine": engine.name, "schemas": {}}
    _, setup_s = timed(lambda: engine.setup(tok))
    result["setup_ms"] = ms(setup_s)
    masks: list[float] = []
    applies: list[float] = []
    logits = torch.zeros(1, len(tok))
    for name, schema, instance in SCHEMAS:
        log(f"{engine.name}: {name}")
        row: dict[str, Any] = {}
        result["schemas"][name] = row
        try:
            compiled, cold_s = timed(lambda: engine.cold(schema))
        except Exception as exc:  # an engine that cannot compile a schema is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            continue
        row["cold_ms"] = ms(cold_s)
        if hasattr(engine, "regex_ms"):
            row["regex_ms"] = engine.regex_ms[json.dumps(schema, sort_keys=True)]
        if engine.has_cache:
            row["cached_ms"] = ms(timed(lambda: engine.compile(schema))[1])
            if hasattr(engine, "from_disk"):
                row["disk_ms"] = ms(timed(lambda: engine.from_disk(schema))[1])
                compiled = engine.compile(schema)
        ids = tok.encode(compact(instance), add_special_tokens=False)
        row["tokens"] = len(ids)
        row["accepts_instance"] = True
        for _ in range(passes):
            cursor = engine.matcher(compiled)
            for t in ids:
                masks.append(timed(cursor.mask)[1])
                applies.append(timed(lambda: cursor.apply(logits))[1])
                if not cursor.accept(t):
                    row["accepts_instance"] = False
                    break
    result["mask_us"] = percentiles(masks)
    result["apply_us"] = percentiles(applies)
    return result


def percentiles(seconds: list[float]) -> dict:
    if not seconds:
        return {}
    xs = sorted(s * 1e6 for s in seconds)
    return {"p50": xs[len(xs) // 2], "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))], "n": len(xs)}


CONFORMANCE_MEMORY_GB = 6
CONFORMANCE_SECONDS = 900


def measure_conformance(engines: list[Any]) -> dict:
    """JSON-Schema-Test-Suite (draft 2020-12 core, 1,299 cases) through bench/conformance.py,
    one engine per subprocess under a memory and time limit, so that an engine that blows up on
    some schema is reported as such instead of taking the benchmark down with it."""
    out = {}
    for engine in engines:
        out[engine.name] = _conformance_subprocess(engine.name)
        log(f"conformance {engine.name}: {format_conformance(out[engine.name])}")
    return out


def _conformance_subprocess(name: str) -> dict:
    import resource
    import subprocess

    def limit() -> None:
        cap = CONFORMANCE_MEMORY_GB << 30
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    cmd = [sys.executable, __file__, "--conformance-of", name]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=CONFORMANCE_SECONDS, preexec_fn=limit
        )
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {CONFORMANCE_SECONDS} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {
            "error": f"exit {done.returncode} (memory cap {CONFORMANCE_MEMORY_GB} GB): {tail[:100]}"
        }
    return json.loads(lines[-1])


def conformance_of(name: str, tok: Any) -> dict:
    """Run in the subprocess: one engine's report as a JSON line on stdout."""
    from conformance import run_suite

    engine = next(cls() for cls in ENGINES if cls.name == name)
    engine.setup(tok)
    start = time.perf_counter()
    report = run_suite(engine.text_matcher).to_dict()
    report["seconds"] = time.perf_counter() - start
    return report


def measure_jump_forward(tok: Any) -> dict:
    """Each fixed-key schema with lmprog's default JSON whitespace (`[ ]?` between tokens, which
    leaves a choice at every separator) and with none (whitespace="", compact JSON)."""
    from lmprog.fsm.constraint import Constraint

    out = {}
    for name, schema, docs in JUMP_CASES:
        for label, ws in (("default ws", None), ("compact", "")):
            log(f"jump-forward: {name}, {label}")
            index = TokenIndex.get(Constraint.from_json_schema(schema, whitespace=ws), tok)
            out[f"{name}, {label}"] = jump_case(index, tok, docs)
    return out


def jump_case(index: TokenIndex, tok: Any, docs: list[dict]) -> dict:
    vocab = index.vocab
    by_bytes: dict[bytes, list[int]] = {}
    for i, b in enumerate(vocab.token_bytes):
        if b:
            by_bytes.setdefault(b, []).append(i)
    rows, jump_times = [], []
    for doc in docs:
        target = compact(doc).encode()
        runs = {}
        for jump in (False, True):
            out, steps, times = simulate_decode(index, tok, target, by_bytes, jump)
            runs[jump] = (vocab.decode(out), steps, len(out))
            jump_times += times
        assert runs[False][0] == runs[True][0] == target, (runs, target)
        rows.append(
            {
                "doc": target.decode(),
                "steps_plain": runs[False][1],
                "steps_jump": runs[True][1],
                "tokens_plain": runs[False][2],
                "tokens_jump": runs[True][2],
            }
        )
    plain = sum(r["steps_plain"] for r in rows)
    jumped = sum(r["steps_jump"] for r in rows)
    return {
        "rows": rows,
        "steps_plain": plain,
        "steps_jump": jumped,
        "reduction": 1 - jumped / plain,
        "jump_call_us": percentiles(jump_times),
    }


def simulate_decode(index: TokenIndex, tok: Any, target: bytes, by_bytes: dict, jump: bool):
    """One decode of `target`: a step = one forward pass that samples one token. With
    jump-forward, forced text is appended (retokenized) before the next step."""
    guide, out, steps, times = index.new_guide(), [], 0, []
    vocab = index.vocab
    while not guide.is_finished():
        if jump:
            t0 = time.perf_counter()
            result = jump_forward(guide, out, tok)
            times.append(time.perf_counter() - t0)
            out = result.apply(out)
            if guide.is_finished():
                break
        pos = len(vocab.decode(out))
        if pos == len(target):
            assert guide.can_stop()
            steps += 1  # the step that samples EOS
            break
        token = next(
            t
            for end in range(min(len(target), pos + 48), pos, -1)
            for t in by_bytes.get(target[pos:end], ())
            if guide.is_allowed(t)
        )
        guide.advance(token)
        out.append(token)
        steps += 1
    return out, steps, times


# ---- report ----------------------------------------------------------------------------------


def report(results: list[dict], conformance: dict, jump: dict, missing: dict) -> None:
    names = [r["engine"] for r in results]
    print(
        "\n## Compile time per schema (ms): cold / cached. lmprog: cold includes schema->regex (in parentheses)"
        " and the disk write; cached = in-memory index for a held Constraint; [load from disk]"
    )
    print(f"| schema | {' | '.join(names)} |")
    print("|---|" + "---|" * len(names))
    for name, _, _ in SCHEMAS:
        cells = []
        for r in results:
            row = r["schemas"].get(name, {})
            if "error" in row:
                cells.append("error")
                continue
            cell = f"{row['cold_ms']:.1f} / " + (
                f"{row['cached_ms']:.3f}" if "cached_ms" in row else "—"
            )
            if "regex_ms" in row:
                cell += f" (regex {row['regex_ms']:.1f})"
            if "disk_ms" in row:
                cell += f" [{row['disk_ms']:.1f}]"
            if not row.get("accepts_instance", True):
                cell += " (rejects valid instance!)"
            cells.append(cell)
        print(f"| {name} | {' | '.join(cells)} |")
    print("\n## Summary")
    print(
        "| engine | setup ms | compile p50 cold ms | compile max cold ms | cached p50 ms | mask p50/p99 us "
        "| mask+apply p50/p99 us | valid instances accepted | conformance |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ok = [row for row in r["schemas"].values() if "error" not in row]
        cold = [row["cold_ms"] for row in ok]
        cached = [row["cached_ms"] for row in ok if "cached_ms" in row]
        accepted = sum(row["accepts_instance"] for row in ok)
        conf = conformance.get(r["engine"], conformance.get("error", "—"))
        cached_cell = f"{statistics.median(cached):.3f}" if cached else "—"
        cold_cells = f"{statistics.median(cold):.1f} | {max(cold):.1f}" if cold else "— | —"
        print(
            f"| {r['engine']} | {r['setup_ms']:.0f} | {cold_cells} | {cached_cell} | "
            f"{r['mask_us'].get('p50', 0):.1f} / {r['mask_us'].get('p99', 0):.1f} | "
            f"{r['apply_us'].get('p50', 0):.1f} / {r['apply_us'].get('p99', 0):.1f} | "
            f"{accepted}/{len(SCHEMAS)} (compiled {len(ok)}) | {format_conformance(conf)} |"
        )
    for name, why in missing.items():
        print(f"| {name} | not available: {why} |")
    print(
        "\n## Jump-forward on fixed-key schemas (decode steps = forward passes that sample a token)"
    )
    print("| schema | document | steps without | steps with | tokens without | tokens with |")
    print("|---|---|---|---|---|---|")
    for name, case in jump.items():
        for row in case["rows"]:
            doc = row["doc"] if len(row["doc"]) <= 70 else row["doc"][:67] + "..."
            print(
                f"| {name} | `{doc}` | {row['steps_plain']} | {row['steps_jump']} | {row['tokens_plain']} | "
                f"{row['tokens_jump']} |"
            )
        print(f"| {name} | **total** | {case['steps_plain']} | {case['steps_jump']} | | |")
    for name, case in jump.items():
        print(
            f"\n{name}: {case['reduction']:.1%} fewer decode steps with jump-forward (same text in both runs); "
            f"jump_forward() call p50/p99 {case['jump_call_us']['p50']:.1f} / {case['jump_call_us']['p99']:.1f} us"
        )


def format_conformance(conf: Any) -> str:
    if isinstance(conf, dict) and "pass_rate" in conf:
        return (
            f"{conf['pass_rate']:.1%} pass, {conf['invalid_accepted']} invalid accepted, "
            f"{conf['refused_cases']} refused"
        )
    if isinstance(conf, dict) and "error" in conf:
        return f"error: {conf['error'][:60]}"
    return str(conf)[:80]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=3, help="walks over each instance's tokens")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--skip-conformance", action="store_true")
    parser.add_argument("--conformance-of", help=argparse.SUPPRESS)  # internal: one engine's suite
    args = parser.parse_args()
    tok = load_tokenizer(resolve_model())
    if args.conformance_of:
        print(json.dumps(conformance_of(args.conformance_of, tok), default=str))
        return
    print(
        f"tokenizer: {resolve_model().name}, {len(tok)} tokens; torch threads 1; cache {os.environ['LMPROG_CACHE_DIR']}"
    )
    results, engines, missing = [], [], {}
    for cls in ENGINES:
        engine = cls()
        try:
            results.append(measure_engine(engine, tok, args.passes))
            engines.append(engine)
        except ImportError as exc:
            missing[cls.name] = str(exc)
        clear_memory_cache()  # large indexes: keep the process small for what follows
    conformance = {} if args.skip_conformance else measure_conformance(engines)
    jump = measure_jump_forward(tok)
    report(results, conformance, jump, missing)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"engines": results, "conformance": conformance, "jump": jump, "missing": missing},
                indent=1,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
