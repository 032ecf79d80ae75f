"""Texts read in every JSON spelling (issue 36): the reading grammar of each schema of the
corpora (bench/schema_corpus.py, bench/schema_corpus_real.py) built with and without
``read_spellings``, its size and compile time, and each instance read in random spellings.

    PYTHONPATH=. python bench/bench_spellings.py [--spellings N] [--hashes] [--tokens]

Per schema: the reading grammar's characters and its compile time (build_grammar plus the
token engine's grammar over bytes), canonical spellings vs every spelling, measured
alternately in one process; each valid instance (judged by jsonschema, formats asserted)
dumped with ``ensure_ascii=True`` and in N random spellings (``fsm_toys.json_spelled``:
escapes, shuffled keys, whitespace) must be accepted by ``matches``, each invalid one refused
in every spelling; the texts the canonical-spelling reading refused are counted (``refused_before``).
``--hashes``: print only each schema's generation grammar hash (run against two trees to
check that generation is unchanged). ``--tokens``: each instance through the default
model's tokens (``through_tokens``), the token reader's spellings against canonical ones.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(ROOT.parent / "tests" / "fsm")]

from fsm_toys import json_spelled  # noqa: E402
from schema_corpus import CORPUS  # noqa: E402
from schema_corpus_real import REAL, validator  # noqa: E402

from lmprog.core.errors import ConstraintError  # noqa: E402
from lmprog.fsm import Constraint, json_schema  # noqa: E402
from lmprog.fsm.constraint import READ_WHITESPACE, READ_WHITESPACE_CHARS  # noqa: E402
from lmprog.fsm.index import BYTES, TokenIndex, matches_bytes  # noqa: E402


def reading(schema: object, spellings: bool | str) -> tuple[Constraint, float]:
    """The reading constraint (every spelling, literals' or none) and its compile seconds."""
    start = time.perf_counter()
    g = json_schema.build_grammar(
        schema, strict=False, key_order="any", whitespace=READ_WHITESPACE, read_spellings=spellings
    )
    c = Constraint("json_schema", "", json.dumps(schema), lark=g.lark, check=g.check)
    TokenIndex.get(c, BYTES)
    return c, time.perf_counter() - start


def main() -> None:
    n = next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--spellings=")), 4)
    entries = [("corpus", e) for e in CORPUS] + [("real", e) for e in REAL]
    if "--hashes" in sys.argv:
        for kind, e in entries:
            try:
                lark = Constraint.from_json_schema(e.schema, strict=False).lark or ""
            except ConstraintError:
                lark = "refused"
            print(kind, e.name, hashlib.sha256(lark.encode()).hexdigest()[:16])
        return
    if "--tokens" in sys.argv:
        return through_tokens(entries)
    rng = random.Random(36)
    tot = {"schemas": 0, "refused": 0, "chars0": 0, "chars1": 0, "t0": 0.0, "t1": 0.0}
    seen = {
        "valid": 0,
        "accepted": 0,
        "refused_before": 0,
        "invalid": 0,
        "invalid_refused": 0,
    }
    shuffled = {"shuffled_valid": 0, "shuffled_accepted": 0, "canonical_spelling_refused": 0}
    growth, slower = [], []
    for kind, e in entries:
        try:
            times = [[], []]
            for r in range(3):  # alternated: canonical, every spelling, ...
                for on in (False, True) if r % 2 == 0 else (True, False):
                    c, dt = reading(e.schema, on)
                    times[on].append(dt)
                    if on:
                        new = c
                    else:
                        old = c
        except ConstraintError:
            tot["refused"] += 1
            continue
        tot["schemas"] += 1
        tot["chars0"] += len(old.lark or "")
        tot["chars1"] += len(new.lark or "")
        tot["t0"] += min(times[0])
        tot["t1"] += min(times[1])
        growth.append((len(new.lark or "") / max(1, len(old.lark or "")), kind, e.name))
        slower.append((min(times[1]) / min(times[0]), kind, e.name))
        judge = validator(e.schema)
        for valid, instances in ((True, e.valid), (False, e.invalid)):
            for x in instances:
                if judge.is_valid(x) != valid:
                    continue
                ascii_text = json.dumps(x, ensure_ascii=True)
                texts = [ascii_text] + [json_spelled(x, rng, shuffle=False) for _ in range(n)]
                texts += [json_spelled(x, rng) for _ in range(n)]
                got = [matches_bytes(new, t.strip(READ_WHITESPACE_CHARS).encode()) for t in texts]
                if valid:
                    seen["valid"] += n + 1
                    seen["accepted"] += sum(got[: n + 1])
                    before = [
                        matches_bytes(old, t.strip(READ_WHITESPACE_CHARS).encode()) for t in texts
                    ]
                    seen["refused_before"] += before[: n + 1].count(False)
                    if not all(got[: n + 1]):
                        print("REJECTED", kind, e.name, texts[got.index(False)][:200])
                    # keys shuffled too: an object the reading writes in canonical order
                    # (docs/design/json-schema.md, members in any order) may refuse an order
                    shuffled["shuffled_valid"] += n
                    shuffled["shuffled_accepted"] += sum(got[n + 1 :])
                    for t, ok in zip(texts[n + 1 :], got[n + 1 :]):
                        canonical = json.dumps(json.loads(t), ensure_ascii=False)
                        if not ok and not matches_bytes(new, canonical.encode()):
                            shuffled["canonical_spelling_refused"] += 1
                else:
                    seen["invalid"] += len(texts)
                    seen["invalid_refused"] += got.count(False)
                    if any(got):
                        print("ACCEPTED", kind, e.name, texts[got.index(True)][:200])
    growth.sort(reverse=True)
    slower.sort(reverse=True)
    print(json.dumps(tot | seen | shuffled))
    print("largest growth:", [(round(g, 2), k, name) for g, k, name in growth[:5]])
    print("most slowed:", [(round(g, 2), k, name) for g, k, name in slower[:5]])


def through_tokens(entries: list) -> None:
    """``--tokens``: each instance as ``json.dumps`` writes it by default (``ensure_ascii``)
    and indented, read through the default model's tokens by the reading grammar in canonical
    spelling (False) and with literals in every spelling (``json_schema.LITERALS``, what
    ``Constraint.reading`` builds); and the grammars' characters."""
    from lmprog.core.models import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model())
    modes: tuple[bool | str, ...] = (False, json_schema.LITERALS)
    out = {f"{k}_{m}": 0 for m in modes for k in ("chars", "valid_read", "invalid_read")}
    out |= {"schemas": 0, "refused": 0, "valid_texts": 0, "invalid_texts": 0}

    def read(c: Constraint, text: str) -> bool:
        guide = TokenIndex.get(c, tok).new_guide()
        for t in tok.encode(text, add_special_tokens=False):
            if not guide.is_allowed(t):
                return False
            guide.advance(t)
        return guide.can_stop()

    for kind, e in entries:
        try:
            built = {m: reading(e.schema, m)[0] for m in modes}
        except ConstraintError:
            out["refused"] += 1
            continue
        out["schemas"] += 1
        judge = validator(e.schema)
        for valid, instances in ((True, e.valid), (False, e.invalid)):
            for x in instances:
                if judge.is_valid(x) != valid:
                    continue
                texts = [json.dumps(x), json.dumps(x, indent=2)]
                out["valid_texts" if valid else "invalid_texts"] += len(texts)
                for m, c in built.items():
                    got = [read(c, t) for t in texts]
                    out[f"{'valid' if valid else 'invalid'}_read_{m}"] += sum(got)
                    if (not all(got) if valid else any(got)) and m == json_schema.LITERALS:
                        wrong = texts[got.index(not valid)]
                        print("ACCEPTED" if not valid else "REFUSED", kind, e.name, wrong[:160])
        for m, c in built.items():
            out[f"chars_{m}"] += len(c.lark or "")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
