"""Real-world JSON schemas with valid and invalid instances, for the constraint benchmarks
(issue 14): `bench_fsm.py --real`.

    from schema_corpus_real import REAL, SOURCES, check_real
    for entry in REAL: entry.name, entry.kind (its source), entry.schema, entry.valid, entry.invalid

The schemas are copies of ones people use, taken from PyPI packages that ship them, under
licences that allow it (`SOURCES`, in schema_corpus_real.json, names each source and its
licence): JSON Schema Store configuration schemas as check-jsonschema vendors them
(SchemaStore's Apache-2.0 ones and the MIT/Apache-2.0 project-provided ones; not Renovate's,
Snapcraft's, GitLab's, CITATION's or Azure Pipelines'), Kubernetes 1.37 API schemas as
kubernetes-validate ships them (each resource's `_definitions.json` references inlined under
`$defs`), AWS CloudFormation resource schemas from cfn-lint, JupyterLab's settings schemas,
`model_json_schema()` of openai-python's response types (pydantic) and the JSON Schema
metaschemas that jsonschema-specifications bundles.

The instances were made for this set, not taken from the projects: valid ones from
hypothesis-jsonschema's generator, from random walks through llguidance's own grammar of the
schema (an engine other than lmprog's) and from the schemas' `examples`/`default`, and with
optional keys dropped; invalid ones by mutating valid ones (a key dropped or added, a value's
type changed, a string or number moved out of its range, an item duplicated or added). Each
was kept only where jsonschema judged it the same way with Python's `re` and with ECMA-262
patterns (formats asserted, `schema_corpus.format_checker`), it is finite JSON of under 1,500
characters, and the default model's tokenizer gives its text back; object keys are in the
schema's property order. Up to three of each per schema; schemas with none of either kind
were left out. Run as a script to check the set and print its size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schema_corpus import Entry, format_checker, summary

_DATA = json.loads((Path(__file__).resolve().parent / "schema_corpus_real.json").read_text())
SOURCES: dict[str, str] = _DATA["sources"]
REAL: list[Entry] = [
    Entry(e["name"], e["source"], e["schema"], tuple(e["valid"]), tuple(e["invalid"]))
    for e in _DATA["entries"]
]


def validator(schema: Any) -> Any:
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=format_checker())


def check_real(entries: list[Entry] = REAL) -> None:
    """AssertionError unless every valid instance validates and every invalid one does not
    (jsonschema, the schema's own draft, formats asserted) and names are unique."""
    names = [e.name for e in entries]
    assert len(names) == len(set(names)), "duplicate names"
    for e in entries:
        assert e.valid and e.invalid and e.kind in SOURCES, e.name
        v = validator(e.schema)
        for x in e.valid:
            assert v.is_valid(x), f"{e.name}: valid instance rejected: {json.dumps(x)[:80]}"
        for x in e.invalid:
            assert not v.is_valid(x), f"{e.name}: invalid instance accepted: {json.dumps(x)[:80]}"


if __name__ == "__main__":
    check_real()
    print(summary(REAL))
