"""JSON-Schema-Test-Suite conformance of a schema-to-matcher compiler, for any engine.

    from bench.conformance import run_suite
    report = run_suite(lambda schema: Constraint.from_json_schema(schema, strict=False).matches)
    print(report.format())

``compile_fn(schema)`` gets each group's schema (a dict or bool) and returns a matcher
``text -> bool`` over whole JSON texts; raising any exception means "refused". Counting, per
test case (the core draft2020-12 suite, every file except ``optional/``: 1,299 cases in 383 groups):

* the group's schema is refused: every case of the group fails, none counts as invalid accepted;
* else a case passes when the matcher agrees with ``valid`` for the instance's texts. An
  instance is offered in several serializations (``SERIALIZERS``: ``json.dumps`` default spacing,
  compact, and with sorted keys, all with ``ensure_ascii=False``; plus every key order of a
  top-level object of at most 4 keys); a valid instance counts as accepted if any text matches,
  an invalid one as rejected only if no text matches. This keeps engines that fix whitespace or
  key order comparable, and checks rejection over several shapes.

Engines: ``lmprog`` (``Constraint.matches``: the regex's language, checked by the token engine
over a byte vocabulary), ``lmprog-tokens`` (what decoding uses: the model's tokenizer splits
each text, and every token must be allowed by the bitmask of its position, then EOS; issue 14,
item 4) and ``outlines-core`` (its regex, matched with Python ``re``). lmprog compiles with
``strict=False``: the suite measures the spec's reading (objects open unless the schema closes
them), not the strict generation default. Run as a script for a
report (``python bench/conformance.py [--engine=lmprog|lmprog-tokens|outlines-core] [--json]``).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_SUITE = Path(
    os.environ.get(
        "LMPROG_JSON_SCHEMA_SUITE",
        Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "json-schema-test-suite",
    )
)

SERIALIZERS: dict[str, Callable[[object], str]] = {
    "default": lambda v: json.dumps(v, ensure_ascii=False),
    "compact": lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")),
    "sorted": lambda v: json.dumps(v, ensure_ascii=False, sort_keys=True),
}


@dataclass(frozen=True)
class Case:
    file: str
    group: str
    description: str
    data: object
    valid: bool


@dataclass(frozen=True)
class Group:
    file: str
    description: str
    schema: object
    cases: tuple[Case, ...]


@dataclass
class Report:
    total: int = 0
    passed: int = 0
    invalid_accepted: int = 0
    valid_rejected: int = 0
    refused_cases: int = 0
    groups: int = 0
    refused_groups: int = 0
    compile_seconds: list[float] = field(default_factory=list)
    failures_by_file: Counter = field(default_factory=Counter)
    refusal_reasons: Counter = field(default_factory=Counter)
    invalid_examples: list[str] = field(default_factory=list)

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def to_dict(self) -> dict:
        times = sorted(self.compile_seconds)
        return {
            "total": self.total,
            "passed": self.passed,
            "pass_rate": round(self.pass_rate, 4),
            "invalid_accepted": self.invalid_accepted,
            "valid_rejected": self.valid_rejected,
            "refused_cases": self.refused_cases,
            "groups": self.groups,
            "refused_groups": self.refused_groups,
            "compile_p50_ms": round(1000 * times[len(times) // 2], 2) if times else None,
            "failures_by_file": dict(self.failures_by_file.most_common()),
            "refusal_reasons": dict(self.refusal_reasons.most_common(15)),
            "invalid_examples": self.invalid_examples[:20],
        }

    def format(self) -> str:
        d = self.to_dict()
        lines = [
            f"cases {d['total']} in {d['groups']} groups: passed {d['passed']} "
            f"({100 * d['pass_rate']:.1f}%), invalid accepted {d['invalid_accepted']}, "
            f"valid rejected {d['valid_rejected']}, refused {d['refused_cases']} cases "
            f"({d['refused_groups']} groups); compile p50 {d['compile_p50_ms']} ms",
            "failures by file: " + ", ".join(f"{k} {v}" for k, v in d["failures_by_file"].items()),
            "top refusal reasons:",
        ]
        lines += [f"  {v:4d}  {k}" for k, v in d["refusal_reasons"].items()]
        lines += [f"  INVALID ACCEPTED: {x}" for x in d["invalid_examples"]]
        return "\n".join(lines)


def load_suite(root: Path = DEFAULT_SUITE, draft: str = "draft2020-12") -> list[Group]:
    """The core groups of one draft (files directly in the draft folder; not ``optional/``)."""
    folder = Path(root) / "tests" / draft
    if not folder.is_dir():
        raise FileNotFoundError(f"JSON-Schema-Test-Suite not found at {folder}")
    groups = []
    for path in sorted(folder.glob("*.json")):
        for g in json.loads(path.read_text(encoding="utf-8")):
            cases = tuple(
                Case(path.stem, g["description"], t["description"], t["data"], t["valid"])
                for t in g["tests"]
            )
            groups.append(Group(path.stem, g["description"], g["schema"], cases))
    return groups


def _reason(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}"
    for marker in (" at #", " at position", ": ["):
        text = text.split(marker)[0]
    return text[:90]


def run_suite(
    compile_fn: Callable[[object], Callable[[str], bool]],
    *,
    root: Path = DEFAULT_SUITE,
    draft: str = "draft2020-12",
    serializers: dict | None = None,
) -> Report:
    """Run every core group through ``compile_fn``; see the module docstring for the counting."""
    serializers = SERIALIZERS if serializers is None else serializers
    report = Report()
    for group in load_suite(root, draft):
        report.groups += 1
        report.total += len(group.cases)
        start = time.perf_counter()
        try:
            match = compile_fn(group.schema)
        except Exception as exc:  # any refusal, by any engine, counts the same way
            report.refused_groups += 1
            report.refused_cases += len(group.cases)
            report.failures_by_file[group.file] += len(group.cases)
            report.refusal_reasons[_reason(exc)] += len(group.cases)
            continue
        report.compile_seconds.append(time.perf_counter() - start)
        for case in group.cases:
            _score(report, case, match, serializers)
    return report


def instance_texts(data, serializers: dict) -> list[str]:
    """The texts an instance is offered as: each serializer, and every order of the keys of a
    top-level object of at most 4 keys (JSON object members are unordered)."""
    texts = [s(data) for s in serializers.values()]
    if isinstance(data, dict) and 1 < len(data) <= 4:
        texts += [
            json.dumps(dict(order), ensure_ascii=False)
            for order in itertools.permutations(data.items())
        ]
    return list(dict.fromkeys(texts))


def _score(report: Report, case: Case, match, serializers: dict) -> None:
    texts = instance_texts(case.data, serializers)
    accepted = any(_safe(match, t) for t in texts)
    if accepted == case.valid:
        report.passed += 1
        return
    report.failures_by_file[case.file] += 1
    if accepted:
        report.invalid_accepted += 1
        report.invalid_examples.append(f"{case.file} / {case.group} / {case.description}")
    else:
        report.valid_rejected += 1


def _safe(match, text: str) -> bool:
    try:
        return bool(match(text))
    except Exception:
        return False


def lmprog_compile(schema):
    """lmprog's compiler as a ``compile_fn``."""
    from lmprog.fsm import Constraint

    return Constraint.from_json_schema(schema, strict=False).matches


_TOKENIZER = []


def default_tokenizer():
    """The default model's tokenizer (loaded once)."""
    if not _TOKENIZER:
        from lmprog.core.models import load_tokenizer, resolve_model

        _TOKENIZER.append(load_tokenizer(resolve_model()))
    return _TOKENIZER[0]


def token_walk(index, token_ids) -> bool:
    """Whether a guide of ``index`` accepts the token sequence as decoding would: each token's
    bit set in the position's bitmask (``allowed_bitmask``), then EOS allowed at the end."""
    from lmprog.fsm.mask import allowed_bitmask

    guide, width = index.new_guide(), index.vocab_size
    for t in [*token_ids, index.eos_token_id]:
        words = allowed_bitmask([guide], width)[0]
        if not (int(words[t >> 5]) >> (t & 31)) & 1:
            return False
        if t != index.eos_token_id:
            guide.advance(t)
    return True


def lmprog_token_compile(schema, tokenizer=None):
    """lmprog through the token engine decoding uses (issue 14, item 4): the schema's
    Constraint as it reads a given text (``reading``: objects' members in any order, as a
    prefilled text is read), its TokenIndex over the default model's vocabulary, and each text
    tokenized by the model's tokenizer and walked through the masks (``token_walk``)."""
    from lmprog.fsm import Constraint
    from lmprog.fsm.index import TokenIndex

    tok = tokenizer if tokenizer is not None else default_tokenizer()
    index = TokenIndex.get(Constraint.from_json_schema(schema, strict=False).reading, tok)
    return lambda text: token_walk(index, tok.encode(text, add_special_tokens=False))


def outlines_core_compile(schema):
    """outlines-core's own JSON-schema-to-regex, matched with Python ``re`` (a reference point;
    its regex dialect is close enough to Python's for these patterns)."""
    import re

    from outlines_core.json_schema import build_regex_from_schema

    return re.compile(build_regex_from_schema(json.dumps(schema))).fullmatch


ENGINES = {
    "lmprog": lmprog_compile,
    "lmprog-tokens": lmprog_token_compile,
    "outlines-core": outlines_core_compile,
}

if __name__ == "__main__":
    engine = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--engine=")), "lmprog")
    result = run_suite(ENGINES[engine])
    print(json.dumps(result.to_dict(), indent=1) if "--json" in sys.argv else result.format())
