"""JSON-Schema-Test-Suite (draft 2020-12 core) conformance floor for lmprog's compiler.

Counted per test case by ``bench/conformance.py`` (1,299 cases): a refused schema fails all of
its cases; a compiled one passes a case when it matches iff the instance is valid. The floor may
only go up; invalid instances accepted must stay exactly 0.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PASS_RATE_FLOOR = 0.88  # measured 89.5% (1162/1299, issue 36)


def _conformance():
    spec = importlib.util.spec_from_file_location(
        "lmprog_bench_conformance", ROOT / "bench" / "conformance.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


conformance = _conformance()
pytestmark = pytest.mark.skipif(
    not (conformance.DEFAULT_SUITE / "tests").is_dir(), reason="JSON-Schema-Test-Suite not present"
)


def test_core_suite_floor_and_no_invalid_accepted():
    report = conformance.run_suite(conformance.lmprog_compile)
    summary = report.format()
    assert report.total == 1299, summary
    assert report.invalid_accepted == 0, summary
    assert report.pass_rate >= PASS_RATE_FLOOR, summary


def test_refusals_and_wrong_answers_are_counted():
    """The runner itself: a refusing engine passes nothing, an accept-all engine accepts every
    invalid instance, so the floors above cannot be met by a degenerate engine."""

    def refuse(schema):
        raise ValueError("no")

    refused = conformance.run_suite(refuse)
    assert refused.passed == 0 and refused.refused_cases == 1299 and refused.invalid_accepted == 0
    lenient = conformance.run_suite(lambda schema: lambda text: True)
    assert lenient.invalid_accepted == sum(
        1 for g in conformance.load_suite() for c in g.cases if not c.valid
    )
    assert lenient.valid_rejected == 0
