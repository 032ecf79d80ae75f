"""The generated language reference and module map match the docstrings; the README's
commands exist."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("generator", ["docs/gen_reference.py", "docs/gen_architecture.py"])
def test_generated_docs_match_the_current_docstrings(generator):
    """docs/reference.md (the public API) and docs/architecture.md's module map."""
    result = subprocess.run(
        [sys.executable, generator, "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_readme_commands_point_at_real_files():
    readme = (ROOT / "README.md").read_text()
    for path in ("scripts/setup.sh", "scripts/test.sh", "examples/quickstart.py"):
        assert path in readme and (ROOT / path).is_file()
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_without_bash_installs_from_the_checkout_s_root():
    """The README's pip section runs where its other commands run (the checkout's root): each
    `pip install "PATH[extras]"` names a folder with pyproject.toml and extras it declares, and
    each `python FILE` exists (issue 28: "./lmprog[llamacpp]" failed there)."""
    import re

    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Without bash") :]
    block = section[
        section.index("```bash\n") : section.index("```\n", section.index("```bash\n") + 8)
    ]
    pyproject = (ROOT / "pyproject.toml").read_text()
    installs = re.findall(r'pip install "([^"\[]+)\[([^\]]+)\]"', block)
    assert installs, block
    for path, extras in installs:
        assert (ROOT / path / "pyproject.toml").is_file(), path
        for extra in extras.split(","):
            assert re.search(rf"^{extra} = \[", pyproject, re.M), extra
    scripts = re.findall(r"^python (\S+\.py)", block, re.M)
    assert scripts and all((ROOT / s).is_file() for s in scripts), scripts


def test_design_notes_links_resolve():
    """Every `docs/design/X.md` a docstring or comment names exists, and every relative link
    of the design notes points at a real file."""
    import re

    named = set()
    for path in (ROOT / "lmprog").rglob("*.py"):
        named |= set(re.findall(r"docs/design/[\w-]+\.md", path.read_text()))
    assert named, "the code links no design note"
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, missing
    for note in (ROOT / "docs" / "design").glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", note.read_text()):
            assert (note.parent / target).exists(), f"{note.name}: {target}"


def test_backend_examples_run():
    """getting_started.md's examples of lp.LlamaCpp and lp.Runtime options run as written."""
    import re

    import pytest

    pytest.importorskip("llama_cpp", reason="the llama.cpp backend is not installed")
    pytest.importorskip("torch", reason="the runtime needs torch")
    text = (ROOT / "docs" / "getting_started.md").read_text()
    section = text[text.index("### Backend options by example") : text.index("## Programs")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    local = "".join(b for b in blocks if "lp.OpenAI(" not in b)  # the rest needs a server
    assert "lp.LlamaCpp(" in local and "lp.Runtime(" in local
    result = subprocess.run(
        [sys.executable, "-c", local], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout.splitlines()) == 2, result.stdout  # one answer, then a list
