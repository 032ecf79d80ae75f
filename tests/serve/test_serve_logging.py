"""`lmprog serve` logs its start-up steps and one access line per request; one verbosity
switch (--log-level, $LMPROG_LOG_LEVEL) for the `lmprog` logger; progress of long steps."""

import json
import logging
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from lmprog.core import logs

pytest.importorskip("uvicorn")
pytest.importorskip("llama_cpp")


@pytest.fixture
def restore_lmprog_logger():
    logger = logging.getLogger("lmprog")
    level, propagate, handlers = logger.level, logger.propagate, list(logger.handlers)
    yield logger
    logger.setLevel(level)
    logger.propagate = propagate
    logger.handlers[:] = handlers
    logs._handler = None


def _post(url, body):
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.read()


@pytest.fixture(scope="module")
def server():
    import lmprog as lp
    from lmprog.serve.server import Server

    backend = lp.LlamaCpp(n_ctx=1024)
    with Server(backend) as srv:
        yield srv
    backend.shutdown()


def test_access_lines_name_method_path_status_duration_and_tokens(server, caplog):
    caplog.set_level(logging.INFO, logger="lmprog.serve.access")
    body = {"model": server.model_name, "prompt": "Hello", "max_tokens": 5, "temperature": 0}
    _post(server.url + "/v1/completions", body)
    _post(server.url + "/v1/completions", {**body, "stream": True})
    with pytest.raises(urllib.error.HTTPError):
        _post(server.url + "/v1/completions", {"prompt": 3})
    for _ in range(200):  # the line follows the response's last byte
        lines = [r.getMessage() for r in caplog.records if r.name == "lmprog.serve.access"]
        if len(lines) == 3:
            break
        time.sleep(0.01)
    assert len(lines) == 3, lines
    for line in lines[:2]:  # streamed or not, the tokens reach the line
        assert '"POST /v1/completions" 200 ' in line and "completion_tokens=5" in line
        assert "prompt_tokens=0" not in line
    assert '"POST /v1/completions" 400 ' in lines[2] and "completion_tokens=0" in lines[2]
    assert lines[0].split()[4].endswith("s")  # the duration


def test_one_switch_sets_the_lmprog_logger(restore_lmprog_logger, monkeypatch):
    logger = restore_lmprog_logger
    assert logs.configure_logging("DEBUG") == logging.DEBUG and logger.level == logging.DEBUG
    monkeypatch.setenv("LMPROG_LOG_LEVEL", "warning")
    assert logs.configure_logging() == logging.WARNING
    assert len([h for h in logger.handlers if h is logs._handler]) == 1  # no second handler
    with pytest.raises(ValueError, match="debug, info, warning"):
        logs.configure_logging("loud")


def test_the_command_line_refuses_a_bad_level(capsys, monkeypatch):
    from lmprog.serve.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--log-level", "loud"])
    monkeypatch.setenv("LMPROG_LOG_LEVEL", "loud")
    with pytest.raises(SystemExit):
        main(["serve", "--backend", "llamacpp"])
    assert "LMPROG_LOG_LEVEL" in capsys.readouterr().err


def test_progress_is_a_bar_on_a_terminal_and_log_lines_otherwise(
    restore_lmprog_logger, caplog, capsys, monkeypatch
):
    caplog.set_level(logging.INFO, logger="lmprog")
    with logs.progress(4 * 2**20, "dequantizing x.gguf") as bar:
        bar.update(2**20)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "dequantizing x.gguf (4 MiB)..."
    assert messages[1].startswith("dequantizing x.gguf: done (4 MiB in ")
    caplog.clear()
    monkeypatch.setattr(logs, "_interactive", lambda: True)
    with logs.progress(3, "warming up", unit="kernel") as bar:
        bar.update(3)
    assert "warming up" in capsys.readouterr().err  # tqdm's bar
    assert [r.getMessage() for r in caplog.records][0].startswith("warming up: done")


def test_serve_logs_each_start_up_step_then_requests():
    env = {**os.environ, "LMPROG_LOG_LEVEL": "info"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmprog.serve", "--backend", "llamacpp", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "listening on" in line:
                break
        url = lines[-1].split("listening on ")[1].split()[0].rstrip(",")
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1"), lines
        _post(
            url + "/completions",
            {"model": "smollm2-135m-instruct", "prompt": "Hi", "max_tokens": 2},
        )
        lines.append(proc.stderr.readline())
    finally:
        proc.terminate()
        proc.wait(30)
    text = "".join(lines)
    for step in (
        "starting: backend llamacpp (--backend llamacpp)",
        "model smollm2-135m-instruct resolved: ",
        "loading weights with llama.cpp",
        "weights loaded in ",
        "tokenizer FastTokenizer loaded in ",
        "llama.cpp backend ready in ",
        "listening on http://127.0.0.1:",
    ):
        assert step in text, (step, text)
    assert '"POST /v1/completions" 200 ' in lines[-1] and "completion_tokens=2" in lines[-1]


def test_metrics_and_access_lines_on_llamacpp(server, caplog):
    """/v1/responses has its own path label; the access line tells the cached prompt tokens;
    llama.cpp's engine gauges reach /metrics under the runtime's names."""
    caplog.set_level(logging.INFO, logger="lmprog.serve.access")
    body = {"model": server.model_name, "input": "Say hello.", "max_output_tokens": 4}
    for _ in range(2):  # the second prompt is served from the prefix cache
        _post(server.url + "/v1/responses", body)
    with urllib.request.urlopen(server.url + "/metrics", timeout=60) as r:
        metrics = r.read().decode()
    assert 'lmprog_http_requests_total{path="/v1/responses",status="200"} 2.0' in metrics
    for name in (
        "lmprog_prefix_cache_hit_rate",
        "lmprog_kv_cache_usage_ratio",
        "lmprog_engine_gen_tokens_per_second",
        "lmprog_requests_running",
    ):
        assert f"\n{name} " in metrics, name
    lines = [r.getMessage() for r in caplog.records if r.name == "lmprog.serve.access"]
    responses = [line for line in lines if '"POST /v1/responses" 200 ' in line]
    assert len(responses) == 2 and "cached_tokens=0 " not in responses[1], responses
