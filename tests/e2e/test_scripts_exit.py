"""What a newcomer runs first, run as they run it: the README's program (which sets no backend:
the implicit default) and every script in examples/, each as its own Python process, several
times, asserting exit status 0, no traceback or crash on stderr, and output that makes sense
on the bundled model (issue 28, sections 1 and 5).

LMPROG_EXIT_RUNS (default 3) is how many times the README program runs; each example runs a
third of that (at least once: they take 3-30 s each on a 2-core CPU). LMPROG_EXIT_RUNS=20
gives the README program 20 runs in a row, each example 6. The process-exit cases beyond
these (SIGINT mid-generation, a program raising with requests in flight) are in
tests/backends/test_exit.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
pytest.importorskip("llama_cpp", reason="the scripts' default backend on a CPU is llama.cpp")

ROOT = Path(__file__).resolve().parents[2]
RUNS = int(os.environ.get("LMPROG_EXIT_RUNS", "3"))
EXAMPLE_RUNS = max(1, RUNS // 3)
CRASH_MARKS = ("Traceback", "terminate called", "Fatal Python error", "Segmentation fault")


def readme_program() -> str:
    """The README's first Python block (under "## A program"), as a user copies it."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\n", text.index("## A program")) + len("```python\n")
    return text[start : text.index("```", start)]


def _has(*words: str) -> Callable[[str], None]:
    def check(out: str) -> None:
        for word in words:
            assert word in out, f"{word!r} not in the output"

    return check


def _batch(out: str) -> None:
    lines = [line for line in out.splitlines() if "->" in line]
    assert len(lines) == 16
    # each summary keeps the day's weather (a small model may slip on one or two)
    kept = sum(("sunny" in a) == ("sunny" in b) for a, b in (line.split("->") for line in lines))
    assert kept >= 12, lines


def _classification(out: str) -> None:
    rights = [int(n) for n in re.findall(r"\((\d)/4 right\)", out)]
    assert len(rights) == 3 and min(rights) >= 2 and max(rights) >= 3, out


def _multi_turn(out: str) -> None:
    _has("Paris", "Rome", "Madrid")(out)
    cached = [int(n) for n in re.findall(r"turn \d: cached (\d+) prompt tokens", out)]
    assert len(cached) == 3 and cached[1] > 0 and cached[2] > cached[1], out


def _tree(out: str) -> None:
    ideas = re.findall(r"^\d\. (.+)  -> good tip: (yes|no)$", out, re.M)
    assert len(ideas) == 3 and all(len(idea.split()) >= 4 for idea, _ in ideas), out


def _openai_client(out: str) -> None:
    assert "Paris" in out.splitlines()[0]  # the completion
    assert re.search(r"^json schema: \{'name': '[^']+', 'age': \d+\}$", out, re.M), out
    assert re.search(r"^regex: (19|20)\d\d$", out, re.M), out


# (name, the script's path under ROOT or None for the README program, args, check, runs)
SCRIPTS = [
    ("readme", None, (), _has("Paris", "'finish_reason': {'type': 'stop'"), RUNS),
    ("quickstart", "examples/quickstart.py", (), _has(
        "Paris", "select: positive", "int: '8' 8", "streaming: The capital of Japan is Tokyo",
        "Rome", "Madrid", "Berlin", "Cairo", "'age': 36",
    ), EXAMPLE_RUNS),
    ("agent_tools", "examples/agent_tools.py", (), _has(
        'get_weather({"city": "Paris"}) -> 18 C, light rain', 'add({"a": 17, "b": 25}) -> 42',
    ), EXAMPLE_RUNS),
    ("batch", "examples/batch.py", (), _batch, EXAMPLE_RUNS),
    ("classification", "examples/classification.py", (), _classification, EXAMPLE_RUNS),
    ("few_shot_qa", "examples/few_shot_qa.py", (), _has("'Berlin'", "'Madrid'", "'Moscow'"),
     EXAMPLE_RUNS),
    ("json_extraction", "examples/json_extraction.py", (), _has(
        "price=24.99, in_stock=True", "price=12.0, in_stock=False",
        "so far: {'name': 'The Blue Kettle'}\n", "so far: {'name': 'The Blue Kettle', 'price'",
    ), EXAMPLE_RUNS),
    ("multi_turn_chat", "examples/multi_turn_chat.py", (), _multi_turn, EXAMPLE_RUNS),
    ("openai_client", "examples/openai_client.py", (), _openai_client, EXAMPLE_RUNS),
    ("openai_endpoint", "examples/openai_endpoint.py", (), _has(
        "Paris", '"name": "Grace Hopper"', "positive", "1 API call(s)",
    ), EXAMPLE_RUNS),
    ("react_agent", "examples/react_agent.py", (), _has(
        "Observation 1: Paris has about 2.1 million inhabitants.", "answer: ", "2.1 million",
        "14 million",
    ), EXAMPLE_RUNS),
    ("streaming", "examples/streaming.py", (), _has("lighthouse", "robot", "run_async: "),
     EXAMPLE_RUNS),
    ("tree_of_thought", "examples/tree_of_thought.py", (), _tree, EXAMPLE_RUNS),
]  # fmt: skip


def test_every_example_is_covered():
    listed = {path for _, path, *_ in SCRIPTS if path}
    assert listed == {f"examples/{p.name}" for p in (ROOT / "examples").glob("*.py")}


@pytest.mark.parametrize("name,path,args,check,runs", SCRIPTS, ids=[s[0] for s in SCRIPTS])
def test_script_runs_cleanly(tmp_path, name, path, args, check, runs):
    if path is None:
        script = tmp_path / f"{name}.py"
        script.write_text(readme_program())
    else:
        script = ROOT / path
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    for run in range(runs):
        done = subprocess.run(
            [sys.executable, str(script), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        where = f"{name}, run {run + 1} of {runs}"
        crashes = [mark for mark in CRASH_MARKS if mark in done.stderr]
        assert done.returncode == 0 and not crashes, (
            f"{where}: exit status {done.returncode}, {crashes}\n{done.stderr[-3000:]}"
        )
        try:
            check(done.stdout)
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}\n--- stdout:\n{done.stdout[-3000:]}") from None
