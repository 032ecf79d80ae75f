"""Tensor parallelism on the CPU (gloo): TP=2 over 2 processes serves exactly what TP=1
serves (greedy tokens equal, logprobs within fp32 tolerance), with the KV heads split or
replicated, a vocabulary padded to the ranks, radix reuse, retraction and overlap
scheduling; sizes that cannot be split are refused naming them. The faults (a worker
killed or hung mid-run, one dying while idle) are in test_tp_faults.py, the bundled model
at TP=3 in test_tp_bundled.py."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch
from tp_testing import assert_same, leftover_workers, write_tiny

from lmprog.core.sampling import SamplingParams as SP
from lmprog.runtime.assemble import assemble_model
from lmprog.runtime.config import CacheConfig, SchedulerConfig
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.models import ModelConfig, config_from_hf
from lmprog.runtime.parallel import ShardPlan, check_shardable
from lmprog.runtime.parallel.start import check_tp_size, start_tensor_parallel

HEAD = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19]
PROMPTS = [HEAD + [i, i + 1, i + 2] for i in range(1, 7)] + [[5, 6, 7], [90, 91, 92, 93, 94]]


def launch(folder, tp_size, *, slots=2048, overlap=False, **sched):
    build = {"model": str(folder), "dtype": "float32"}
    tp = start_tensor_parallel(tp_size, build, device="cpu") if tp_size > 1 else None
    net = assemble_model(**build, device="cpu", tp=tp)
    return launch_engine(
        net,
        None,
        eos_token_ids=(0,),
        max_total_tokens=slots,
        scheduler_config=SchedulerConfig(**sched),
        cache_config=CacheConfig(),
        engine_config=EngineConfig(check_integrity=True, overlap=overlap),
        tp=tp,
    )


def run(engine, prompts, max_tokens=10):
    params = SP(max_tokens=max_tokens, temperature=0, return_logprob=True)
    handles = [engine.submit(EngineRequest(tuple(p), params), stream=False) for p in prompts]
    return [h.result(timeout=120) for h in handles]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """4 query heads, 2 KV heads (split 1 + 1), vocabulary 101 (padded to 2 x 51), tied."""
    return write_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def reference(tiny):
    engine = launch(tiny, 1)
    try:
        yield run(engine, PROMPTS)
    finally:
        engine.shutdown()


def test_tp2_matches_tp1_with_radix_reuse_and_overlap(tiny, reference):
    engine = launch(tiny, 2, overlap=True)
    try:
        first = run(engine, PROMPTS)
        again = run(engine, PROMPTS)  # the prompts are cached now: prefill from the pool
        stats = engine.stats()
        engine.check_integrity()
    finally:
        engine.shutdown()
    assert_same(first, reference)
    assert_same(again, reference)
    assert all(r.cached_tokens > 0 for r in again)
    assert stats["overlapped_steps"] > 0  # the placeholders' tokens travelled to rank 1
    assert leftover_workers() == []


def test_tp2_retracts_under_a_small_pool_and_still_matches(tiny, reference):
    engine = launch(
        tiny,
        2,
        slots=60,
        max_num_batched_tokens=16,
        max_running_requests=16,
        init_new_token_ratio=0.02,
        min_new_token_ratio=0.02,
    )
    try:
        results = run(engine, PROMPTS)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert_same(results, reference)
    assert stats["num_retractions"] > 0, "the pool was meant to run out"
    assert leftover_workers() == []


def test_tp2_replicates_a_single_kv_head_untied_with_bias(tmp_path):
    folder = write_tiny(tmp_path / "m", model_type="qwen2", kv_heads=1, vocab=100, tied=False)
    one = launch(folder, 1)
    try:
        want = run(one, PROMPTS[:4])
    finally:
        one.shutdown()
    two = launch(folder, 2)
    try:
        got = run(two, PROMPTS[:4])
    finally:
        two.shutdown()
    assert_same(got, want)
    assert leftover_workers() == []


def test_shard_plans():
    with pytest.raises(ValueError, match="6 query heads"):
        ShardPlan(config_from_hf({"model_type": "llama", **_hf(6, 2, 101)}), 0, 4)
    # kv=2 over 4 ranks: replicated, rank r keeps head r*2//4; vocab 101 -> 26 rows each
    config = config_from_hf({"model_type": "llama", **_hf(8, 2, 101)})
    plans = [ShardPlan(config, r, 4) for r in range(4)]
    assert [p.first_kv_head for p in plans] == [0, 0, 1, 1]
    assert {p.local.num_heads for p in plans} == {2} and {p.kv_heads for p in plans} == {1}
    assert plans[0].vocab == 26 and plans[3].select("model.embed_tokens.weight") == (0, 78, 104)
    emb = torch.arange(101.0)[:, None]
    assert plans[3].narrow("model.embed_tokens.weight", emb)[:, 0].tolist() == [
        *range(78, 101),
        0,
        0,
        0,
    ]


def _hf(heads, kv, vocab):
    return {
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": 16,
    }


@pytest.mark.parametrize(
    ("heads", "kv", "inter", "tp", "words"),
    [
        (9, 3, 96, 2, "does not divide the model's 9 query heads"),
        (12, 6, 96, 4, "does not divide the model's 6 KV heads"),
        (6, 2, 96, 3, "2 KV heads cannot be replicated over tp_size=3"),
        (8, 2, 90, 4, "intermediate size 90"),
    ],
)
def test_sizes_that_do_not_split_are_refused_naming_them(heads, kv, inter, tp, words):
    config = ModelConfig("llama", 101, 64, inter, 1, heads, kv, 16, 512)
    with pytest.raises(ValueError, match=words):
        check_shardable(config, tp)
    with pytest.raises(ValueError, match=words):  # before any worker starts
        start_tensor_parallel(tp, {"model": config, "load_format": "dummy"}, device="cpu")
    assert leftover_workers() == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_tp_size_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="tp_size must be an int >= 1"):
        check_tp_size(bad)


TORCHRUN_SCRIPT = """
import json, sys
from lmprog.core.sampling import SamplingParams as SP
from lmprog.runtime.assemble import assemble_model
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.parallel.start import start_tensor_parallel

build = {"model": sys.argv[1], "dtype": "float32"}
tp = start_tensor_parallel(2, build, device="cpu")  # ranks other than 0 serve, then exit
engine = launch_engine(assemble_model(**build, tp=tp), None, eos_token_ids=(0,),
                       max_total_tokens=2048, tp=tp)
params = SP(max_tokens=10, temperature=0)
out = [engine.submit(EngineRequest(tuple(p), params)).result(60).token_ids
       for p in json.loads(sys.argv[2])]
engine.shutdown()
print("TOKENS", json.dumps(out))
"""


def test_torchrun_launch_serves_the_same_tokens(tiny, reference, tmp_path):
    script = tmp_path / "serve_tp.py"
    script.write_text(TORCHRUN_SCRIPT)
    prompts = PROMPTS[:3]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
            str(tiny),
            json.dumps(prompts),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("TOKENS"))
    assert json.loads(line.split(" ", 1)[1]) == [list(r.token_ids) for r in reference[:3]]


def test_serve_flags():
    from lmprog.serve.cli import add_serve_arguments, backend_options

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert backend_options(parser.parse_args(["--tp", "2"]))["tp_size"] == 2
    assert backend_options(parser.parse_args(["--tp-size", "3"]))["tp_size"] == 3
    assert "tp_size" not in backend_options(parser.parse_args([]))  # Runtime's default
    with pytest.raises(ValueError, match="--tp 2 applies to --backend runtime only"):
        backend_options(parser.parse_args(["--tp", "2", "--backend", "llamacpp"]))


class _Alone:
    """Collectives of a group whose other ranks contribute nothing (shapes only)."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def all_reduce(self, t):
        return t

    def all_gather(self, t):
        return t.expand(self.world, *t.shape)


def test_dummy_weights_are_the_slices_of_tp1s():
    from lmprog.runtime.parallel.load import load_shard

    config = ModelConfig("qwen2", 101, 64, 96, 2, 4, 2, 16, 512, attention_bias=True)
    whole = assemble_model(config, load_format="dummy", device="cpu", seed=5)
    params = dict(whole.named_parameters())
    for rank in (0, 1):
        plan = ShardPlan(config, rank, 2)
        shard = load_shard(
            config, _Alone(rank, 2), device=torch.device("cpu"), load_format="dummy", seed=5
        )
        qkv = params["model.layers.1.self_attn.qkv_proj.weight"].split([64, 32, 32])
        local = shard.model.layers[1].self_attn.qkv_proj.weight.split([32, 16, 16])
        for want, got, name in zip(qkv, local, ("q_proj", "k_proj", "v_proj")):
            sel = plan.select(f"model.layers.1.self_attn.{name}.weight")
            assert torch.equal(got, want[sel[1] : sel[2]])
        down = shard.model.layers[0].mlp.down_proj.inner.weight
        assert torch.equal(
            down, params["model.layers.0.mlp.down_proj.weight"][:, rank * 48 : (rank + 1) * 48]
        )
        emb = shard.model.embed_tokens.weight
        assert torch.equal(
            emb[: 101 - rank * 51], params["model.embed_tokens.weight"][rank * 51 : (rank + 1) * 51]
        )
        if rank == 1:  # 101 rows over 2 ranks: the last one padded with a zero row
            assert not emb[50].any()
        assert shard.config == config and shard.shard_config.num_heads == 2


def test_a_shard_is_loaded_from_where_load_model_would_load_it(tiny):
    """load_shard resolves its weights as load_model does (loaders.weights_source): an
    architecture named without weights and files of the other format are refused alike,
    before any shard is built."""
    from lmprog.runtime.models import load_model
    from lmprog.runtime.parallel.load import load_shard

    for model, fmt, words in (
        ("smollm2-135m", "auto", "names an architecture without weights"),
        (str(tiny), "gguf", "is a hf model; use load_format='auto'"),
        (str(tiny), "npz", "unknown load_format 'npz'"),
    ):
        with pytest.raises(ValueError, match=words):
            load_model(model, load_format=fmt)
        with pytest.raises(ValueError, match=words):
            load_shard(model, None, device=torch.device("cpu"), load_format=fmt)
