"""Constrained decoding engines side by side on the default model's tokenizer (issues 3, 14).

Engines, in one run: lmprog (its JSON-schema compiler -> grammar -> TokenIndex, the lazy
llguidance-backed token engine -> Guide -> bitmask), xgrammar and llguidance, each compiling
the JSON schema natively. (outlines-core, a peer in issue 3, is no longer measured: lmprog
stopped using it, and its eager index takes seconds per schema, which does not fit this
bench's few minutes.)

Per schema (the ten bench schemas and the three of issue 14's table):
- cold time to the first mask: schema -> compiled -> a matcher -> the first bitmask, nothing
  cached (lmprog: `clear_memory_cache()` first, parts: schema->grammar, index build (which
  computes the start position's mask), first `allowed_bitmask`; xgrammar: compiler cache
  cleared; llguidance has no cache);
- steady mask+apply per token while walking the tokens of a valid instance: fill the int32
  bitmask, one [1, ceil(V/32)] tensor reused by each cursor, and apply it to [1, 49k] float32
  logits in place (lmprog: `allowed_bitmask(..., out=)`; the others: their bitmask fill; the
  apply: lmprog's `apply_bitmask_` for every engine). Passes: 1 = first
  visits (lmprog computes and caches each position on the index by token path), 2..N = the
  same instance again (lmprog: cache hits), then one pass over a *different* valid instance of
  the same schema (shared prefixes hit, the rest are first visits: the realistic steady state);
- whether each engine accepts both instances through the tokens (every token's mask bit set,
  EOS allowed at the end).
Times are wall clock, and also the calling thread's CPU time (`time.thread_time`), which other
processes on a shared machine do not inflate.

`--real`: the real-world schemas of bench/schema_corpus_real.py (JSON Schema Store,
Kubernetes, CloudFormation, Jupyter and pydantic-generated schemas, with instances), the same way.
`--corpus`: the 153 schemas of bench/schema_corpus.py, each engine in a worker process with a
20 s deadline per schema (a stall or crash is counted and the worker restarted): compiled /
refused / crashed-or-stalled, time to first mask p50/max, and each instance judged through the
tokens (valid: every token allowed and EOS allowed at the end; invalid: some token refused or
EOS not allowed at the end). `--conformance`: the JSON-Schema-Test-Suite core through the
tokens for each engine (bench/conformance.py), one subprocess each. `--jump`: jump-forward
decode steps on fixed-key schemas.

    python bench/bench_fsm.py [--passes 3] [--corpus] [--real] [--conformance] [--jump]
                              [--json out.json]

Single-threaded (torch.set_num_threads(1), xgrammar max_threads=1). Instances are serialized
with `json.dumps(x, ensure_ascii=False)`: ", " and ": " separators, which lmprog's default
whitespace (`[ ]?` between JSON tokens), xgrammar's `any_whitespace=True` and llguidance's
flexible whitespace all accept. xgrammar runs with `strict_mode=False` and lmprog with
`strict=False` so that both follow the schema's additionalProperties (their defaults close
objects that list their keys); object keys are written in the schema's order (xgrammar
requires it), or with `--shuffle` in a random order at every level (the corpora's
instances). lmprog's masks are timed on the grammar generation runs (keys in the schema's
order); its instances are judged through the tokens on the constraint's `reading` (members in
any order), what reads a prefilled or returned text.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

torch.set_num_threads(1)

from lmprog.core.models import load_tokenizer, resolve_model  # noqa: E402
from lmprog.fsm.index import TokenIndex, clear_memory_cache  # noqa: E402
from lmprog.fsm.jump import jump_forward  # noqa: E402
from lmprog.fsm.mask import allowed_bitmask, apply_bitmask_  # noqa: E402

S = {"type": "string"}
SHORT = {"type": "string", "maxLength": 24}
INT = {"type": "integer"}
NUM = {"type": "number"}
BOOL = {"type": "boolean"}


def obj(props: dict, required: list | None = None) -> dict:
    """additionalProperties false, as structured-output APIs require (OpenAI strict mode)."""
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


# Issue 14's table: the three schemas whose first mask took 8.4 s / 0.5 s / 4.7 s before the
# lazy engine.
ISSUE_OPEN = {
    "type": "object",
    "properties": {
        "name": S,
        "age": INT,
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": S},
    },
    "required": ["name", "age"],
}
ISSUE_CLOSED = {
    **ISSUE_OPEN,
    "properties": {**ISSUE_OPEN["properties"], "email": S},
    "additionalProperties": False,
}
from schema_corpus import ISSUE_TOOL  # noqa: E402 - bench/ is on sys.path above

SCHEMAS += [
    (
        "issue: 4 fields, open",
        ISSUE_OPEN,
        {"name": "Ada", "age": 36, "email": "ada@example.org", "tags": ["math", "poetry"]},
    ),
    (
        "issue: 4 fields, closed",
        ISSUE_CLOSED,
        {"name": "Ada", "age": 36, "email": "ada@example.org", "tags": ["math"]},
    ),
    (
        "issue: tool call",
        ISSUE_TOOL,
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
    ),
]

# A second valid instance per schema (different values and shape where the schema allows).
OTHER: dict[str, Any] = {
    "integer": -7031,
    "enum": "blue",
    "point": {"x": 0, "y": 1e-3},
    "tags": ["regex"],
    "person": {"name": "Grace Hopper", "age": 85, "email": "grace@navy.mil", "admin": False},
    "event": {
        "title": "Retro, Q3",
        "date": "2025-09-30",
        "location": {"city": "São Paulo", "country": "Brazil"},
    },
    "product": {
        "id": "f47ac10b-58cc-4372-a567-0e02b2c3d479",
        "name": 'Desk "Pro"',
        "price": 249,
        "in_stock": False,
        "tags": ["sale"],
        "size": {"w": 120, "h": 75, "d": 60.5},
    },
    "order": {
        "order_id": 123456,
        "customer": {"name": "Zoë", "email": "zoe@mail.example"},
        "items": [{"sku": "Z-9", "qty": 10, "price": 0.5}],
        "status": "shipped",
        "note": "leave at door",
    },
    "config": {
        "opt0": "x",
        "opt2": False,
        "opt4": "y",
        "opt5": 17,
        "opt6": True,
        "opt7": "maybe",
        "opt8": "",
        "opt10": True,
        "opt11": None,
    },
    "catalog": {
        "store": "Books & Co",
        "open": False,
        "rating": 3,
        "address": {"street": "9 Elm Rd", "city": "Leeds", "zip": "54321"},
        "products": [
            {
                "name": "Map",
                "price": 4.25,
                "qty": 40,
                "kind": "toy",
                "dims": {"w": 1.5, "h": 2},
            },
            {"name": "Tea", "price": 3, "qty": 1, "kind": "food", "dims": {"w": 5, "h": 5}},
        ],
        "owner": {"first": "Raj", "last": "Patel", "phone": "020-7946"},
        "hours": ["closed"],
        "updated": "2025-02-28",
    },
    "issue: 4 fields, open": {"name": "Bo", "age": 7, "nickname": "b"},
    "issue: 4 fields, closed": {"name": "Li Na", "age": 41, "tags": []},
    "issue: tool call": {"name": "get_news", "arguments": {"city": "Tokyo"}},
}
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


def text(value: Any) -> str:
    """An instance as every engine here reads it: json.dumps default separators."""
    return json.dumps(value, ensure_ascii=False)


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ms(seconds: float) -> float:
    return seconds * 1e3


def transformers_tokenizer(tok: Any) -> Any:
    """The transformers tokenizer the peers' adapters need (lmprog's own loader returns a
    `FastTokenizer` over the cached tokenizers file, which they do not take)."""
    hf = getattr(tok, "hf_tokenizer", None)
    return hf() if callable(hf) else tok


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def settle() -> None:
    """Move what setup built (tokenizers, vocabularies) out of the garbage collector's
    generations, as a server would after start-up: otherwise a full collection of this large
    heap (~0.1-0.2 s) lands in the timing of whichever schema happens to trigger it."""
    gc.collect()
    gc.freeze()


def first_mask_timed(engine: Any, schema: Any) -> tuple[Any, dict]:
    """engine.first_mask with the calling thread's CPU time added (`first_mask_cpu_ms`): on a
    shared machine the wall time carries other processes' preemption, the CPU time does not
    (every engine compiles and fills masks in the calling thread)."""
    c0 = time.thread_time()
    compiled, parts = engine.first_mask(schema)
    return compiled, {**parts, "first_mask_cpu_ms": ms(time.thread_time() - c0)}


# ---- engines ---------------------------------------------------------------------------------
# Each engine: setup(tok) once; first_mask(schema) -> (compiled, parts) from nothing cached to
# the first bitmask; cursor(compiled) -> a cursor with mask() (the int32 [1, words] bitmask of
# the position), allowed(token) (its bit), accept(token) and eos_allowed(). Every engine's
# bitmask is applied with the same function, lmprog's `apply_bitmask_` (one format for all;
# xgrammar's own CPU apply, `apply_token_bitmask_inplace`, took ~400 µs per row here).


def _bit(words: Any, token: int) -> bool:
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)


class LmprogEngine:
    name = "lmprog"

    def setup(self, tok: Any) -> None:
        from lmprog.fsm.constraint import Constraint

        self.tok, self.Constraint = tok, Constraint
        self.width = len(tok)
        self.constraints: dict[int, Any] = {}  # id of an index -> its constraint
        # The llguidance tokenizer is built once per vocabulary (~0.2 s), outside the timings.
        TokenIndex.get(Constraint.from_json_schema({"type": "integer"}), tok)

    def first_mask(self, schema: Any) -> tuple[Any, dict]:
        clear_memory_cache()
        constraint, compile_s = timed(
            lambda: self.Constraint.from_json_schema(schema, strict=False)
        )
        index, index_s = timed(lambda: TokenIndex.get(constraint, self.tok))
        self.constraints[id(index)] = constraint
        _, mask_s = timed(lambda: allowed_bitmask([index.new_guide()], self.width))
        return index, {
            "compile_ms": ms(compile_s),
            "index_ms": ms(index_s),
            "mask_ms": ms(mask_s),
            "first_mask_ms": ms(compile_s + index_s + mask_s),
            "grammar_chars": len(constraint.lark or constraint.pattern),
        }

    def cursor(self, index: Any) -> Any:
        return _LmprogCursor(index.new_guide(), self.width)

    def reader(self, index: Any) -> Any:
        """The index that reads a given text: the constraint's `reading` (objects' members in
        any order), where generation writes the schema's order."""
        return TokenIndex.get(self.constraints[id(index)].reading, self.tok)


class _LmprogCursor:
    """lmprog's rows, written into a reused [1, ceil(V/32)] tensor (`out=`) as the peers'."""

    def __init__(self, guide: Any, width: int) -> None:
        self.guide, self.width, self.guides = guide, width, [guide]
        self.eos = guide.index.eos_token_id
        self.bitmask = torch.full((1, (width + 31) // 32), -1, dtype=torch.int32)

    def mask(self) -> torch.Tensor:
        return allowed_bitmask(self.guides, self.width, out=self.bitmask)

    def allowed(self, token: int) -> bool:
        return _bit(self.mask()[0], token)

    def accept(self, token: int) -> None:
        self.guide.advance(token)

    def eos_allowed(self) -> bool:
        return self.allowed(self.eos)


class _Peer:
    def reader(self, compiled: Any) -> Any:
        """What reads a given text: the compiled schema itself (one order of keys)."""
        return compiled


class _BitmaskCursor:
    """The peers: fill a [1, ceil(V/32)] int32 bitmask (reused, as an engine would)."""

    def __init__(self, fill: Callable, accept: Callable, words: int, eos: int) -> None:
        self._fill, self._accept = fill, accept
        self.bitmask = torch.full((1, words), -1, dtype=torch.int32)
        self.eos = eos

    def mask(self) -> torch.Tensor:
        self._fill(self.bitmask)
        return self.bitmask

    def allowed(self, token: int) -> bool:
        return _bit(self.mask()[0], token)

    def accept(self, token: int) -> None:
        if not self._accept(token):
            raise ValueError(f"token {token} refused after its mask bit was set")

    def eos_allowed(self) -> bool:
        return self.allowed(self.eos)


class XGrammarEngine(_Peer):
    name = "xgrammar"

    def setup(self, tok: Any) -> None:
        import xgrammar as xgr

        self.xgr, self.eos = xgr, tok.eos_token_id
        self.info = xgr.TokenizerInfo.from_huggingface(
            transformers_tokenizer(tok), vocab_size=len(tok), stop_token_ids=[tok.eos_token_id]
        )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self.words = (self.info.vocab_size + 31) // 32

    def first_mask(self, schema: Any) -> tuple[Any, dict]:
        self.compiler.clear_cache()
        compiled, compile_s = timed(
            lambda: self.compiler.compile_json_schema(json.dumps(schema), strict_mode=False)
        )
        _, mask_s = timed(lambda: self.cursor(compiled).allowed(0))
        return compiled, {
            "compile_ms": ms(compile_s),
            "mask_ms": ms(mask_s),
            "first_mask_ms": ms(compile_s + mask_s),
        }

    def cursor(self, compiled: Any) -> Any:
        m = self.xgr.GrammarMatcher(compiled)
        return _BitmaskCursor(m.fill_next_token_bitmask, m.accept_token, self.words, self.eos)


class LLGuidanceEngine(_Peer):
    name = "llguidance"

    def setup(self, tok: Any) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg, self.lt, self.eos = llguidance, llguidance.torch, tok.eos_token_id
        self.lltok = llguidance.hf.from_tokenizer(transformers_tokenizer(tok), n_vocab=len(tok))
        self.words = (self.lltok.vocab_size + 31) // 32

    def first_mask(self, schema: Any) -> tuple[Any, dict]:
        def build() -> Any:
            grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
            matcher = self.llg.LLMatcher(self.lltok, grammar, log_level=0)
            if matcher.is_error():
                raise ValueError(matcher.get_error()[:300])
            return grammar, matcher

        (grammar, matcher), compile_s = timed(build)
        _, mask_s = timed(lambda: self._wrap(matcher).allowed(0))
        return grammar, {
            "compile_ms": ms(compile_s),
            "mask_ms": ms(mask_s),
            "first_mask_ms": ms(compile_s + mask_s),
        }

    def cursor(self, grammar: Any) -> Any:
        return self._wrap(self.llg.LLMatcher(self.lltok, grammar, log_level=0))

    def _wrap(self, m: Any) -> Any:
        def fill(bm: torch.Tensor) -> None:
            self.lt.fill_next_token_bitmask(m, bm, 0)
            if m.is_error():
                raise ValueError(m.get_error()[:300])

        return _BitmaskCursor(fill, m.consume_token, self.words, self.eos)


ENGINES = [LmprogEngine, XGrammarEngine, LLGuidanceEngine]


def judge(engine: Any, compiled: Any, ids: list[int]) -> bool:
    """Whether the engine accepts the token sequence: each token's mask bit set, then EOS."""
    cursor = engine.cursor(compiled)
    for t in ids:
        if not cursor.allowed(t):
            return False
        cursor.accept(t)
    return cursor.eos_allowed()


# ---- the bench schemas -----------------------------------------------------------------------


def walk_times(
    engine: Any, compiled: Any, ids: list[int], logits: torch.Tensor
) -> tuple[list[float], list[float], list[float]]:
    """(mask, mask+apply, mask+apply CPU) times at each position of one walk over `ids` (and
    the EOS step)."""
    cursor, masks, totals, cpus = engine.cursor(compiled), [], [], []
    for t in [*ids, None]:
        c0 = time.thread_time()
        t0 = time.perf_counter()
        bitmask = cursor.mask()
        t1 = time.perf_counter()
        apply_bitmask_(logits, bitmask)
        t2 = time.perf_counter()
        cpus.append(time.thread_time() - c0)
        masks.append(t1 - t0)
        totals.append(t2 - t0)
        if t is not None:
            cursor.accept(t)
    return masks, totals, cpus


def measure_engine(engine: Any, tok: Any, passes: int) -> dict:
    result: dict[str, Any] = {"engine": engine.name, "schemas": {}}
    _, setup_s = timed(lambda: engine.setup(tok))
    result["setup_ms"] = ms(setup_s)
    settle()
    masks: dict[str, list[float]] = {"first": [], "repeat": [], "other": []}
    totals: dict[str, list[float]] = {"first": [], "repeat": [], "other": []}
    cpus: dict[str, list[float]] = {"first": [], "repeat": [], "other": []}
    logits = torch.zeros(1, len(tok))
    for name, schema, instance in SCHEMAS:
        log(f"{engine.name}: {name}")
        row: dict[str, Any] = {}
        result["schemas"][name] = row
        try:
            compiled, parts = first_mask_timed(engine, schema)
        except Exception as exc:  # an engine that cannot compile a schema is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            continue
        row.update(parts)
        ids = tok.encode(text(instance), add_special_tokens=False)
        other = tok.encode(text(OTHER[name]), add_special_tokens=False)
        row["tokens"] = [len(ids), len(other)]
        row["accepts"] = [judge(engine, compiled, ids), judge(engine, compiled, other)]
        if not all(row["accepts"]):
            continue
        # The judging walks above visited every position already: time on a fresh compile.
        compiled, _ = engine.first_mask(schema)
        for p in range(passes + 1):
            key = "first" if p == 0 else "repeat" if p < passes else "other"
            m, t, c = walk_times(engine, compiled, other if key == "other" else ids, logits)
            masks[key] += m
            totals[key] += t
            cpus[key] += c
    result["mask_us"] = {k: percentiles(v) for k, v in masks.items()}
    result["mask_apply_us"] = {k: percentiles(v) for k, v in totals.items()}
    result["mask_apply_cpu_us"] = {k: percentiles(v) for k, v in cpus.items()}
    return result


def percentiles(seconds: list[float]) -> dict:
    if not seconds:
        return {}
    xs = sorted(s * 1e6 for s in seconds)
    return {
        "p50": xs[len(xs) // 2],
        "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))],
        "max": xs[-1],
        "n": len(xs),
    }


# ---- the corpus ------------------------------------------------------------------------------
CORPUS_DEADLINE_S = 20.0


def corpus_worker(engine_name: str, tok: Any, conn: Any, corpus: list) -> None:
    """In a forked process: compile each schema it is sent, report, judge its instances."""
    engine = next(cls() for cls in ENGINES if cls.name == engine_name)
    engine.setup(tok)
    settle()
    conn.send(("ready", None))
    while True:
        i = conn.recv()
        if i is None:
            return
        entry = corpus[i]
        try:
            compiled, parts = first_mask_timed(engine, entry.schema)
        except Exception as exc:
            conn.send(("refused", f"{type(exc).__name__}: {str(exc)[:200]}"))
            continue
        conn.send(("compiled", parts))
        compiled = engine.reader(compiled)
        verdicts = []
        for valid, instances in ((True, entry.valid), (False, entry.invalid)):
            for x in instances:
                ids = tok.encode(text(x), add_special_tokens=False)
                try:
                    accepted = judge(engine, compiled, ids)
                except Exception as exc:
                    accepted = False
                    verdicts.append((valid, accepted, f"error {type(exc).__name__}: {exc}"[:120]))
                    continue
                verdicts.append((valid, accepted, ""))
        conn.send(("judged", verdicts))


class _Worker:
    def __init__(self, engine_name: str, tok: Any, corpus: list) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("fork")  # the corpus reaches the child by fork, not pickled
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=corpus_worker, args=(engine_name, tok, child, corpus), daemon=True
        )
        self.proc.start()
        child.close()
        assert self.recv(120)[0] == "ready"

    def recv(self, timeout: float) -> tuple[str, Any]:
        if not self.conn.poll(timeout):
            return ("stalled", None)
        try:
            return self.conn.recv()
        except EOFError:
            return ("crashed", None)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()


def measure_corpus(
    tok: Any, engine_names: list[str], corpus: list | None = None, checked: bool = False
) -> dict:
    """Each engine over a corpus of `schema_corpus.Entry` (default: bench/schema_corpus.py's),
    checked with jsonschema first (unless `checked`)."""
    from schema_corpus import CORPUS, check_corpus

    corpus = CORPUS if corpus is None else corpus
    if not checked:
        check_corpus(corpus)
    out = {}
    for name in engine_names:
        worker, rows = _Worker(name, tok, corpus), []
        for i, entry in enumerate(corpus):
            worker.conn.send(i)
            kind, payload = worker.recv(CORPUS_DEADLINE_S)
            row: dict[str, Any] = {"schema": entry.name, "status": kind}
            if kind == "compiled":
                row.update(payload)
                kind2, verdicts = worker.recv(CORPUS_DEADLINE_S)
                if kind2 == "judged":
                    row["verdicts"] = verdicts
                else:
                    row["status"] = f"{kind2} while judging"
                    kind = kind2
            elif kind == "refused":
                row["reason"] = payload
            if kind in ("stalled", "crashed"):
                log(f"{name}: {entry.name}: {kind}; restarting the worker")
                worker.kill()
                worker = _Worker(name, tok, corpus)
            rows.append(row)
        worker.conn.send(None)
        worker.proc.join(10)
        out[name] = summarize_corpus(rows)
        log(f"corpus {name}: {json.dumps({k: v for k, v in out[name].items() if k != 'rows'})}")
    return out


def measure_real(tok: Any, engine_names: list[str], shuffle: bool = False) -> dict:
    """The real-world schemas of bench/schema_corpus_real.py, as the corpus; with `shuffle`,
    every instance's object keys in a random order at every level (`shuffled`)."""
    from schema_corpus_real import REAL, check_real

    check_real()
    return measure_corpus(tok, engine_names, shuffled_corpus(REAL) if shuffle else REAL, True)


def shuffled(value: Any, rng: Any) -> Any:
    """`value` with the keys of every object in it in a random order."""
    if isinstance(value, list):
        return [shuffled(x, rng) for x in value]
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: shuffled(value[k], rng) for k in keys}
    return value


def shuffled_corpus(entries: list) -> list:
    """Each entry with its instances' keys shuffled (seeded by the entry's name: the same
    orders in every run)."""
    import random
    from dataclasses import replace

    out = []
    for e in entries:
        rng = random.Random(e.name)
        out.append(
            replace(
                e,
                valid=tuple(shuffled(x, rng) for x in e.valid),
                invalid=tuple(shuffled(x, rng) for x in e.invalid),
            )
        )
    return out


def _corpus(shuffle: bool) -> list:
    from schema_corpus import CORPUS

    return shuffled_corpus(CORPUS) if shuffle else CORPUS


def summarize_corpus(rows: list[dict]) -> dict:
    compiled = [r for r in rows if "verdicts" in r]
    right = [r for r in compiled if all(v == a for v, a, _ in r["verdicts"])]
    times = sorted(r["first_mask_ms"] for r in compiled)
    cpu = sorted(r["first_mask_cpu_ms"] for r in compiled)
    invalid_accepted = [
        (r["schema"], i)
        for r in compiled
        for i, (v, a, _) in enumerate(r["verdicts"])
        if a and not v
    ]
    valid_rejected = [
        (r["schema"], i)
        for r in compiled
        for i, (v, a, _) in enumerate(r["verdicts"])
        if v and not a
    ]
    refusals: dict[str, int] = {}
    for r in rows:
        if r["status"] == "refused":
            key = r["reason"].split(" at ")[0][:90]
            refusals[key] = refusals.get(key, 0) + 1
    return {
        "schemas": len(rows),
        "compiled": len(compiled),
        "refused": sum(r["status"] == "refused" for r in rows),
        "crashed_or_stalled": sum(r["status"] not in ("compiled", "refused") for r in rows),
        "judged_right": len(right),
        "invalid_accepted": len(invalid_accepted),
        "valid_rejected": len(valid_rejected),
        "first_mask_p50_ms": times[len(times) // 2] if times else None,
        "first_mask_max_ms": times[-1] if times else None,
        "first_mask_cpu_p50_ms": cpu[len(cpu) // 2] if cpu else None,
        "first_mask_cpu_max_ms": cpu[-1] if cpu else None,
        "slowest": sorted(((r["first_mask_ms"], r["schema"]) for r in compiled), reverse=True)[:3],
        "invalid_accepted_where": invalid_accepted[:40],
        "valid_rejected_where": valid_rejected[:40],
        "refusals": dict(sorted(refusals.items(), key=lambda kv: -kv[1])),
        "rows": rows,
    }


# ---- conformance through the tokens ----------------------------------------------------------
CONFORMANCE_SECONDS = 900


def measure_conformance(engine_names: list[str]) -> dict:
    """JSON-Schema-Test-Suite core, each engine through its tokens (bench/conformance.py), one
    subprocess per engine so that a blow-up is reported instead of ending the bench."""
    out = {}
    for name in engine_names:
        out[name] = _conformance_subprocess(name)
        log(f"conformance {name}: {format_conformance(out[name])}")
    return out


def _conformance_subprocess(name: str) -> dict:
    import subprocess

    cmd = [sys.executable, __file__, "--conformance-of", name]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=CONFORMANCE_SECONDS)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {CONFORMANCE_SECONDS} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {done.returncode}: {tail[:100]}"}
    return json.loads(lines[-1])


def conformance_of(name: str, tok: Any) -> dict:
    """Run in the subprocess: one engine's report as a JSON line on stdout."""
    import conformance

    if name == "lmprog":
        compile_fn = conformance.lmprog_token_compile
    else:
        engine = next(cls() for cls in ENGINES if cls.name == name)
        engine.setup(tok)

        def compile_fn(schema: Any) -> Callable[[str], bool]:
            compiled = engine.reader(engine.first_mask(schema)[0])
            return lambda t: judge(engine, compiled, tok.encode(t, add_special_tokens=False))

    start = time.perf_counter()
    report = conformance.run_suite(compile_fn).to_dict()
    report["seconds"] = time.perf_counter() - start
    return report


def format_conformance(conf: Any) -> str:
    if isinstance(conf, dict) and "pass_rate" in conf:
        return (
            f"{conf['pass_rate']:.1%} judged right, {conf['invalid_accepted']} invalid accepted, "
            f"{conf['refused_cases']} refused"
        )
    if isinstance(conf, dict) and "error" in conf:
        return f"error: {conf['error'][:60]}"
    return str(conf)[:80]


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


def fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def report_corpus(title: str, entries: list, corpus: dict) -> None:
    n_valid = sum(len(e.valid) for e in entries)
    n_invalid = sum(len(e.invalid) for e in entries)
    print(
        f"\n## {title}: {len(entries)} schemas, {n_valid} valid + {n_invalid} invalid instances, "
        f"judged through the tokens ({CORPUS_DEADLINE_S:.0f} s deadline per schema)"
    )
    print(
        "| engine | compiled | refused | crashed or stalled | first mask p50 / max ms "
        "(CPU) | every instance judged right | invalid accepted | valid rejected |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, c in corpus.items():
        print(
            f"| {name} | {c['compiled']} | {c['refused']} | {c['crashed_or_stalled']} | "
            f"{fmt(c['first_mask_p50_ms'], 2)} / {fmt(c['first_mask_max_ms'], 1)} "
            f"({fmt(c['first_mask_cpu_p50_ms'], 2)} / {fmt(c['first_mask_cpu_max_ms'], 1)}) | "
            f"**{c['judged_right']}** ({c['judged_right'] / c['schemas']:.1%}) | "
            f"{c['invalid_accepted']} | {c['valid_rejected']} |"
        )
    for name, c in corpus.items():
        print(f"\n{name}: slowest first masks {c['slowest']}")
        if c["refusals"]:
            print(f"{name}: refusals {c['refusals']}")
        if c["invalid_accepted_where"]:
            print(f"{name}: invalid accepted in {c['invalid_accepted_where']}")
        if c["valid_rejected_where"]:
            print(f"{name}: valid rejected in {c['valid_rejected_where']}")


def report(
    results: list[dict],
    corpus: dict,
    conformance: dict,
    jump: dict,
    missing: dict,
    real: dict,
    shuffle: bool = False,
) -> None:
    names = [r["engine"] for r in results]
    shuffled_title = ", instances' keys shuffled" if shuffle else ""
    print(
        "\n## Cold time to the first mask per schema (ms, wall); lmprog: total (compile + index "
        "+ mask)"
    )
    print(f"| schema | {' | '.join(names)} |")
    print("|---|" + "---|" * len(names))
    for name, _, _ in SCHEMAS:
        cells = []
        for r in results:
            row = r["schemas"].get(name, {})
            if "error" in row:
                cells.append(f"refused ({row['error'][:40]})")
                continue
            cell = f"{row['first_mask_ms']:.2f}"
            if "compile_ms" in row and "index_ms" in row:
                cell += f" ({row['compile_ms']:.2f} + {row['index_ms']:.2f} + {row['mask_ms']:.2f})"
            if not all(row.get("accepts", [True])):
                cell += f" (rejects a valid instance: {row['accepts']})"
            cells.append(cell)
        print(f"| {name} | {' | '.join(cells)} |")
    print(
        "\n## Summary over the bench schemas (per-token times in µs, p50 / p99 / max; "
        "mask = the bitmask of the position, apply = apply_bitmask_ on [1, 49k] logits)"
    )
    print(
        "| engine | setup ms | first mask p50 / max ms | mask: first pass | repeat passes "
        "| other instance | mask+apply: first pass | repeat passes | other instance "
        "| instances accepted |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    cpu_rows = []
    for r in results:
        ok = [row for row in r["schemas"].values() if "error" not in row]
        cold = sorted(row["first_mask_ms"] for row in ok)
        accepted = sum(sum(row["accepts"]) for row in ok)
        m, a = r["mask_us"], r["mask_apply_us"]

        def pct(d: dict) -> str:
            return f"{fmt(d.get('p50'))} / {fmt(d.get('p99'))} / {fmt(d.get('max'), 0)}"

        print(
            f"| {r['engine']} | {r['setup_ms']:.0f} | {cold[len(cold) // 2]:.2f} / {cold[-1]:.2f} | "
            f"{pct(m['first'])} | {pct(m['repeat'])} | {pct(m['other'])} | "
            f"{pct(a['first'])} | {pct(a['repeat'])} | {pct(a['other'])} | "
            f"{accepted}/{2 * len(SCHEMAS)} (compiled {len(ok)}/{len(SCHEMAS)}) |"
        )
        cpu = sorted(row["first_mask_cpu_ms"] for row in ok)
        c = r["mask_apply_cpu_us"]
        cpu_rows.append(
            f"| {r['engine']} | {cpu[len(cpu) // 2]:.2f} / {cpu[-1]:.2f} | {pct(c['first'])} | "
            f"{pct(c['repeat'])} | {pct(c['other'])} |"
        )
    print("\nThe same in the calling thread's CPU time (no preemption by other processes):")
    print(
        "| engine | first mask p50 / max ms | mask+apply µs: first pass | repeat passes "
        "| other instance |"
    )
    print("|---|---|---|---|---|")
    print("\n".join(cpu_rows))
    for name, why in missing.items():
        print(f"| {name} | not available: {why} |")
    if corpus:
        from schema_corpus import CORPUS

        report_corpus("Corpus" + shuffled_title, CORPUS, corpus)
    if real:
        from schema_corpus_real import REAL

        title = "Real-world schemas (bench/schema_corpus_real.py)" + shuffled_title
        report_corpus(title, REAL, real)
    if conformance:
        print("\n## JSON-Schema-Test-Suite core (1,299 cases), judged through the tokens")
        for name, conf in conformance.items():
            print(f"- {name}: {format_conformance(conf)}")
    if jump:
        print(
            "\n## Jump-forward on fixed-key schemas (decode steps = forward passes that sample a token)"
        )
        print("| schema | steps without | steps with | reduction | jump_forward() p50 / p99 µs |")
        print("|---|---|---|---|---|")
        for name, case in jump.items():
            print(
                f"| {name} | {case['steps_plain']} | {case['steps_jump']} | {case['reduction']:.1%} | "
                f"{case['jump_call_us']['p50']:.1f} / {case['jump_call_us']['p99']:.1f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=3, help="walks over each instance's tokens")
    parser.add_argument("--corpus", action="store_true", help="also run bench/schema_corpus.py")
    parser.add_argument(
        "--real", action="store_true", help="also run bench/schema_corpus_real.py's schemas"
    )
    parser.add_argument(
        "--shuffle",
        action="store_true",
        help="--corpus/--real: every instance's object keys in a random order",
    )
    parser.add_argument("--conformance", action="store_true", help="also run the test suite")
    parser.add_argument("--jump", action="store_true", help="also simulate jump-forward")
    parser.add_argument("--engines", default=",".join(c.name for c in ENGINES))
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--conformance-of", help=argparse.SUPPRESS)  # internal: one engine's suite
    args = parser.parse_args()
    tok = load_tokenizer(resolve_model())
    if args.conformance_of:
        print(json.dumps(conformance_of(args.conformance_of, tok), default=str))
        return
    wanted = args.engines.split(",")
    print(f"tokenizer: {resolve_model().name}, {len(tok)} tokens; torch threads 1")
    results, names, missing = [], [], {}
    for cls in ENGINES:
        if cls.name not in wanted:
            continue
        try:
            results.append(measure_engine(cls(), tok, args.passes))
            names.append(cls.name)
        except ImportError as exc:
            missing[cls.name] = str(exc)
    clear_memory_cache()
    corpus = measure_corpus(tok, names, _corpus(args.shuffle)) if args.corpus else {}
    real = measure_real(tok, names, args.shuffle) if args.real else {}
    conformance = measure_conformance(names) if args.conformance else {}
    jump = measure_jump_forward(tok) if args.jump else {}
    report(results, corpus, conformance, jump, missing, real, args.shuffle)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "engines": results,
                    "corpus": corpus,
                    "real": real,
                    "conformance": conformance,
                    "jump": jump,
                    "missing": missing,
                },
                indent=1,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
