"""The public API's types, as a user's type checker sees them: mypy --strict accepts a typed
program written against `import lmprog as lp` and rejects wrong uses (skipped without mypy)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
from __future__ import annotations

from collections.abc import Iterator

import lmprog as lp


@lp.function
def qa(s: lp.ProgramState, question: str) -> None:
    s += lp.system("Answer briefly.")
    s += lp.user(question)
    s += lp.assistant(lp.gen("answer", max_tokens=64, stop="\\n", regex=r"[A-Z][a-z]+"))
    s += lp.select("sure", ["yes", "no"], temperature=0.0)
    forks = s.fork(2)
    forks += lambda i: f"Idea {i}: " + lp.gen("idea", max_tokens=8)
    forks[0] += "!"
    first: lp.ProgramState = forks[0]
    forks.join()
    print(first)
    with s.copy() as c:
        c += lp.gen_int("n") + lp.gen_string("name")


@lp.function(num_api_spec_tokens=16)
def other(s: lp.ProgramState) -> None:
    s += lp.gen("x", json_schema={"type": "integer"}, dtype=None)


def use() -> None:
    state: lp.ProgramState = qa.run(question="Capital of France?", temperature=0)
    text: str = state.text()
    messages: list[dict[str, str]] = state.messages()
    pieces: Iterator[str] = state.text_iter("answer")
    piece, meta = next(state.text_iter("answer", return_meta_data=True))
    states: list[lp.ProgramState] = qa.run_batch([{"question": "a"}], temperature=0)
    lazy: Iterator[lp.ProgramState] = qa.run_batch([{"question": "a"}], generator_style=True)
    n: int = state.parsed("n", int)
    error: BaseException | None = state.error()
    copy_text: str = state.fork(1)[0].text()
    verbosity: int = lp.global_config.verbosity
    params = lp.SamplingParams(max_tokens=8, temperature=0.0)
    print(text, messages, pieces, piece + "", meta, states, lazy, n, error, verbosity, params, copy_text)
    print(state["answer"], lp.get_limits(), other)
"""

# (a wrong use, the error mypy gives for it)
WRONG = [
    ('lp.gen("answer", regex=12)', 'Argument "regex" to "gen" has incompatible type "int"'),
    ('x: int = qa.run(question="q").text()', 'expression has type "str", variable has type "int"'),
    (
        'y: str = qa.run(question="q").parsed("n", int)',
        'expression has type "int", variable has type "str"',
    ),
    ('lp.gen("a", max_tokens="64")', 'Argument "max_tokens" to "gen" has incompatible type "str"'),
    (
        'z: list[str] = qa.run_batch([{"question": "a"}], generator_style=True)',
        'variable has type "list[str]"',
    ),
]


def run_mypy(tmp_path: Path, *files: str) -> subprocess.CompletedProcess[str]:
    # MYPYPATH: this checkout's lmprog (not an installed copy); follow-imports=silent: only the
    # user's files are reported, at --strict
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-color-output"]
        + ["--cache-dir", str(tmp_path / ".mypy_cache"), *files],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_mypy_accepts_a_typed_program_and_rejects_wrong_uses(tmp_path):
    (tmp_path / "program.py").write_text(PROGRAM)
    for i, (line, _) in enumerate(WRONG):
        (tmp_path / f"wrong{i}.py").write_text(
            "import lmprog as lp\nfrom program import qa\n\n" + textwrap.dedent(line) + "\n"
        )
    out = run_mypy(tmp_path, "program.py", *(f"wrong{i}.py" for i in range(len(WRONG))))
    report = out.stdout + out.stderr
    assert "program.py:" not in report.replace("wrong", ""), report
    for i, (_, message) in enumerate(WRONG):
        errors = [line for line in report.splitlines() if line.startswith(f"wrong{i}.py:")]
        assert len(errors) == 1 and message in errors[0], (i, report)
