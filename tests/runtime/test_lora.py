"""Multi-LoRA in the runtime (lmprog.runtime.lora): PEFT folders read and checked, parity
with merged weights, a batch mixing adapters and the base model giving each request what it
gets alone, adapter slots paged LRU, malformed adapters refused while the others serve, and
the radix cache never sharing a prefix across adapters."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from engine_testing import TINY, random_llama
from lora_testing import ALL, merged, write_adapter

from lmprog.core.errors import LoraError
from lmprog.core.sampling import SamplingParams as SP
from lmprog.runtime.config import LoraConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.lora import LoraManager, read_adapter
from lmprog.runtime.lora.ops import LoraBatch
from lmprog.runtime.request import Req

GREEDY = SP(max_tokens=10, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def base():
    return random_llama(TINY, 0.3)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Four adapters of different ranks and targets (and one on some layers only)."""
    root = tmp_path_factory.mktemp("adapters")
    return {
        "all4": write_adapter(root / "all4", TINY, rank=4, seed=1),
        "qv8": write_adapter(root / "qv8", TINY, rank=8, targets=("q_proj", "v_proj"), seed=2),
        "mlp2": write_adapter(
            root / "mlp2",
            TINY,
            rank=2,
            alpha=4,
            targets=("gate_proj", "up_proj", "down_proj"),
            seed=3,
        ),  # fmt: skip
        "o6": write_adapter(
            root / "o6",
            TINY,
            rank=6,
            targets=("o_proj", "k_proj"),
            seed=4,
            layers=(1,),
            rslora=True,
        ),  # fmt: skip
    }


def _forward(model, ids, lora_batch=None, manager=None):
    """Prefill logits of every position of `ids` (one request) through a fresh pool."""
    kv = KVPool.for_model(model.config, 256, torch.float32, torch.device("cpu"))
    table = torch.zeros(1, 128, dtype=torch.int32)
    table[0, : len(ids)] = torch.arange(1, len(ids) + 1)
    fb = ForwardBatch.build(
        input_ids=ids,
        out_cache_loc=list(range(1, len(ids) + 1)),
        req_pool_indices=[0],
        seq_lens=[len(ids)],
        extend_lens=[len(ids)],
        req_to_token=table,
        logits_indices=range(len(ids)),
    )
    with torch.inference_mode():
        if manager is not None:
            manager.context.batch = lora_batch
        try:
            return model(fb, kv)
        finally:
            if manager is not None:
                manager.context.batch = None


# ---- reading PEFT folders ----------------------------------------------------------------


def test_read_adapter_scales_and_ranks(folders):
    a = read_adapter(folders["all4"], TINY, name="all4")
    assert a.rank == 4 and a.targets == frozenset(ALL)
    assert len(a.weights) == TINY.num_layers * 7
    o6 = read_adapter(folders["o6"], TINY, name="o6")
    assert set(o6.weights) == {(1, "o_proj"), (1, "k_proj")}
    from safetensors.torch import load_file

    raw = load_file(str(folders["o6"] / "adapter_model.safetensors"))
    b = raw["base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight"]
    torch.testing.assert_close(o6.weights[(1, "o_proj")][1], b * (8.0 / math.sqrt(6)))


def test_alpha_and_rank_patterns(tmp_path):
    """PEFT's rank_pattern / alpha_pattern: a module of its own rank and alpha."""
    folder = write_adapter(tmp_path / "p", TINY, rank=4, targets=("q_proj", "v_proj"),
                           extra_config={"alpha_pattern": {"v_proj": 2.0}})  # fmt: skip
    a = read_adapter(folder, TINY)
    from safetensors.torch import load_file

    raw = load_file(str(folder / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.0.self_attn.{}.lora_B.weight"
    torch.testing.assert_close(a.weights[(0, "v_proj")][1], raw[key.format("v_proj")] * 0.5)
    torch.testing.assert_close(a.weights[(0, "q_proj")][1], raw[key.format("q_proj")] * 2.0)


def _corrupt(tmp_path, name, **kw):
    return write_adapter(tmp_path / name, TINY, rank=4, **kw)


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "adapter_config.json").read_text())
    cfg.update(changes)
    (folder / "adapter_config.json").write_text(json.dumps(cfg))


def _edit_tensors(folder, fn):
    from safetensors.torch import load_file, save_file

    file = str(folder / "adapter_model.safetensors")
    tensors = fn(load_file(file))
    save_file(tensors, file)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("missing_folder", "does not exist"),
        ("no_config", "no adapter_config.json"),
        ("bad_json", "cannot read adapter_config.json"),
        ("no_weights", "no adapter_model"),
        ("garbage_weights", "cannot read adapter_model.safetensors"),
        ("dora", "use_dora"),
        ("bias", "trained biases"),
        ("prefix_tuning", "only LoRA"),
        ("lm_head", "not LoRA weights of a projection"),
        ("no_b", "has no lora_B"),
        ("other_model", "trained for another base model"),
        ("too_many_layers", "the model has 2 layers"),
        ("nan", "NaN"),
        ("rank_mismatch", "of one rank r"),
    ],
)
def test_malformed_adapters_are_clear_errors(tmp_path, damage, message):
    folder = _corrupt(tmp_path, "a")
    if damage == "missing_folder":
        folder = tmp_path / "nowhere"
    elif damage == "no_config":
        (folder / "adapter_config.json").unlink()
    elif damage == "bad_json":
        (folder / "adapter_config.json").write_text("{not json")
    elif damage == "no_weights":
        (folder / "adapter_model.safetensors").unlink()
    elif damage == "garbage_weights":
        (folder / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    elif damage == "dora":
        _edit_config(folder, use_dora=True)
    elif damage == "bias":
        _edit_config(folder, bias="lora_only")
    elif damage == "prefix_tuning":
        _edit_config(folder, peft_type="PREFIX_TUNING")
    elif damage == "lm_head":
        _edit_tensors(folder, lambda t: {**t, "base_model.model.lm_head.lora_A.weight":
                                         torch.zeros(4, 64)})  # fmt: skip
    elif damage == "no_b":
        _edit_tensors(folder, lambda t: {k: v for k, v in t.items()
                                         if "layers.1.mlp.up_proj.lora_B" not in k})  # fmt: skip
    elif damage == "other_model":
        key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
        _edit_tensors(folder, lambda t: {**t, key: torch.zeros(4, 48)})
    elif damage == "too_many_layers":
        write_adapter(folder, TINY, rank=4, layers=(0, 1))
        _edit_tensors(folder, lambda t: {k.replace("layers.1.", "layers.7."): v
                                         for k, v in t.items()})  # fmt: skip
    elif damage == "nan":
        key = "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"
        _edit_tensors(folder, lambda t: {**t, key: torch.full_like(t[key], float("nan"))})
    elif damage == "rank_mismatch":
        key = "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"
        _edit_tensors(folder, lambda t: {**t, key: torch.zeros(32, 3)})
    with pytest.raises(LoraError, match=message) as info:
        read_adapter(folder, TINY, name="a")
    assert "'a'" in str(info.value)


# ---- the model with adapters -------------------------------------------------------------


@pytest.mark.parametrize("name", ["all4", "qv8", "mlp2", "o6"])
def test_parity_with_merged_weights(base, folders, name):
    """Logits of every prompt position under an adapter == the model with W + s B A."""
    import copy

    model = copy.deepcopy(base)
    manager = LoraManager(model, LoraConfig(max_loras_per_batch=3, max_lora_rank=8),
                          [read_adapter(folders[n], TINY, name=n) for n in folders if n != name]
                          + [read_adapter(folders[name], TINY, name=name)])  # fmt: skip
    ids = list(range(3, 40))
    uid = manager.resolve(name)
    plan = manager.prepare([uid], [len(ids)])
    got = _forward(model, ids, LoraBatch.from_plan(plan, torch.device("cpu"), False), manager)
    want = _forward(merged(base, folders[name]), ids)
    plain = _forward(base, ids)
    # fp32 rounding of W x + s B (A x) against (W + s B A) x, through two layers of std-0.3
    # weights (in float64 the two agree to the last fp32 bit)
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, atol=5e-5 * scale, rtol=0)
    assert (want - plain).abs().max() > 0.01 * scale  # the adapter does change the output
    torch.testing.assert_close(_forward(model, ids, None, manager), plain, atol=0, rtol=0)


def _engine(model, adapters, slots=4, **kw):
    return launch_engine(
        model,
        None,
        eos_token_ids=(2,),
        max_total_tokens=4000,
        lora=LoraConfig(max_loras_per_batch=slots, max_lora_rank=8),
        lora_adapters=adapters,
        **kw,
    )


def _run(engine, prompts, loras, params=GREEDY):
    handles = [engine.submit(EngineRequest(tuple(p), params, lora=name), stream=False)
               for p, name in zip(prompts, loras)]  # fmt: skip
    return [h.result() for h in handles]


@pytest.mark.parametrize("slots", [4, 2])
def test_mixed_batch_gives_each_request_its_own_output(base, folders, slots):
    """Requests under 4 adapters and the base model, submitted together (one batch; with 2
    slots, adapters take turns and are paged LRU), each get what they get alone and what the
    merged model gives."""
    import copy

    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 40000, size=int(n)).tolist() for n in rng.integers(5, 60, 10)]
    names = ["all4", None, "qv8", "mlp2", "o6", "all4", None, "qv8", "mlp2", "o6"]
    model = copy.deepcopy(base)
    adapters = [read_adapter(folders[n], TINY, name=n) for n in folders]
    engine = _engine(model, adapters, slots=slots)
    try:
        together = [r.token_ids for r in _run(engine, prompts, names)]
        alone = [_run(engine, [p], [n])[0].token_ids for p, n in zip(prompts, names)]
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert together == alone
    if slots == 2:
        assert stats["lora_swaps"] > 4  # adapters were paged in and out
    refs = {}
    for p, n, got in zip(prompts, names, together):
        if n not in refs:
            ref = base if n is None else merged(base, folders[n])
            refs[n] = launch_engine(ref, None, eos_token_ids=(2,), max_total_tokens=4000)
        assert _run(refs[n], [p], [None])[0].token_ids == got, n
    for e in refs.values():
        e.shutdown()
    assert len(set(together)) == len(together)


def test_scheduler_runs_at_most_max_loras_adapters(base, folders):
    """With 2 slots, no step runs requests of 3 adapters; every request still finishes."""
    import copy

    model = copy.deepcopy(base)
    adapters = [read_adapter(folders[n], TINY, name=n) for n in ("all4", "qv8", "mlp2")]
    engine = _engine(model, adapters, slots=2, engine_config=None)
    seen = []
    prepare = engine.runner.lora.prepare

    def spy(uids, *a, **k):
        seen.append({u for u in uids if u})
        return prepare(uids, *a, **k)

    engine.runner.lora.prepare = spy
    try:
        out = _run(engine, [[5, 6, 7]] * 6, ["all4", "qv8", "mlp2", "all4", "qv8", "mlp2"])
    finally:
        engine.shutdown()
    assert all(len(r.token_ids) == 10 for r in out)
    assert max(len(s) for s in seen) == 2


def test_radix_cache_never_shares_prefixes_across_adapters(base, folders):
    import copy

    model = copy.deepcopy(base)
    adapters = [read_adapter(folders[n], TINY, name=n) for n in ("all4", "qv8")]
    engine = _engine(model, adapters)
    prompt = list(range(100, 160))
    try:
        first = _run(engine, [prompt], ["all4"])[0]
        assert first.cached_tokens == 0
        assert _run(engine, [prompt], ["qv8"])[0].cached_tokens == 0
        assert _run(engine, [prompt], [None])[0].cached_tokens == 0
        again = _run(engine, [prompt], ["all4"])[0]
        assert again.cached_tokens >= 50 and again.token_ids == first.token_ids
        assert _run(engine, [prompt], [None])[0].cached_tokens >= 50
        # unloaded and loaded again under the same name: another adapter, nothing reused
        engine.unload_lora_adapter("all4")
        engine.load_lora_adapter("all4", str(folders["mlp2"]))
        reloaded = _run(engine, [prompt], ["all4"])[0]
        assert reloaded.cached_tokens == 0 and reloaded.token_ids != first.token_ids
        engine.check_integrity()
    finally:
        engine.shutdown()


def test_prefix_key_separates_adapters():
    base = Req("a", [5, 6, 7], GREEDY)
    under = Req("b", [5, 6, 7], GREEDY, lora_id=3)
    assert base.prefix_key(3) == [5, 6, 7]
    assert under.prefix_key(3)[1:] == [6, 7] and under.prefix_key(3)[0] != 5
    assert under.prefix_key(3)[0] != Req("c", [5], GREEDY, lora_id=4).prefix_key(1)[0]
    assert under.token_ids == [5, 6, 7]  # a copy


def test_bad_adapters_leave_the_others_serving(base, folders, tmp_path):
    import copy

    model = copy.deepcopy(base)
    engine = _engine(model, [read_adapter(folders["all4"], TINY, name="all4")])
    try:
        before = _run(engine, [[9, 8, 7]], ["all4"])[0].token_ids
        bad = _corrupt(tmp_path, "bad")
        _edit_config(bad, use_dora=True)
        with pytest.raises(LoraError, match="use_dora"):
            engine.load_lora_adapter("bad", str(bad))
        big = write_adapter(tmp_path / "big", TINY, rank=16)
        with pytest.raises(LoraError, match="max_lora_rank"):
            engine.load_lora_adapter("big", str(big))
        with pytest.raises(LoraError, match="already loaded"):
            engine.load_lora_adapter("all4", str(folders["qv8"]))
        with pytest.raises(LoraError, match="no LoRA adapter named 'nope'") as info:
            _run(engine, [[9, 8, 7]], ["nope"])
        assert info.value.unknown
        with pytest.raises(LoraError, match="no LoRA adapter named"):
            engine.unload_lora_adapter("nope")
        assert [a["name"] for a in engine.lora_adapters()] == ["all4"]
        assert _run(engine, [[9, 8, 7]], ["all4"])[0].token_ids == before
        engine.load_lora_adapter("qv8", str(folders["qv8"]))
        assert {a["name"] for a in engine.lora_adapters()} == {"all4", "qv8"}
    finally:
        engine.shutdown()


def test_targets_outside_the_pool_are_refused(base, folders):
    import copy

    model = copy.deepcopy(base)
    engine = launch_engine(model, None, eos_token_ids=(2,), max_total_tokens=2000,
                           lora=LoraConfig(lora_target_modules=("q_proj", "v_proj")))  # fmt: skip
    try:
        with pytest.raises(LoraError, match="lora_target_modules"):
            engine.load_lora_adapter("all4", str(folders["all4"]))
        engine.load_lora_adapter("qv8", str(folders["qv8"]))
        assert _run(engine, [[4, 5]], ["qv8"])[0].token_ids
    finally:
        engine.shutdown()


def test_unload_while_running_finishes_the_request(base, folders):
    """An adapter unloaded while a request uses it: that request finishes with it, new ones
    are refused, and its slot is freed afterwards."""
    import copy

    model = copy.deepcopy(base)
    engine = _engine(model, [read_adapter(folders["all4"], TINY, name="all4")])
    try:
        want = _run(engine, [[3, 4, 5]], ["all4"], SP(max_tokens=40, temperature=0,
                                                      ignore_eos=True))[0].token_ids  # fmt: skip
        h = engine.submit(EngineRequest((3, 4, 5), SP(max_tokens=40, temperature=0,
                                                      ignore_eos=True), lora="all4"))  # fmt: skip
        next(iter(h.pieces()), None)
        engine.unload_lora_adapter("all4")
        assert h.result().token_ids == want
        with pytest.raises(LoraError):
            _run(engine, [[3]], ["all4"])
        assert engine.call(lambda: engine.runner.lora.retired) == frozenset()
        assert engine.stats()["lora_resident"] == 0
    finally:
        engine.shutdown()


def test_speculative_decoding_verifies_under_each_adapter(folders):
    """n-gram drafts verified by the target under each request's adapter: the greedy tokens
    of a mixed batch are those without speculation (drafts were proposed and accepted)."""
    import copy

    from lmprog.runtime.speculative import SpeculativeConfig

    repeats = random_llama(TINY, 0.1, seed=3)  # std 0.1: it repeats, so n-grams hit
    names = ["all4", None, "qv8", "all4"]
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9], [4] * 12, [3, 4] * 6]
    params = SP(max_tokens=24, temperature=0, ignore_eos=True)
    outs, stats = [], []
    for spec in (None, SpeculativeConfig(method="ngram", num_tokens=4, adaptive=False)):
        adapters = [read_adapter(folders[n], TINY, name=n) for n in ("all4", "qv8")]
        engine = _engine(copy.deepcopy(repeats), adapters, speculative=spec)
        try:
            outs.append([r.token_ids for r in _run(engine, prompts, names, params)])
            stats.append(engine.stats())
        finally:
            engine.shutdown()
    assert outs[0] == outs[1]
    assert stats[1]["spec_accepted_tokens"] > 0, stats[1]


def test_engine_without_lora_refuses_adapter_requests(base):
    engine = launch_engine(base, None, eos_token_ids=(2,), max_total_tokens=2000)
    try:
        with pytest.raises(LoraError, match="serves no LoRA adapters"):
            _run(engine, [[1, 2]], ["x"])
        assert engine.lora_adapters() == []
    finally:
        engine.shutdown()
