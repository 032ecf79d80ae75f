"""`import lmprog` stays light: the DSL and the interpreter load no model stack (issue 30 §4).

Backends, the runtime and the constraint engine are imported on first use (`lp.Runtime`,
`lp.LlamaCpp`, a constrained gen), so a program can be written, traced and imported without
torch, transformers, llama.cpp or triton installed or paid for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "llama_cpp", "triton")


@pytest.mark.parametrize("module", ["lmprog", "lmprog.lang", "lmprog.interpreter"])
def test_import_loads_no_model_stack(module):
    code = (
        f"import sys, {module}\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"import {module} loaded {out.stdout.strip()}"
