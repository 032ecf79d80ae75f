"""Dead ends of constrained decoding (issue 36): random walks through a guide until no token is
allowed (ConstraintError: a request would fail there) or a walk runs on without ending.

A walk writes bytes over the one-byte-per-token vocabulary, mostly copying a target text (an
instance, or an object mixing several oneOf branches' keys) and straying at random, then,
past half its limit, prefers closing bytes (`]`, `}`, `"`, `0`) and EOS: a walk that still
does not end (`long`) is one the constraint keeps open (an object in two branches of a
counted oneOf takes keys for ever). Every finished text is judged by jsonschema (`invalid`;
`float`: invalid only as Python floats read the numbers, valid read as Decimals).

    PYTHONPATH=. python bench/fuzz_dead_ends.py oneof [--walks 100]   # counted oneOf shapes
    PYTHONPATH=. python bench/fuzz_dead_ends.py corpus [--walks 20]   # the corpora's checked schemas
    PYTHONPATH=. python bench/fuzz_dead_ends.py random [--schemas 300] [--seed 0]
    PYTHONPATH=. python bench/fuzz_dead_ends.py backref-ms             # mask ms, SmolLM2

`corpus`: bench/schema_corpus.py and bench/schema_corpus_real.py, the schemas whose grammar
has decode-time checks (only those can dead-end), walks near their instances. `random`: the
random schemas of tests/fsm/test_checks_fuzz.py that have checks, walks near random values.
`backref-ms`: the filter's ms per mask along `{"d": "helloworld-helloworld"}` under
`^(\\w+)-\\1$` on the default model's tokenizer, one match per token (the old loop) against
`PatternMatch.fits_each`, alternating, the least of three rounds per step.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests" / "fsm")]

import jsonschema  # noqa: E402

from lmprog.core.errors import ConstraintError  # noqa: E402
from lmprog.fsm import Constraint  # noqa: E402
from lmprog.fsm.index import BYTES, TokenIndex  # noqa: E402
from lmprog.fsm.json_schema import build_grammar  # noqa: E402

_CLOSE = frozenset(b']}"0')
_STRUCT = frozenset(b'"{}[],: 0123456789-.eEtrufalsn')


def walk(c: Constraint, rng: random.Random, like: str, limit: int = 600) -> tuple[str, str, str]:
    """(outcome, text, why): "done", "dead" (no token allowed: the guide's reason) or "long"
    (past `limit` bytes)."""
    guide = TokenIndex.get(c, BYTES).new_guide()
    target, k, out = like.encode(), 0, bytearray()
    while len(out) < limit:
        try:
            ids = guide.allowed_token_ids().tolist()
        except ConstraintError as e:
            return "dead", out.decode(errors="replace"), str(e)
        closing = len(out) >= limit // 2
        if ids == [256] or 256 in ids and (closing or k >= len(target) and rng.random() < 0.5):
            return "done", out.decode(), ""
        ids = [t for t in ids if t != 256]
        if closing and set(ids) & _CLOSE and rng.random() < 0.9:
            byte = rng.choice(sorted(set(ids) & _CLOSE))
        elif k < len(target) and target[k] in ids and rng.random() < 0.9:
            byte = target[k]
        else:
            preferred = [t for t in ids if t in _STRUCT]
            byte = rng.choice(preferred if preferred and rng.random() < 0.5 else ids)
            k += k < len(target) and rng.random() < 0.5
        k += k < len(target) and byte == target[k]
        guide.advance(byte)
        out.append(byte)
    return "long", out.decode(errors="replace"), ""


def judge(validator: Any, text: str, counts: collections.Counter) -> None:
    try:
        if validator.is_valid(json.loads(text)):
            return
        if validator.is_valid(json.loads(text, parse_float=Decimal)):
            counts["float"] += 1
            return
    except Exception:  # (jsonschema cannot read a pattern: \p{..})
        return
    counts["invalid"] += 1
    print("INVALID", text[:200])


def oneof_shapes() -> dict[str, dict]:
    """oneOf over n open objects each requiring typed keys of its own (the shapes of
    docs/benchmarks.md "The 512-branch and work caps"), with a shared key, and untyped."""
    types = ["string", "integer", "boolean", "number"]
    out = {}
    for n in (4, 8, 10):
        keys = 3 if n == 10 else 2
        typed, shared, untyped = [], [], []
        for i in range(n):
            props = {f"k{i}_{j}": {"type": types[(i + j) % 4]} for j in range(keys)}
            typed.append({"type": "object", "properties": props, "required": list(props)})
            s = {**props, "s": {"type": "integer" if i % 2 else "string"}}
            shared.append({"type": "object", "properties": s, "required": list(s)})
            free = {k: {} for k in props}
            untyped.append(
                {"type": "object", "properties": {**free, "s": {}}, "required": list(free)}
            )
        out |= {f"open{n}": typed, f"shared{n}": shared, f"untyped{n}": untyped}
    return {name: {"oneOf": branches} for name, branches in out.items()}


def mixed(schema: dict, rng: random.Random) -> str:
    """An object holding the keys of one or more branches, and some other keys of theirs."""
    branches = schema["oneOf"]
    names = sorted({k for b in branches for k in b["properties"]})
    sample = {"string": "s", "integer": 3, "boolean": False, "number": 1.5}
    values = [1, "a", True, 2.5, None, [1], {"x": 1}]
    x: dict = {}
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.5:
            for k, s in rng.choice(branches)["properties"].items():
                x[k] = sample[s["type"]] if "type" in s else rng.choice(values)
        else:
            x[rng.choice(names)] = rng.choice(values)
    items = list(x.items())
    rng.shuffle(items)
    return json.dumps(dict(items))


def run_oneof(walks: int) -> None:
    for name, schema in oneof_shapes().items():
        for strict in (False, True):
            c = Constraint.from_json_schema(schema, strict=strict)
            validator = jsonschema.Draft202012Validator(schema)
            rng, counts = random.Random(1), collections.Counter()
            for _ in range(walks):
                outcome, text, _ = walk(c, rng, mixed(schema, rng))
                counts[outcome] += 1
                if outcome == "done":
                    judge(validator, text, counts)
            print(name, "strict" if strict else "loose", dict(counts), flush=True)


def run_many(named: list[tuple[str, Any, list[str]]], walks: int) -> None:
    counts, reasons = collections.Counter(), collections.Counter()
    for name, schema, likes in named:
        try:
            if build_grammar(schema, strict=False).check is None:
                continue
            c = Constraint.from_json_schema(schema, strict=False)
        except ConstraintError:
            continue
        counts["schemas"] += 1
        validator = jsonschema.validators.validator_for(schema)(schema)
        rng = random.Random(0)
        for i in range(walks):
            outcome, text, why = walk(c, rng, likes[i % len(likes)])
            counts[outcome] += 1
            if outcome == "done":
                judge(validator, text, counts)
            elif outcome == "dead":
                reasons[why[:100]] += 1
                if reasons[why[:100]] == 1:
                    print("DEAD", name, json.dumps(schema)[:200], "|", repr(text[-80:]))
    print(dict(counts))
    print(reasons.most_common())


def corpus() -> list[tuple[str, Any, list[str]]]:
    from schema_corpus import CORPUS
    from schema_corpus_real import REAL

    return [(e.name, e.schema, [json.dumps(v) for v in e.valid + e.invalid]) for e in CORPUS + REAL]


def random_schemas(n: int, seed: int) -> list[tuple[str, Any, list[str]]]:
    from test_checks_fuzz import _schema, _value

    rng = random.Random(seed)
    out = []
    for i in range(n):
        schema = _schema(rng, 3)
        out.append((f"random{i}", schema, [json.dumps(_value(rng, 3)) for _ in range(10)]))
    return out


def backref_ms() -> None:
    import numpy as np
    from fsm_toys import follow_text

    from lmprog.core.models import load_tokenizer, resolve_model
    from lmprog.fsm import check_masks
    from lmprog.fsm.guide import _computed
    from lmprog.fsm.json_schema.terms.matched import PatternMatch

    def one_by_one(self: PatternMatch, q: str, texts: list[str]) -> list[bool]:
        return [self.fits(q + t, 0, b"") for t in texts]

    batched = PatternMatch.fits_each
    tok = load_tokenizer(resolve_model())
    pattern = r"^(\w+)-\1$"
    schema = {"type": "object", "properties": {"d": {"type": "string", "pattern": pattern}}}
    index = TokenIndex.get(Constraint.from_json_schema(schema), tok)
    guide, out, steps = index.new_guide(), [], []
    target = b'{"d": "helloworld-helloworld"}'
    while True:
        token = follow_text(guide, target, out)
        if token is None or token == index.eos_token_id:
            break
        state = guide._checks[-1] if guide._checks else None
        if state is not None and index.check.active(state):
            words = guide._run(lambda m: _computed(m, index.num_words))
            steps.append((words, state, index.vocab.decode(out).decode()))
        guide.advance(token)
        out.append(token)
    times: dict[str, list[list[float]]] = {"one by one": [], "fits_each": []}
    masks: dict[str, list[bytes]] = {}
    for r in range(3):
        runs = [("one by one", one_by_one), ("fits_each", batched)]
        for name, fn in runs if r % 2 == 0 else runs[::-1]:
            PatternMatch.fits_each = fn  # type: ignore[method-assign]
            per, got = [], []
            for words, state, _ in steps:
                start = time.perf_counter()
                got.append(check_masks.filter_words(index.check, state, words, index.vocab))
                per.append((time.perf_counter() - start) * 1e3)
            times[name].append(per)
            masks[name] = [m.tobytes() for m in got]
    PatternMatch.fits_each = batched  # type: ignore[method-assign]
    assert masks["one by one"] == masks["fits_each"]
    print("after:", " | ".join(text[-14:] for _, _, text in steps))
    for name, runs in times.items():
        print(f"{name}: " + " ".join(f"{x:.1f}" for x in np.min(np.array(runs), axis=0)) + " ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["oneof", "corpus", "random", "backref-ms"])
    parser.add_argument("--walks", type=int, default=0)
    parser.add_argument("--schemas", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.what == "oneof":
        run_oneof(args.walks or 100)
    elif args.what == "corpus":
        run_many(corpus(), args.walks or 20)
    elif args.what == "random":
        run_many(random_schemas(args.schemas, args.seed), args.walks or 10)
    else:
        backref_ms()


if __name__ == "__main__":
    main()
