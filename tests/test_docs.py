"""The generated language reference matches the docstrings; the README's commands exist."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_reference_is_generated_from_current_docstrings():
    result = subprocess.run(
        [sys.executable, "docs/gen_reference.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_readme_commands_point_at_real_files():
    readme = (ROOT / "README.md").read_text()
    for path in ("scripts/setup.sh", "scripts/test.sh", "examples/quickstart.py"):
        assert path in readme and (ROOT / path).is_file()
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
