"""Data parallelism over tensor-parallel replicas on the CPU (gloo): lp.Runtime(dp_size=2,
tp_size=2) serves from two replicas, each a group of rank 0 (an engine thread here) and one
spawned worker. Greedy tokens equal TP=1's (logprobs within fp32 tolerance); the children of
a fork land on the replica that cached their prefix and unrelated prompts are spread; a
worker of one replica killed mid-run fails that replica's requests only, the router stops
sending to it, and no worker outlives the runtime. LoRA adapters, given at start and loaded
at run time, reach every rank of every replica."""

from __future__ import annotations

import argparse
import os
import signal
import time

import pytest
from dp_testing import UNRELATED, delta, fork_lands_on_one_replica, routed
from lora_testing import write_adapter
from tp_testing import assert_same, leftover_workers, write_tiny_with_tokenizer

import lmprog as lp
from lmprog.core.errors import LoraError
from lmprog.core.sampling import SamplingParams as SP
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.models import config_from_hf
from lmprog.runtime.parallel.start import check_tp_size

PREFIX = "You are a careful assistant. Answer each question in a few words, then stop. " * 2
PARAMS = {"max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_logprob": True}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tp_testing's tiny model over the default model's vocabulary, with its tokenizer."""
    return str(write_tiny_with_tokenizer(tmp_path_factory.mktemp("tiny")))


def runtime(tiny, dp_size=2, tp_size=2):
    return lp.Runtime(
        tiny, device="cpu", dtype="float32", max_total_tokens=1024, dp_size=dp_size, tp_size=tp_size
    )


@pytest.fixture(scope="module")
def pair(tiny):
    rt = runtime(tiny)
    yield rt
    rt.shutdown()
    assert leftover_workers() == []


def test_two_tp_replicas_serve_tp1s_tokens_and_route_by_prefix(tiny, pair):
    with runtime(tiny, dp_size=1, tp_size=1) as one:
        prompts = [PREFIX + q for q in UNRELATED[:3]] + UNRELATED[3:5]
        want = one.generate(prompts, PARAMS)
    stats = pair.stats()
    assert stats["dp_size"] == 2 and stats["replicas_alive"] == 2
    assert [r["device"] for r in stats["replicas"]] == ["cpu,cpu", "cpu,cpu"]
    assert len(leftover_workers()) == 2  # one worker per replica
    assert_same(pair.generate(prompts, PARAMS), want)
    assert all(sum(r.values()) for r in routed(pair))  # both replicas served some
    assert pair.flush_cache()
    home = fork_lands_on_one_replica(pair, PREFIX)
    assert pair.stats()["replicas"][home]["cached_tokens"] > 0
    before = routed(pair)
    pair.generate(UNRELATED, {"max_tokens": 2, "temperature": 0})  # together: spread
    assert [sum(m.values()) for m in delta(before, routed(pair))] == [3, 3]


def test_a_killed_worker_takes_down_only_its_replica(tiny):
    others = set(leftover_workers())  # the module's runtime's, when it has run
    rt = runtime(tiny)
    try:
        group = rt.engine
        workers = [e.runner.channel.group.workers[0] for e in group.replicas]
        prompts = [rt.tokenizer.encode(q) for q in UNRELATED[:4]]
        assert len({len(p) for p in prompts}) == 1  # equal lengths: routed 0, 1, 0, 1
        long = SP(max_tokens=480, temperature=0, ignore_eos=True)
        handles = [group.submit(EngineRequest(tuple(p), long), stream=False) for p in prompts]
        deadline = time.monotonic() + 60
        while group.replicas[1].stats()["steps"] < 3:
            assert time.monotonic() < deadline, "replica 1 never started"
            time.sleep(0.01)
        os.kill(workers[1].pid, signal.SIGKILL)
        # replica 1's requests had given no output (not streamed, no result yet): they run
        # again on replica 0 (the data-parallel retry) and finish whole
        for h in handles:
            assert h.result(timeout=240).completion_tokens == 480
        out = rt.generate(UNRELATED, {"max_tokens": 2, "temperature": 0})
        assert len(out) == len(UNRELATED)
        stats = rt.stats()
        assert stats["dp_retries"] == 2
        assert stats["replicas_alive"] == 1 and not stats["replicas"][1]["alive"]
        assert sum(stats["replicas"][1]["routed"].values()) == 2  # nothing after it died
        assert workers[1].poll() is not None and workers[0].poll() is None
        assert set(leftover_workers()) - others == {workers[0].pid}
    finally:
        rt.shutdown()
    assert workers[0].poll() is not None
    assert set(leftover_workers()) - others == set()


def test_adapters_reach_every_rank_of_every_replica(tiny, tmp_path):
    others = set(leftover_workers())  # the module's runtime's, when it has run
    config = config_from_hf(tiny)
    some = ("q_proj", "o_proj", "up_proj", "down_proj")
    paths = {
        "a": str(write_adapter(tmp_path / "a", config, rank=4, std=0.3, seed=1)),
        "b": str(write_adapter(tmp_path / "b", config, rank=8, std=0.3, seed=2, targets=some)),
    }
    lora = {"max_lora_rank": 8, "lora_target_modules": "all", "max_loras_per_batch": 1}
    prompts = [q for q in UNRELATED[:4] for _ in range(3)]
    params = [{**PARAMS, "lora_path": n} for _ in UNRELATED[:4] for n in (None, "a", "b")]
    with lp.Runtime(tiny, device="cpu", dtype="float32", max_total_tokens=1024,
                    lora_paths=paths, **lora) as one:  # fmt: skip
        want = one.generate(prompts, params)
    assert [r.token_ids for r in want[:3]] != [want[0].token_ids] * 3  # the adapters matter
    with lp.Runtime(tiny, device="cpu", dtype="float32", max_total_tokens=1024, dp_size=2,
                    tp_size=2, lora_paths={"a": paths["a"]}, **lora) as rt:  # fmt: skip
        rt.load_lora_adapter("b", paths["b"])  # to both replicas, their workers with a step
        got = rt.generate(prompts, params)
        stats = rt.stats()
        rt.unload_lora_adapter("b")
        with pytest.raises(LoraError, match="no LoRA adapter named 'b'"):
            rt.generate(UNRELATED[0], {**PARAMS, "lora_path": "b"})
    assert_same(got, want)
    assert all(r["lora_swaps"] for r in stats["replicas"])  # both replicas ran adapters
    assert set(leftover_workers()) - others == set()


def test_tp_with_dp_is_refused_only_under_torchrun(monkeypatch):
    check_tp_size(2, 2)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(ValueError, match="tp_size=2 with dp_size=2 under torchrun"):
        check_tp_size(2, 2)
    check_tp_size(2, 1)


def test_serve_takes_tp_and_dp_together():
    from lmprog.serve.cli import add_serve_arguments, backend_options, choose_backend

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--tp", "2", "--dp", "2"])
    assert choose_backend(args)[0] == "runtime"
    options = backend_options(args)
    assert options["tp_size"] == 2 and options["dp_size"] == 2
