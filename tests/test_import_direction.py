"""The dependency direction of docs/architecture.md, checked by walking every import in lmprog/.

    serve       -> backends, fsm, core (the HTTP layer over any Backend); inside it
                   schemas/ <- tools/ <- the root's plumbing <- openai/, anthropic/, sglang/
                   <- app <- server <- cli (test_serve_layers)
    backends    -> decoding, fsm, core; runtime only from backends/runtime.py (lazily)
    lang        -> core (+ fsm for Constraint objects)
    interpreter -> lang, core
    runtime     -> decoding, core, fsm
    decoding    -> core, fsm (shared by the runtime and the llama.cpp backend)
    fsm         -> core
    core        -> nothing else from lmprog

Imports inside functions count too (a lazy import is still a dependency), and no two modules
may import each other, directly or around a longer loop (test_no_import_cycles).
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
# the decoding package with it, not the runtime itself (runtime_config.py: lp.Runtime's options;
# gguf_lora.py: a PEFT folder for llama.cpp is read and checked by the runtime's adapter reader,
# imported when one is converted, so the llama.cpp backend still loads without torch).
RUNTIME_IMPORTERS = {
    "lmprog/backends/runtime.py",
    "lmprog/backends/runtime_config.py",
    "lmprog/backends/gguf_lora.py",
}
# Layers inside a package: folder under lmprog/ -> lmprog modules it must not import (a lower
# layer never reaches up into the one built on it).
# JSON Schema compiles in stages: read (document -> terms), terms (the algebra), emit (terms ->
# grammar); read and emit both stand on terms and never on each other.
INNER_FORBIDDEN = {
    "fsm/regex": {"lmprog.fsm.json_schema"},
    "fsm/json_schema/terms": {"lmprog.fsm.json_schema.read", "lmprog.fsm.json_schema.emit"},
    "fsm/json_schema/read": {"lmprog.fsm.json_schema.emit"},
    "fsm/json_schema/emit": {"lmprog.fsm.json_schema.read"},
    # Inside the runtime: the bookkeeping (scheduler, cache) knows nothing of the executor or
    # the engine; the executor runs a scheduled batch and knows nothing of the engine that
    # drives it; data parallelism sits above engines.
    **{
        f"runtime/{part}": {f"lmprog.runtime.{above}" for above in above_it}
        for part, above_it in {
            "cache": ("scheduler", "engine", "executor", "speculative", "data_parallel"),
            "scheduler": ("engine", "executor", "speculative", "data_parallel"),
            "executor": ("engine", "speculative", "data_parallel"),
            "speculative": ("engine", "data_parallel"),
            "engine": ("data_parallel",),
        }.items()
    },
}


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


def inner_violations(folder: str) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        where = path.relative_to(ROOT.parent).as_posix()
        for name in imported_modules(path):
            if any((name + ".").startswith(f + ".") for f in INNER_FORBIDDEN[folder]):
                found.append(f"{where} imports {name}")
    return found


@pytest.mark.parametrize("folder", sorted(INNER_FORBIDDEN))
def test_inner_layers(folder):
    assert (ROOT / folder).is_dir()
    assert inner_violations(folder) == []


def test_the_inner_checker_sees_a_lazy_import_up(tmp_path, monkeypatch):
    fake = tmp_path / "lmprog"
    (fake / "fsm" / "regex").mkdir(parents=True)
    (fake / "fsm" / "regex" / "dfa.py").write_text(
        "def f():\n    from ..json_schema.automata import to_regex\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    assert "lmprog/fsm/regex/dfa.py imports lmprog.fsm.json_schema.automata" in inner_violations(
        "fsm/regex"
    )


# Inside serve: the request bodies (schemas/) know nothing else of the server; tool calls
# (tools/) know only the bodies and the errors; the shared plumbing and a request's parts (the
# root's modules) know no API surface; the surfaces (openai/, anthropic/, sglang/) know each
# other only where one is a shape over another (Anthropic's messages over the chat
# completions); only the app routes to the surfaces, and only the server and the CLI start it.
SERVE_SURFACES = {"openai", "anthropic", "sglang"}
SERVE_TOP = {"app", "server", "cli", "__main__"}
SERVE_ONLY = {"schemas": {"schemas"}, "tools": {"tools", "schemas", "errors"}}
SERVE_FORBIDDEN = {
    "openai": {"anthropic", "sglang"} | SERVE_TOP,
    "anthropic": {"sglang"} | SERVE_TOP,
    "sglang": {"openai", "anthropic"} | SERVE_TOP,
    "app": {"server", "cli", "__main__"},
    "server": {"cli", "__main__"},
    "cli": {"__main__"},
    "__main__": set(),
    "__init__": SERVE_SURFACES | {"app", "cli", "__main__"},  # Server and ServerLimits
}


def serve_layer_violations(root: Path) -> list[str]:
    found = []
    for path in sorted((root / "serve").rglob("*.py")):
        part = path.relative_to(root / "serve").parts[0].removesuffix(".py")
        for name in imported_modules(path):
            parts = name.split(".")
            if parts[:2] != ["lmprog", "serve"] or len(parts) < 3 or parts[2] == part:
                continue
            if part in SERVE_ONLY:
                bad = parts[2] not in SERVE_ONLY[part]
            else:
                bad = parts[2] in SERVE_FORBIDDEN.get(part, SERVE_SURFACES | SERVE_TOP)
            if bad:
                found.append(f"{path.relative_to(root.parent).as_posix()} imports {name}")
    return sorted(found)


def test_serve_layers():
    assert serve_layer_violations(ROOT) == []


def test_serve_layers_seen(tmp_path, monkeypatch):
    fake = tmp_path / "lmprog"
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    (fake / "serve" / "tools").mkdir(parents=True)
    (fake / "serve" / "respond.py").write_text("def f():\n    from .openai import completions\n")
    (fake / "serve" / "tools" / "plan.py").write_text("from ..context import ServeContext\n")
    (fake / "serve" / "app.py").write_text("from .openai.completions import create_completion\n")
    assert serve_layer_violations(fake) == [
        "lmprog/serve/respond.py imports lmprog.serve.openai",
        "lmprog/serve/respond.py imports lmprog.serve.openai.completions",
        "lmprog/serve/tools/plan.py imports lmprog.serve.context",
        "lmprog/serve/tools/plan.py imports lmprog.serve.context.ServeContext",
    ]


def test_the_checker_sees_relative_and_lazy_imports(tmp_path, monkeypatch):
    fake = tmp_path / "lmprog"
    (fake / "lang").mkdir(parents=True)
    (fake / "lang" / "bad.py").write_text(
        "def f():\n    from ..interpreter import state\n    import lmprog.runtime.engine.engine\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    found = violations("lang")
    assert any("lmprog.interpreter" in v for v in found) and any(
        "lmprog.runtime.engine.engine" in v for v in found
    )


def test_only_the_runtime_backend_imports_the_runtime(tmp_path, monkeypatch):
    fake = tmp_path / "lmprog"
    (fake / "backends").mkdir(parents=True)
    (fake / "backends" / "llamacpp.py").write_text(
        "from lmprog.runtime.batch_sampler import BatchSampler\n"
    )
    (fake / "backends" / "runtime.py").write_text(
        "def f():\n    from lmprog.runtime.engine.engine import Engine\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    assert sorted(violations("backends")) == [
        "lmprog/backends/llamacpp.py imports lmprog.runtime.batch_sampler",
        "lmprog/backends/llamacpp.py imports lmprog.runtime.batch_sampler.BatchSampler",
    ]


def module_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the lmprog modules it imports; a package's __init__ re-exports are not edges."""
    paths = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        paths[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in paths.items():
        deps = set()
        for imported in imported_modules(path):
            while imported and imported not in paths:
                imported = imported.rpartition(".")[0]
            if imported and not (name + ".").startswith(imported + "."):
                if paths[imported].name != "__init__.py":
                    deps.add(imported)
        graph[name] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycles():
    assert import_cycles(module_graph(ROOT)) == []


def test_the_cycle_finder_sees_a_loop_through_a_lazy_import(tmp_path, monkeypatch):
    fake = tmp_path / "lmprog"
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    (fake / "a").mkdir(parents=True)
    (fake / "a" / "__init__.py").write_text("from .x import X\n")
    (fake / "a" / "x.py").write_text("from .y import Y\nX = 1\n")
    (fake / "a" / "y.py").write_text("def f():\n    from .z import Z\nY = 2\n")
    (fake / "a" / "z.py").write_text("from lmprog.a.x import X\nZ = 3\n")
    (fake / "a" / "w.py").write_text("from lmprog.a import X\n")
    assert import_cycles(module_graph(fake)) == [["lmprog.a.x", "lmprog.a.y", "lmprog.a.z"]]
