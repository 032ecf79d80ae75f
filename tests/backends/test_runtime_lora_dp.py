"""LoRA adapters with lp.Runtime(dp_size=2) on the CPU: two engine replicas over one tiny
random Llama (sharing its weights, each with its own adapter pool). Every replica serves the
adapters given at start and those loaded at run time (the folder read once, registered on
each); outputs equal dp_size=1's while both replicas run adapter requests at once; a load
that fails on one replica names it and is undone on the others; unloading reaches every
replica; the router keys prefixes by adapter, as the engines' caches do."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from dp_testing import UNRELATED, delta, routed
from hf_tiny import default_hf_tokenizer, save_tiny_llama

import lmprog as lp
from lmprog.core.errors import LoraError
from lmprog.core.sampling import SamplingParams
from lmprog.runtime.models import config_from_hf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from lora_testing import write_adapter
from tp_testing import assert_same, write_tiny

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

PARAMS = {"max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_logprob": True}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny Llama of test_runtime_dp.py and three adapters of it."""
    root = tmp_path_factory.mktemp("lora-dp")
    folder = save_tiny_llama(root / "model", default_hf_tokenizer())
    config = config_from_hf(folder)
    adapters = {
        "a": write_adapter(root / "a", config, rank=4, std=0.4, seed=1),
        "b": write_adapter(
            root / "b", config, rank=8, std=0.4, seed=2, targets=("q_proj", "v_proj", "down_proj")
        ),
        "c": write_adapter(
            root / "c", config, rank=4, std=0.4, seed=3, targets=("o_proj", "gate_proj", "up_proj")
        ),
    }
    return str(folder), {k: str(v) for k, v in adapters.items()}


def runtime(tiny, dp_size, names=("a", "b")):
    folder, paths = tiny
    return lp.Runtime(
        folder,
        device="cpu",
        max_total_tokens=2048,
        dp_size=dp_size,
        check_integrity=True,
        lora_paths={n: paths[n] for n in names},
        max_lora_rank=8,
        lora_target_modules="all",
        max_loras_per_batch=2,
    )


@pytest.fixture(scope="module")
def pair(tiny):
    backend = runtime(tiny, 2)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def single(tiny):
    backend = runtime(tiny, 1, ("a", "b", "c"))
    yield backend
    backend.shutdown()


def requests(adapters):
    """Every unrelated prompt under each adapter (and the base): spread over the replicas."""
    prompts = [q for q in UNRELATED for _ in adapters]
    params = [{**PARAMS, "lora_path": n} for _ in UNRELATED for n in adapters]
    return prompts, params


def same(got, want):
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    for g, w in zip(got, want):
        a = torch.tensor([t.logprob for t in g.logprobs])
        b = torch.tensor([t.logprob for t in w.logprobs])
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_every_replica_serves_the_adapters_of_the_start(pair, single):
    first, second = pair.engine.replicas
    assert first.runner.model is second.runner.model  # the weights shared...
    assert first.lora.pool is not second.lora.pool  # ...each replica its own adapter pool
    for engine in (first, second):
        assert {a["name"] for a in engine.lora_adapters()} == {"a", "b"}
    prompts, params = requests((None, "a", "b"))
    want = single.generate(prompts, params)
    base = [r.token_ids for r, p in zip(want, params) if p["lora_path"] is None]
    under_a = [r.token_ids for r, p in zip(want, params) if p["lora_path"] == "a"]
    assert base != under_a  # the adapters matter
    same(pair.generate(prompts, params), want)
    swaps = [r["lora_swaps"] for r in pair.stats()["replicas"]]
    assert all(swaps), f"both replicas ran adapter requests: {swaps}"


def test_load_and_unload_reach_every_replica(pair, single, tiny):
    _, paths = tiny
    card = pair.load_lora_adapter("c", paths["c"])
    assert card["name"] == "c" and card["target_modules"] == ["gate_proj", "o_proj", "up_proj"]
    for engine in pair.engine.replicas:
        assert {a["name"] for a in engine.lora_adapters()} == {"a", "b", "c"}
    assert {a["name"] for a in pair.lora_adapters()} == {"a", "b", "c"}
    prompts, params = requests(("c", None))
    same(pair.generate(prompts, params), single.generate(prompts, params))
    assert all(r["lora_adapters"] == 3 for r in pair.stats()["replicas"])
    pair.unload_lora_adapter("c")
    for engine in pair.engine.replicas:
        assert {a["name"] for a in engine.lora_adapters()} == {"a", "b"}
    for prompt in UNRELATED[:4]:  # whichever replica it lands on
        with pytest.raises(LoraError, match="no LoRA adapter named 'c'"):
            pair.generate(prompt, {**PARAMS, "lora_path": "c"})
    with pytest.raises(LoraError, match="no LoRA adapter named 'c'") as info:
        pair.unload_lora_adapter("c")
    assert info.value.unknown


def test_a_load_failing_on_one_replica_names_it_and_is_undone(pair, tiny, tmp_path):
    _, paths = tiny
    first, second = pair.engine.replicas
    second.load_lora_adapter("d", paths["c"])  # only replica 1 has a "d": its load fails
    with pytest.raises(
        LoraError,
        match=r"data-parallel replica 1 \(of 2\) could not load LoRA adapter 'd': a LoRA "
        r"adapter named 'd' is already loaded; unload it first; unloaded it again from "
        r"replica\(s\) 0",
    ):
        pair.load_lora_adapter("d", paths["a"])
    assert "d" not in {a["name"] for a in first.lora_adapters()}
    assert "d" in {a["name"] for a in second.lora_adapters()}
    pair.unload_lora_adapter("d")  # where it is loaded (replica 0 has none: logged)
    assert all("d" not in {a["name"] for a in e.lora_adapters()} for e in pair.engine.replicas)
    (tmp_path / "adapter_config.json").write_text("{}")  # read once, before any replica
    with pytest.raises(LoraError, match="r must be a positive int"):
        pair.load_lora_adapter("broken", str(tmp_path))
    for engine in pair.engine.replicas:
        assert {a["name"] for a in engine.lora_adapters()} == {"a", "b"}
    out = pair.generate(UNRELATED[:2], {**PARAMS, "lora_path": "b"})
    assert [r.completion_tokens for r in out] == [6, 6]


def test_the_router_keys_prefixes_by_adapter(pair):
    assert pair.flush_cache()
    prompt = "You are a careful assistant. Answer in a few words. " * 3 + "What is rust?"
    steps = []
    for lora_path in (None, "a", "a", None, "b"):
        before = routed(pair)
        pair.generate(prompt, {**PARAMS, "lora_path": lora_path})
        steps.append([m for m in delta(before, routed(pair)) if m])
    # the prompt sent under the base model is no prefix hit for "a" (nor for "b"), which
    # the engines could not reuse; under its own adapter (or the base) again it is
    reasons = [next(iter(m[0])) for m in steps]
    assert reasons == ["least_loaded", "least_loaded", "prefix", "prefix", "least_loaded"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_two_replicas_on_one_gpu_capture_graphs_with_their_own_pools(tmp_path):
    """Both replicas on cuda:0 share the weights; each captures its decode graphs (fp32:
    with adapters too) over its own pool, and serves what one engine serves."""
    from lmprog.runtime.assemble import assemble_model
    from lmprog.runtime.config import LoraConfig
    from lmprog.runtime.data_parallel.replicas import launch_replicas
    from lmprog.runtime.engine.io import EngineRequest
    from lmprog.runtime.engine.launch import launch_engine
    from lmprog.runtime.lora import read_adapter

    folder = write_tiny(tmp_path / "model")
    config = config_from_hf(folder)
    paths = {n: write_adapter(tmp_path / n, config, rank=4, std=0.3, seed=i)
             for i, n in enumerate("abc")}  # fmt: skip

    def build(device):
        return assemble_model(str(folder), device=device, dtype="float32")

    def launch(net, **kw):
        adapters = [read_adapter(p, config, name=n) for n, p in paths.items()]
        lora = LoraConfig(max_loras_per_batch=2, max_lora_rank=4, lora_target_modules="all")
        return launch_engine(net, None, eos_token_ids=(0,), max_total_tokens=2048, lora=lora,
                             lora_adapters=adapters, **kw)  # fmt: skip

    params = SamplingParams(max_tokens=12, temperature=0, return_logprob=True, ignore_eos=True)
    prompts = [[3 + i, 14, 15, 92, 65 + i] for i in range(8)]
    requests = [EngineRequest(tuple(p), params, lora=(None, "a", "b", "c")[i % 4])
                for i, p in enumerate(prompts)]  # fmt: skip
    one = launch(build("cuda"))
    try:
        want = [h.result(timeout=120) for h in [one.submit(r, stream=False) for r in requests]]
    finally:
        one.shutdown()
    group = launch_replicas(2, build("cuda"), device="cuda", build=build, launch=launch)
    try:
        first, second = group.replicas
        assert first.runner.model is second.runner.model
        for engine in (first, second):
            assert engine.runner.graphs is not None
            assert engine.runner.graphs.lora_buffers is not None
        got = [h.result(timeout=120) for h in [group.submit(r) for r in requests]]
        swaps = [e.stats()["lora_swaps"] for e in group.replicas]
    finally:
        group.shutdown()
    assert_same(got, want)
    assert all(swaps), f"both replicas ran adapter requests: {swaps}"
