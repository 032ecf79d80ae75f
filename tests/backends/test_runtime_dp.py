"""lp.Runtime(dp_size=2) on the CPU: two engine replicas over one tiny random Llama (the
default model's tokenizer), sharing its weights. Fork children and run_batch items land on
the replica that cached their prefix, unrelated requests are spread, outputs equal dp_size=1,
and a replica whose engine thread dies takes only its own requests."""

from __future__ import annotations

import argparse
import time

import pytest
from dp_testing import UNRELATED, delta, fork_lands_on_one_replica, routed
from hf_tiny import default_hf_tokenizer, save_tiny_llama

import lmprog as lp
from lmprog.core.errors import BackendError, ContextLengthError
from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams as SP

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)

PREFIX = "You are a careful assistant. Answer each question in a few words, then stop. " * 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random-weights Llama saved as transformers saves one, with the default model's
    tokenizer (as in tests/core/test_hf_cache.py)."""
    return str(save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), default_hf_tokenizer()))


def runtime(tiny, dp_size=2, **kw):
    return lp.Runtime(tiny, device="cpu", max_total_tokens=2048, dp_size=dp_size, **kw)


@pytest.fixture(scope="module")
def rt(tiny):
    backend = runtime(tiny, check_integrity=True)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def single(tiny):
    backend = runtime(tiny, dp_size=1, check_integrity=True)
    yield backend
    backend.shutdown()


def test_replicas_share_the_weights_and_have_their_own_caches(rt):
    group = rt.engine
    a, b = group.replicas
    assert a is not b and a.runner.model is b.runner.model
    assert a.runner.kv is not b.runner.kv
    stats = rt.stats()
    assert stats["dp_size"] == 2 and stats["replicas_alive"] == 2
    assert stats["kv_capacity"] == 2 * 2048 and stats["device"] == "cpu"
    assert [r["device"] for r in stats["replicas"]] == ["cpu", "cpu"]


def test_fork_children_land_on_the_replica_that_cached_their_prefix(rt):
    rt.flush_cache()
    home = fork_lands_on_one_replica(rt, PREFIX)
    replica = rt.stats()["replicas"][home]
    assert replica["cached_tokens"] >= 4 * len(rt.tokenizer.encode(PREFIX)) - 8


def test_run_batch_items_land_together_and_unrelated_prompts_are_spread(rt):
    @lp.function
    def qa(s, q):
        s += PREFIX + " Q: " + q + " A:"
        s += lp.gen("a", max_tokens=2, temperature=0)

    before = routed(rt)
    states = qa.run_batch([{"q": q} for q in UNRELATED], backend=rt, num_threads=3)
    assert all(st.error() is None for st in states)
    moved = delta(before, routed(rt))
    assert sorted(sum(m.values()) for m in moved) == [0, 1 + len(UNRELATED)]  # prefix + items
    before = routed(rt)
    out = rt.generate(UNRELATED, {"max_tokens": 2, "temperature": 0})
    assert len(out) == len(UNRELATED)
    counts = [sum(m.values()) for m in delta(before, routed(rt))]
    assert counts == [3, 3]  # submitted together: the least-loaded replica each time


def test_outputs_equal_one_replica(rt, single):
    params = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    prompts = [PREFIX + q for q in UNRELATED[:4]] + UNRELATED[:2]
    assert [r.token_ids for r in rt.generate(prompts, params)] == [
        r.token_ids for r in single.generate(prompts, params)
    ]

    @lp.function
    def pick(s):
        s += PREFIX + " The best colour is"
        s += lp.select("c", [" red", " green", " blue"])

    assert pick.run(backend=rt)["c"] == pick.run(backend=single)["c"]
    assert rt.flush_cache()
    assert all(r["tree_tokens"] == 0 for r in rt.stats()["replicas"])


def test_stream_abort_token_usage_and_bad_input_through_the_front_door(rt):
    rt.token_usage.reset()
    pieces = []
    request = GenerateRequest(UNRELATED[0], SP(max_tokens=6, temperature=0, ignore_eos=True))
    result = rt.generate(request, stream=pieces.append)
    assert "".join(pieces) == result.text and result.completion_tokens == 6
    assert rt.token_usage.completion_tokens == 6

    def boom(piece):
        raise RuntimeError("reader failed")

    aborted = sum(r["requests_finished"]["abort"] for r in rt.stats()["replicas"])
    long = GenerateRequest(UNRELATED[1], SP(max_tokens=200, ignore_eos=True))
    with pytest.raises(RuntimeError, match="reader failed"):
        rt.generate(long, stream=boom)
    rt.engine.check_integrity()  # every replica's bookkeeping, after the abort

    def settled():  # the abort is applied on the engine thread, the stats follow a step later
        stats = rt.stats()
        finished = sum(r["requests_finished"]["abort"] for r in stats["replicas"])
        idle = stats["num_running"] == 0 and all(r["load"] == 0 for r in stats["replicas"])
        return finished == aborted + 1 and idle

    deadline = time.monotonic() + 30
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert settled()
    with pytest.raises(ContextLengthError):  # refused by the replica, and nothing recorded
        rt.generate(GenerateRequest("word " * 3000, SP(max_tokens=1)))
    assert rt.stats()["replicas_alive"] == 2


class Fatal(BaseException):
    """Not an Exception: the engine loop cannot recover from it and its thread ends."""


def kill(engine):
    def planted(*args, **kwargs):
        raise Fatal("planted engine failure")

    engine.scheduler.process_results = planted


def test_a_dead_replica_takes_only_its_requests_and_the_router_skips_it(tiny, caplog):
    from lmprog.runtime.engine.io import EngineRequest

    rt = runtime(tiny)
    try:
        group = rt.engine
        kill(group.replicas[1])
        prompts = [rt.tokenizer.encode(q) for q in UNRELATED[:4]]
        assert len({len(p) for p in prompts}) == 1  # equal lengths: routed 0, 1, 0, 1
        params = SP(max_tokens=8, temperature=0, ignore_eos=True)
        handles = [group.submit(EngineRequest(tuple(p), params)) for p in prompts]
        for i, h in enumerate(handles):
            if i % 2:
                with pytest.raises(BackendError, match="engine failed.*planted engine failure"):
                    h.result(timeout=60)
            else:
                assert h.result(timeout=60).completion_tokens == 8
        with caplog.at_level("WARNING", logger="lmprog.runtime.data_parallel.replicas"):
            out = rt.generate(UNRELATED, {"max_tokens": 2})
        assert len(out) == len(UNRELATED) and "replica 1 (of 2) stopped" in caplog.text
        stats = rt.stats()
        assert stats["replicas_alive"] == 1 and not stats["replicas"][1]["alive"]
        assert sum(stats["replicas"][1]["routed"].values()) == 2  # nothing after it died
        assert stats["kv_capacity"] == 2048  # the living replica's
        kill(group.replicas[0])
        request = GenerateRequest(prompt="Hello", params=SP(max_tokens=4))
        with pytest.raises(BackendError, match="engine failed"):
            rt.generate(request)
        with pytest.raises(BackendError, match="every one of the 2 data-parallel replicas"):
            rt.generate(request)
        assert not rt.engine.alive
    finally:
        rt.shutdown()


def test_requests_without_output_move_off_a_dying_replica(tiny, caplog):
    """Non-streamed requests on a replica whose engine thread dies run again on the other one
    (their callers saw nothing) and end as if nothing happened (issue 35, section 3)."""
    from lmprog.runtime.engine.io import EngineRequest

    rt = runtime(tiny)
    try:
        group = rt.engine
        kill(group.replicas[1])
        prompts = [rt.tokenizer.encode(q) for q in UNRELATED[:4]]
        params = SP(max_tokens=8, temperature=0, ignore_eos=True)
        with caplog.at_level("WARNING", logger="lmprog.runtime.data_parallel.replicas"):
            handles = [group.submit(EngineRequest(tuple(p), params), stream=False) for p in prompts]
            results = [h.result(timeout=60) for h in handles]
        assert [r.completion_tokens for r in results] == [8] * 4
        assert group.retries == 2 and "submitted again to replica 0" in caplog.text
        single = [rt.generate(GenerateRequest(prompt=q, params=params)) for q in UNRELATED[:4]]
        assert [r.text for r in results] == [r.text for r in single]
        assert rt.stats()["dp_retries"] == 2 and rt.stats()["replicas_alive"] == 1
    finally:
        rt.shutdown()


def test_bad_dp_size_is_refused_before_loading(tiny):
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="dp_size must be an int >= 1"):
            lp.Runtime("definitely/not/a/model", device="cpu", dp_size=bad)


def test_serve_dp_flag_reaches_the_runtime():
    from lmprog.serve.cli import add_serve_arguments, backend_options

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert backend_options(parser.parse_args(["--dp", "2"]))["dp_size"] == 2
    assert backend_options(parser.parse_args(["--dp-size", "3"]))["dp_size"] == 3
    assert "dp_size" not in backend_options(parser.parse_args([]))  # Runtime's default
    with pytest.raises(ValueError, match="--dp 2 applies to --backend runtime only"):
        backend_options(parser.parse_args(["--dp", "2", "--backend", "llamacpp"]))


def test_a_server_over_two_replicas_answers_and_reports_them(rt):
    pytest.importorskip("uvicorn")
    import json
    import urllib.request

    from lmprog.serve import Server

    def post(url, body):
        request = urllib.request.Request(
            url, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    before = sum(sum(r.values()) for r in routed(rt))
    with Server(rt).start() as srv:
        body = {"model": srv.model_name, "prompt": PREFIX, "max_tokens": 3, "temperature": 0}
        answers = [post(srv.url + "/v1/completions", body) for _ in range(2)]
        with urllib.request.urlopen(srv.url + "/metrics", timeout=60) as response:
            metrics = response.read().decode()
    assert all(a["usage"]["completion_tokens"] == 3 for a in answers)
    assert answers[0]["choices"][0]["text"] == answers[1]["choices"][0]["text"]
    assert sum(sum(r.values()) for r in routed(rt)) == before + 2
    assert "lmprog_kv_cache_usage_ratio" in metrics


@pytest.mark.e2e
def test_the_bundled_model_on_two_replicas_keeps_a_fork_together():
    rt = lp.Runtime(device="cpu", max_total_tokens=2048, dp_size=2)
    try:

        @lp.function
        def colours(s):
            s += lp.system("You are a terse assistant.")
            forks = s.fork(2)
            forks += [lp.user("Name a colour."), lp.user("Name a fruit.")]
            forks += lp.assistant(lp.gen("a", max_tokens=8, temperature=0))
            forks.join()

        state = colours.run(backend=rt)
        assert state.error() is None and all(a.strip() for a in state["a"])
        homes = [r for r in rt.stats()["replicas"] if sum(r["routed"].values())]
        assert len(homes) == 1 and homes[0]["routed"]["pinned"] == 2
        assert homes[0]["cached_tokens"] > 0  # the children reused the cached system prompt
    finally:
        rt.shutdown()
