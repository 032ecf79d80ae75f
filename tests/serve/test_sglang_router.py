"""The real SGLang router (PyPI `sglang-router`) in front of three `lmprog serve` workers
(llama.cpp, the default model) on loopback: OpenAI chat, native /generate and streams through
it, and every call it makes to a worker answered (issue 35, section 1); vLLM's router
(`vllm-router`) in front of the same workers."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

import pytest

from lmprog.serve.processes import Fleet, SGLangRouter, get_json, sglang_router_available

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not sglang_router_available(), reason="sglang_router is not installed"),
]

MODEL = "smollm2-135m-instruct"


WORKER_ARGS = ["--num-threads", "1", "--max-running-requests", "4"]


@pytest.fixture(scope="module")
def fleet():
    with Fleet.start(*[WORKER_ARGS] * 3) as f:
        yield f


@pytest.fixture(scope="module")
def router(fleet):
    with SGLangRouter.start(fleet.urls) as r:  # cache_aware, the router's default policy
        yield r


def _post(url: str, body: Any, timeout: float = 120) -> tuple[int, str]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _events(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_openai_chat_through_the_router(router):
    import openai

    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        temperature=0,
    )
    assert out.model == MODEL and out.choices[0].message.content
    assert out.usage.completion_tokens <= 8
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count to three."}],
            max_tokens=6,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_native_generate_through_the_router(router):
    """The router adds "model": null and its flags to /generate (a 400 before)."""
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 6}}
    status, text = _post(
        router.url + "/generate",
        {**body, "sampling_params": {"max_new_tokens": 6, "temperature": 0}},
    )
    assert status == 200, text
    out = json.loads(text)
    assert out["text"] and len(out["output_ids"]) == out["meta_info"]["completion_tokens"] <= 6
    assert out["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    # the client's own model field: checked like the OpenAI routes'
    assert _post(router.url + "/generate", {**body, "model": MODEL})[0] == 200
    status, text = _post(router.url + "/generate", {**body, "model": "other-model"})
    assert status == 404 and "other-model" in text


def test_streamed_generate_through_the_router(router):
    status, text = _post(
        router.url + "/generate",
        {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 5}, "stream": True},
    )
    assert status == 200, text
    events = _events(text)
    assert events[-1] == "[DONE]" and len(events) >= 3
    counts = [e["meta_info"]["completion_tokens"] for e in events[:-1]]
    assert counts == sorted(counts) and counts[-1] <= 5
    assert events[-2]["meta_info"]["finish_reason"] is not None
    assert events[-2]["text"].startswith(events[0]["text"])


def test_router_metadata_calls(router, fleet):
    """What the router answers from its workers: loads, cache flush, models, worker list."""
    loads = get_json(router.url + "/get_loads")["workers"]
    assert sorted(w["worker"] for w in loads) == sorted(fleet.urls)
    assert all(w["load"] >= 0 for w in loads), loads  # -1: a worker's /get_load failed
    status, text = _post(router.url + "/flush_cache", {})
    assert status == 200 and json.loads(text)["workers_flushed"] == 3, text
    assert [m["id"] for m in get_json(router.url + "/v1/models")["data"]] == [MODEL]
    workers = router.workers()
    assert len(workers) == 3 and all(w["is_healthy"] for w in workers), workers
    assert all(w["model_id"] == MODEL for w in workers)


def test_round_robin_spreads_over_every_worker(fleet):
    with SGLangRouter.start(fleet.urls, policy="round_robin") as rr:
        before = [_count(w.lines, "POST /generate") for w in fleet.workers]
        for i in range(6):
            body = {"text": f"Item {i}:", "sampling_params": {"max_new_tokens": 2}}
            assert _post(rr.url + "/generate", body)[0] == 200
        expected = [b + 2 for b in before]
        _eventually(lambda: [_count(w.lines, "POST /generate") for w in fleet.workers] == expected)


def test_every_worker_call_of_the_router_is_answered(router, fleet):
    """Each worker's access log: no 4xx/5xx to the router but the gRPC probe ("PRI *", an
    HTTP/2 preface), and no request field dropped as unknown."""
    test_router_metadata_calls(router, fleet)  # make sure the admin calls happened
    paths = ("/health", "/server_info", "/model_info", "/get_load", "/flush_cache")
    for worker in fleet.workers:  # the access lines are read from the workers' stderr
        _eventually(lambda w=worker: all(f' {p}" 200 ' in "".join(w.lines) for p in paths))
    for worker in fleet.workers:
        lines = list(worker.lines)
        assert not [line for line in lines if "ignored the unknown request field" in line]
        refused = [
            line
            for line in lines
            if (m := re.search(r'"(\S+) (\S+)" (\d{3}) ', line))
            and int(m.group(3)) >= 400
            and m.group(1) != "PRI"
        ]
        # the one 404 asked for: /generate naming another model
        assert all('"POST /generate" 404 ' in line for line in refused), refused


@pytest.mark.skipif(not sglang_router_available("vllm_router"), reason="vllm_router is absent")
def test_vllm_router_fronts_the_same_workers(fleet):
    """vLLM's router (PyPI vllm-router, a fork of SGLang's) in front of the same workers."""
    with SGLangRouter.start(
        fleet.urls, policy="round_robin", module="vllm_router.launch_router"
    ) as vr:
        before = [_count(w.lines, "POST /generate") for w in fleet.workers]
        for i in range(3):
            body = {"text": f"Entry {i}:", "sampling_params": {"max_new_tokens": 2}}
            status, text = _post(vr.url + "/generate", body)
            assert status == 200 and json.loads(text)["meta_info"]["completion_tokens"] <= 2
        _eventually(
            lambda: (
                [_count(w.lines, "POST /generate") for w in fleet.workers]
                == [b + 1 for b in before]
            )
        )
        status, text = _post(
            vr.url + "/generate",
            {"text": "Once", "sampling_params": {"max_new_tokens": 3}, "stream": True},
        )
        assert status == 200 and _events(text)[-1] == "[DONE]", text
        chat = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
        }
        status, text = _post(vr.url + "/v1/chat/completions", chat)
        assert status == 200 and json.loads(text)["choices"][0]["message"]["content"], text


def test_the_router_skips_a_dead_worker_and_takes_it_back_restarted(fleet):
    """Faults in front of lmprog (issue 35, section 3): with a worker killed, every request
    through the router still succeeds (it retries elsewhere) and its health check marks the
    worker unhealthy; restarted on its port, the worker is healthy and served again. On the
    module's workers (starting two more of its own took most of this test's time); the
    stopped one is restarted on its port, so the fleet is whole again afterwards."""
    from urllib.parse import urlsplit

    from lmprog.serve.processes import Worker

    port = urlsplit(fleet.urls[1]).port
    flags = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1"]
    flags += ["--health-success-threshold", "1"]
    with SGLangRouter.start(fleet.urls, policy="round_robin", extra=flags) as rr:
        fleet.workers[1].stop()
        for i in range(4):
            body = {"text": f"Dead {i}:", "sampling_params": {"max_new_tokens": 2}}
            assert _post(rr.url + "/generate", body)[0] == 200
        healthy = lambda: {w["url"]: w["is_healthy"] for w in rr.workers()}
        _eventually(lambda: healthy()[fleet.urls[1]] is False)
        fleet.workers[1] = Worker.start([*WORKER_ARGS, "--port", str(port)])
        _eventually(lambda: healthy()[fleet.urls[1]] is True, timeout=30)
        before = _count(fleet.workers[1].lines, "POST /generate")
        for i in range(4):
            body = {"text": f"Back {i}:", "sampling_params": {"max_new_tokens": 2}}
            assert _post(rr.url + "/generate", body)[0] == 200
        _eventually(lambda: _count(fleet.workers[1].lines, "POST /generate") > before)


def _count(lines: list[str], what: str) -> int:
    return sum(1 for line in lines if f'"{what}" 200 ' in line)


def _eventually(cond, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
