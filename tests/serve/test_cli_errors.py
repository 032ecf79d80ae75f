"""`lmprog` on the command line: `--version`, `python -m lmprog`, and what keeps `lmprog serve`
from starting (a model that does not resolve or load, a busy port, a bad limit) told in one
line on stderr with a nonzero exit status, never a traceback (issue 28, section 5)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import lmprog


def lmprog_cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lmprog", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_error(result: subprocess.CompletedProcess, match: str) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("lmprog serve:")]
    assert len(errors) == 1 and match in errors[0], result.stderr


def test_version_and_python_dash_m():
    result = lmprog_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"lmprog {lmprog.__version__}"
    result = lmprog_cli()  # no command: the usage, as `lmprog` alone prints it
    assert result.returncode == 2 and "usage: lmprog" in result.stderr


def test_the_version_is_pyproject_s():
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert re.search(r'^version = "(.+)"$', pyproject, re.M).group(1) == lmprog.__version__


def test_a_model_that_does_not_resolve_is_one_line(tmp_path):
    result = lmprog_cli("serve", "--model", "nosuch-model", "--port", "0")
    assert_one_line_error(result, "unknown model 'nosuch-model'")
    hub = {"HF_HUB_CACHE": str(tmp_path / "hub")}
    result = lmprog_cli("serve", "--model", "org/name", "--port", "0", env=hub)
    assert_one_line_error(result, "'org/name' is not a bundled model name")


def test_a_file_that_is_not_a_gguf_is_one_line(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a gguf")
    for backend in ("llamacpp", "runtime"):
        if backend == "llamacpp":
            pytest.importorskip("llama_cpp")
        result = lmprog_cli("serve", "--backend", backend, "--model", str(junk), "--port", "0")
        assert_one_line_error(result, "junk.gguf is not a GGUF file")


def test_a_busy_port_is_one_line_before_the_model_loads():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = lmprog_cli("serve", "--port", str(port), "--log-level", "info")
    assert_one_line_error(result, f"cannot listen on 127.0.0.1:{port}: the port is in use")
    assert "loading weights" not in result.stderr  # checked before the model loads


def test_a_bad_limit_is_a_usage_error():
    result = lmprog_cli("serve", "--max-tokens", "100", "--default-max-tokens", "200")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "default_max_tokens 200 is over the max_tokens limit 100" in result.stderr
