"""Slow steps say what they do at the default verbosity (issue 28, section 4): one line on
stderr once a step has run a second, and one as it ends; nothing for a fast step, nothing at
warning; info lines at info. A first run (empty cache) says it builds the tokenizer."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from lmprog.core import logs


@pytest.fixture
def lmprog_logger():
    """The `lmprog` logger as nobody configured it (the default), restored afterwards."""
    logger = logging.getLogger("lmprog")
    level, propagate, handlers = logger.level, logger.propagate, list(logger.handlers)
    logger.setLevel(logging.NOTSET)
    logger.handlers[:] = []
    logger.propagate = True
    yield logger
    logger.setLevel(level)
    logger.propagate = propagate
    logger.handlers[:] = handlers


def test_a_fast_step_says_nothing_by_default(lmprog_logger, capsys):
    with logs.slow_step("building x (once)"):
        pass
    with logs.progress(2**20, "dequantizing y") as bar:
        bar.update(2**20)
    assert capsys.readouterr().err == ""


def test_a_slow_step_says_what_it_does_by_default(lmprog_logger, capsys, monkeypatch):
    monkeypatch.setattr(logs, "SLOW_S", 0.02)
    with logs.slow_step("building x (once)", logger="lmprog.core.models"):
        time.sleep(0.3)
    with logs.progress(4 * 2**20, "dequantizing y.gguf", logger="lmprog.runtime") as bar:
        time.sleep(0.3)
        bar.update(4 * 2**20)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "lmprog: building x (once)..."
    assert lines[1].startswith("lmprog: building x (once): done (0.")
    assert lines[2] == "lmprog: dequantizing y.gguf (4 MiB)..."
    assert lines[3].startswith("lmprog: dequantizing y.gguf: done (4 MiB in 0.")


def test_a_level_set_to_warning_silences_slow_steps(lmprog_logger, capsys, monkeypatch):
    monkeypatch.setattr(logs, "SLOW_S", 0.01)
    lmprog_logger.setLevel(logging.WARNING)
    with logs.slow_step("building x"):
        time.sleep(0.1)
    assert capsys.readouterr().err == ""


def test_info_logs_the_start_and_the_end(lmprog_logger, caplog):
    caplog.set_level(logging.INFO, logger="lmprog")
    with logs.slow_step("building x"):
        pass
    assert [r.getMessage() for r in caplog.records][0] == "building x..."
    assert [r.getMessage() for r in caplog.records][1].startswith("building x: done (")


@pytest.mark.skipif(
    not __import__("importlib").util.find_spec("llama_cpp"), reason="needs llama-cpp-python"
)
def test_a_first_run_says_it_builds_the_tokenizer(tmp_path):
    """An empty cache: lp.LlamaCpp() builds the tokenizer with transformers (seconds) and says
    so on stderr with no log level set; the next run, warm, says nothing."""
    env = {k: v for k, v in os.environ.items() if k != logs.ENV_VAR}
    env["LMPROG_CACHE_DIR"] = str(tmp_path)
    code = "import lmprog as lp; lp.LlamaCpp(n_ctx=256).shutdown()"
    cold, warm = (
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        for _ in range(2)
    )
    assert cold.returncode == 0 and warm.returncode == 0, cold.stderr + warm.stderr
    said = [line for line in cold.stderr.splitlines() if line.startswith("lmprog: ")]
    assert said[0].startswith("lmprog: building the tokenizer of SmolLM2"), cold.stderr
    assert said[1].startswith("lmprog: building the tokenizer of SmolLM2") and "done (" in said[1]
    assert "lmprog: " not in warm.stderr
