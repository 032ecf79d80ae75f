"""The grammar shapes lmprog emits, at sizes up to and past its limits, compiled by llguidance
and decoded a few tokens over a one-byte-per-token vocabulary (issue 29, section 1).

Run as a child process by test_grammar_shapes.py (``python grammar_shapes.py SEED DRAWS
[SECONDS]``): every shape at its largest size first (the sizes' lists end with it), then DRAWS
random draws, and more until SECONDS have passed if given, since what it looks for -- a stack
overflow inside llguidance -- kills the process, which no Python code can catch. A count,
not a time, decides what a run tries, so a slow or busy machine tries the same shapes. Each shape's name is printed before it is tried, so a crash names the
last one. Every shape must end in a constraint that decodes, or in ConstraintError where it
is built, compiled or decoded; anything else is printed as FAIL and exits 1.
"""

from __future__ import annotations

import json
import random
import sys
import time

from lmprog.core.errors import ConstraintError
from lmprog.fsm.constraint import Constraint
from lmprog.fsm.index import BYTES, TokenIndex


def wide_object(rng: random.Random) -> tuple[str, object]:
    n = rng.choice([50, 600, 1500, 3000, 6000])
    required = rng.choice(["all", "first", "last", "some", "none"])
    props = {f"p{i}": rng.choice([{"type": "integer"}, {"type": "string"}]) for i in range(n)}
    schema: dict = {"type": "object", "properties": props}
    names = list(props)
    schema["required"] = {
        "none": [],
        "all": names,
        "first": names[:1],
        "last": names[-1:],
        "some": names[:: rng.randint(2, 50)],
    }[required]
    extra = rng.choice(["additional", "min", "max", ""])
    if extra == "additional":
        schema["additionalProperties"] = {"type": "integer"}
    elif extra == "min":
        schema["minProperties"] = rng.randint(1, 3)
    elif extra == "max":
        schema["maxProperties"] = rng.randint(1, 4)
    return f"object of {n} properties, required {required}, {extra or 'plain'}", schema


def deep(rng: random.Random) -> tuple[str, object]:
    depth = rng.choice([20, 40, 63, 64, 200])
    kind = rng.choice(["object", "array", "anyOf", "allOf", "optional"])
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        if kind == "object":
            schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
        elif kind == "optional":
            schema = {"type": "object", "properties": {"a": schema, "b": {"type": "null"}}}
        elif kind == "array":
            schema = {"type": "array", "items": schema}
        elif kind == "anyOf":
            schema = {"anyOf": [schema, {"type": "string"}]}
        else:
            schema = {"allOf": [schema]}
    return f"{kind} nested {depth} deep", schema


def ref_chain(rng: random.Random) -> tuple[str, object]:
    n = rng.choice([100, 1000, 3000])
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    if rng.random() < 0.5:
        defs = {
            f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}}
            for i in range(n)
        }
    defs[f"d{n}"] = {"type": "integer"}
    return f"$ref chain of {n}", {"$defs": defs, "$ref": "#/$defs/d0"}


def long_enum(rng: random.Random) -> tuple[str, object]:
    n = rng.choice([100, 3000, 20000])
    kind = rng.choice(["strings", "numbers", "mixed"])
    values: list = [f"v{i}" for i in range(n)] if kind == "strings" else list(range(n))
    if kind == "mixed":
        values = [v if i % 2 else str(v) for i, v in enumerate(values)]
    return f"enum of {n} {kind}", {"enum": values}


def alternation(rng: random.Random) -> tuple[str, object]:
    n = rng.choice([100, 1000, 2500, 5000])
    branches = [
        {"type": "object", "properties": {f"k{i}": {"const": i}}, "required": [f"k{i}"]}
        for i in range(n)
    ]
    return f"anyOf of {n} objects", {rng.choice(["anyOf", "oneOf"]): branches}


def counted(rng: random.Random) -> tuple[str, object]:
    n = rng.choice([1000, 100_000, 1_000_000, 10**9])
    kind = rng.choice(["items", "length", "prefix", "unique"])
    if kind == "items":
        return f"array of {n} items", {"type": "array", "items": {"type": "integer"}, "minItems": n}
    if kind == "length":
        return f"string of {n} chars", {"type": "string", "minLength": n, "maxLength": n}
    if kind == "unique":
        return f"unique array to {n}", {
            "type": "array",
            "items": {"enum": list(range(60))},
            "uniqueItems": True,
            "maxItems": n,
        }
    m = min(n, 3000)
    return f"prefixItems {m}", {"type": "array", "prefixItems": [{"type": "integer"}] * m}


def number(rng: random.Random) -> tuple[str, object]:
    kind = rng.choice(["multiple", "range", "exclusive"])
    if kind == "multiple":
        m = rng.choice([1e-300, 1e-30, 0.5, 1e300, 3.7e-5])
        return f"multipleOf {m}", {"type": "number", "multipleOf": m}
    lo, hi = sorted(rng.choice([-(10**300), -1.5e-200, 0, 7, 10**18, 1e300]) for _ in range(2))
    key = "exclusiveMinimum" if kind == "exclusive" else "minimum"
    return f"number in [{lo}, {hi}]", {"type": "number", key: lo, "maximum": hi}


def regex(rng: random.Random) -> tuple[str, object]:
    n = rng.choice([100, 10_000, 100_000, 1_000_000])
    kind = rng.choice(["count", "nested", "groups", "alternation", "class"])
    if kind == "count":
        return f"regex a{{{n}}}", f"a{{{n}}}"
    if kind == "nested":
        k = rng.choice([10, 100, 1000])
        return f"regex nested counts {k}", f"((a{{0,{k}}}){{0,{k}}}){{0,{k}}}"
    if kind == "groups":
        d = rng.choice([50, 200, 1000])
        return f"regex {d} nested groups", "(" * d + "a" + ")" * d
    if kind == "class":
        return f"regex [a-z]{{{n}}}", f"[a-z]{{{n}}}"
    m = min(n, 20_000)
    return f"regex of {m} alternatives", "|".join(f"w{i}" for i in range(m))


def ebnf(rng: random.Random) -> tuple[str, object]:
    n = rng.choice([100, 1000, 3000, 12_500])
    kind = rng.choice(["alternatives", "chain", "groups", "terminals", "recursion", "lark"])
    if kind == "alternatives":
        return f"ebnf {n} alternatives", "root ::= " + " | ".join(f'"w{i}"' for i in range(n))
    if kind == "chain":
        rules = [f'r{i} ::= "a" r{i + 1}' for i in range(n)]
        return f"ebnf chain of {n} rules", "root ::= r0\n" + "\n".join(rules) + f'\nr{n} ::= "b"'
    if kind == "groups":
        d = rng.choice([20, 29, 40])
        return f"ebnf {d} nested groups", "root ::= " + '("a" ' * d + '"b"' + ")" * d
    if kind == "terminals":
        rules = [f'T{i}: "a" T{i + 1}' for i in range(n)]
        return f"lark chain of {n} terminals", "start: T0\n" + "\n".join(rules) + f'\nT{n}: "b"'
    if kind == "recursion":
        return "ebnf recursion", 'root ::= "(" root ")" | "x"'
    rules = [f'r{i}: "a" r{i + 1} | "c"' for i in range(n)]
    return f"lark chain of {n} rules", "start: r0\n" + "\n".join(rules) + f'\nr{n}: "b"'


SHAPES = [wide_object, deep, ref_chain, long_enum, alternation, counted, number, regex, ebnf]


def build(source: object) -> Constraint:
    if isinstance(source, dict):
        return Constraint.from_json_schema(source)
    if "::=" in str(source) or str(source).startswith("start:"):
        return Constraint.from_ebnf(str(source))
    return Constraint.from_regex(str(source))


def walk(constraint: Constraint, rng: random.Random, steps: int) -> None:
    """Compile over bytes and decode up to `steps` random allowed bytes."""
    guide = TokenIndex.get(constraint, BYTES).new_guide()
    for _ in range(steps):
        allowed = guide.allowed_token_ids()
        if len(allowed) == 0 or guide.is_finished():
            return
        guide.advance(int(rng.choice(list(allowed))))


class _Largest(random.Random):
    """Draws the last of every choice: each shape at its largest size, first."""

    def choice(self, seq):  # type: ignore[override]
        return seq[-1]


def main(seed: int, draws: int, seconds: float = 0.0) -> int:
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    tried = refused = drawn = 0
    largest = [(shape, _Largest()) for shape in SHAPES]
    while largest or drawn < draws or time.monotonic() < end:
        if largest:
            shape, draw = largest.pop(0)
        else:
            shape, draw = rng.choice(SHAPES), rng
            drawn += 1
        name, source = shape(draw)
        print(f"shape {name}", flush=True)
        started = time.monotonic()
        try:
            walk(build(source), rng, steps=12)
        except ConstraintError as exc:
            refused += 1
            print(f"  refused: {str(exc)[:160]}", flush=True)
        except Exception as exc:  # anything but ConstraintError is the finding
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            return 1
        tried += 1
        print(f"  {time.monotonic() - started:.2f} s", flush=True)
    summary = {"tried": tried, "refused": refused, "largest": len(SHAPES), "drawn": drawn}
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), *map(float, sys.argv[3:4])))
