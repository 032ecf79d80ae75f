"""The dependency direction of docs/architecture.md, checked by walking every import in lmprog/.

    serve       -> backends, fsm, core (the HTTP layer over any Backend)
    backends    -> decoding, fsm, core; runtime only from backends/runtime.py (lazily)
    lang        -> core (+ fsm for Constraint objects)
    interpreter -> lang, core
    runtime     -> decoding, core, fsm
    decoding    -> core, fsm (shared by the runtime and the llama.cpp backend)
    fsm         -> core
    core        -> nothing else from lmprog

Imports inside functions count too (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "lmprog"

# package -> lmprog subpackages it must not import
FORBIDDEN = {
    "core": {"lang", "interpreter", "backends", "runtime", "decoding", "fsm", "serve"},
    "lang": {"interpreter", "backends", "runtime", "decoding", "serve"},
    "interpreter": {"backends", "runtime", "decoding", "serve"},
    "runtime": {"lang", "interpreter", "backends", "serve"},
    "decoding": {"lang", "interpreter", "backends", "runtime", "serve"},
    "fsm": {"lang", "interpreter", "backends", "runtime", "decoding", "serve"},
    "backends": {"serve"},
    "serve": {"lang", "interpreter", "runtime", "decoding"},
}
# Inside backends only the runtime backend reaches the runtime: the llama.cpp backend shares
# the decoding package with it, not the runtime itself.
RUNTIME_IMPORTERS = {"lmprog/backends/runtime.py"}


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules a file imports (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def violations(subpackage: str) -> list[str]:
    found = []
    for path in sorted((ROOT / subpackage).rglob("*.py")):
        where = path.relative_to(ROOT.parent).as_posix()
        forbidden = FORBIDDEN[subpackage]
        if subpackage == "backends" and where not in RUNTIME_IMPORTERS:
            forbidden = forbidden | {"runtime"}
        for name in imported_modules(path):
            parts = name.split(".")
            if parts[0] == "lmprog" and len(parts) > 1 and parts[1] in forbidden:
                found.append(f"{where} imports {name}")
    return found


@pytest.mark.parametrize("subpackage", sorted(FORBIDDEN))
def test_dependency_direction(subpackage):
    if not (ROOT / subpackage).is_dir():
        pytest.skip(f"there is no lmprog/{subpackage} package")
    assert violations(subpackage) == []


def test_the_checker_sees_relative_and_lazy_imports(tmp_path, monkeypatch):
    fake = tmp_path / "lmprog"
    (fake / "lang").mkdir(parents=True)
    (fake / "lang" / "bad.py").write_text(
        "def f():\n    from ..interpreter import state\n    import lmprog.runtime.engine\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    found = violations("lang")
    assert any("lmprog.interpreter" in v for v in found) and any(
        "lmprog.runtime.engine" in v for v in found
    )


def test_only_the_runtime_backend_imports_the_runtime(tmp_path, monkeypatch):
    fake = tmp_path / "lmprog"
    (fake / "backends").mkdir(parents=True)
    (fake / "backends" / "llamacpp.py").write_text(
        "from lmprog.runtime.batch_sampler import BatchSampler\n"
    )
    (fake / "backends" / "runtime.py").write_text(
        "def f():\n    from lmprog.runtime.engine import Engine\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    assert sorted(violations("backends")) == [
        "lmprog/backends/llamacpp.py imports lmprog.runtime.batch_sampler",
        "lmprog/backends/llamacpp.py imports lmprog.runtime.batch_sampler.BatchSampler",
    ]
