"""LoRA adapters under tensor parallelism, sharded as the layers they wrap: each rank's
adapter pool holds all of A and its rows of B for the column-parallel q/k/v and gate/up, its
columns of A and all of B for the row-parallel o and down (whose partial B A_r x_r joins
the base's partial sums before the all-reduce). Each rank's sharded model (load_shard, the
workers' loader) runs a batch mixing two adapters and the base; the gathered logits equal
the single-process model's. The ranks run on threads of this process over an in-process
all-reduce / all-gather (the sum the gloo or NCCL group computes).

Then the engine at tp_size=2 on the CPU (gloo, rank 1 a spawned worker): the adapters given
at start and loaded while it serves reach the worker with the steps, every step's slots are
rank 0's (more adapters than slots: paged in and out on both ranks alike), and each request
gets tp_size=1's greedy tokens and logprobs; an unknown adapter fails its request alone,
an adapter unloaded under a running request lets it finish."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from lora_testing import write_adapter
from tp_testing import assert_same, leftover_workers, write_tiny

from lmprog.core.errors import LoraError
from lmprog.core.sampling import SamplingParams as SP
from lmprog.runtime.assemble import assemble_model
from lmprog.runtime.config import LoraConfig
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.lora import LoraManager, read_adapter
from lmprog.runtime.lora.ops import LoraBatch
from lmprog.runtime.models import ModelConfig, config_from_hf
from lmprog.runtime.models.config import local_config
from lmprog.runtime.parallel import ShardPlan
from lmprog.runtime.parallel.load import load_shard
from lmprog.runtime.parallel.start import start_tensor_parallel

CONFIG = ModelConfig("llama", 101, 64, 96, 2, 4, 2, 16, 512)
PROMPTS = ([3, 17, 29, 5, 41, 8, 11], [7, 7, 60, 2, 90], [12, 44, 3, 3, 19, 81])
ADAPTERS = ("all", None, "qv_down")


class _Threads:
    """The collectives of `world` ranks run on threads: each call waits for every rank."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._barrier = threading.Barrier(world, timeout=60)
        self._parts: list = [None] * world

    def member(self, rank: int):
        threads = self

        class Member:
            def __init__(self) -> None:
                self.rank, self.world = rank, threads.world

            def all_reduce(self, t):
                return threads._gather(rank, t).sum(0)

            def all_gather(self, t):
                return threads._gather(rank, t)

        return Member()

    def _gather(self, rank, t):
        self._parts[rank] = t
        self._barrier.wait()
        out = torch.stack(self._parts)
        self._barrier.wait()
        return out


def _forward(model, manager, names):
    """Prefill logits of every prompt's last token, each under its adapter (or none)."""
    lens = [len(p) for p in PROMPTS]
    kv = KVPool.for_model(local_config(model), 64, torch.float32, torch.device("cpu"))
    table = torch.zeros(len(PROMPTS), 16, dtype=torch.int32)
    slots, at = [], 1
    for row, n in enumerate(lens):
        table[row, :n] = torch.arange(at, at + n)
        slots += range(at, at + n)
        at += n
    fb = ForwardBatch.build(input_ids=[t for p in PROMPTS for t in p], out_cache_loc=slots,
                            req_pool_indices=range(len(PROMPTS)), seq_lens=lens,
                            extend_lens=lens, req_to_token=table)  # fmt: skip
    plan = manager.prepare([manager.resolve(n) for n in names], lens)
    if plan is not None:
        manager.context.batch = LoraBatch.from_plan(plan, torch.device("cpu"), triton=False)
    try:
        with torch.inference_mode():
            return model(fb, kv)
    finally:
        manager.context.batch = None


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_tp")
    return {
        "all": write_adapter(root / "all", CONFIG, rank=4, std=0.3, seed=1),
        "qv_down": write_adapter(
            root / "qv_down",
            CONFIG,
            rank=8,
            std=0.3,
            seed=2,
            targets=("q_proj", "v_proj", "down_proj"),
        ),  # fmt: skip
    }


def _manager(model, folders, shard=None):
    adapters = [read_adapter(folders[n], CONFIG, name=n) for n in ("all", "qv_down")]
    return LoraManager(model, LoraConfig(max_loras_per_batch=2), adapters, shard=shard)


@pytest.mark.parametrize("world", [2, 4])  # 4: the 2 KV heads replicated over the ranks
def test_sharded_adapters_match_one_process(folders, world):
    torch.set_num_threads(1)
    whole = assemble_model(CONFIG, load_format="dummy", device="cpu", seed=5)
    with torch.no_grad():
        for p in whole.parameters():
            p.mul_(15)  # std 0.3 weights, as dummy loading gives each rank below
    want = _forward(whole, _manager(whole, folders), ADAPTERS)
    plain = _forward(whole, _manager(whole, folders), (None, None, None))
    assert (want - plain).abs().max() > 0.1 * want.abs().max()  # the adapters matter
    group, got, errors = _Threads(world), [None] * world, []

    def rank_run(rank: int) -> None:
        try:
            torch.set_num_threads(1)
            shard = load_shard(CONFIG, group.member(rank), device=torch.device("cpu"),
                               load_format="dummy", seed=5)  # fmt: skip
            with torch.no_grad():
                for p in shard.parameters():
                    p.mul_(15)
            manager = _manager(shard, folders, ShardPlan(CONFIG, rank, world))
            got[rank] = _forward(shard, manager, ADAPTERS)
        except BaseException as exc:  # re-raised on the test thread
            errors.append(exc)
            group._barrier.abort()

    threads = [threading.Thread(target=rank_run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for rank in range(world):
        torch.testing.assert_close(got[rank], want, rtol=1e-4, atol=1e-4 * want.abs().max())


# ---- the engine at tp_size=2 ------------------------------------------------------------------

HEAD = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26]
# (prompt, adapter): 3 adapters and the base over a pool of 2 slots
REQUESTS = [
    (HEAD + [1, 2], "a"),
    (HEAD + [1, 2], None),
    (HEAD + [1, 2], "b"),
    ([5, 6, 7], "c"),
    (HEAD + [4, 5, 6], "a"),
    ([90, 91, 92, 93], "b"),
    ([90, 91, 92, 93], "c"),
    ([11, 12], None),
]
LONG = (HEAD + [7, 8], "a")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tp_testing's tiny Llama (4 query heads, 2 KV heads, vocabulary 101) and 3 adapters
    of different ranks and modules."""
    root = tmp_path_factory.mktemp("lora_tp_engine")
    folder = write_tiny(root / "model")
    config = config_from_hf(folder)
    adapters = {
        "a": write_adapter(root / "a", config, rank=4, std=0.3, seed=11),
        "b": write_adapter(
            root / "b",
            config,
            rank=8,
            std=0.3,
            seed=12,
            targets=("q_proj", "v_proj", "o_proj", "down_proj"),
        ),
        "c": write_adapter(
            root / "c", config, rank=2, std=0.4, seed=13, targets=("k_proj", "gate_proj", "up_proj")
        ),
    }
    return folder, adapters


def launch_lora(tiny, tp_size, names, *, overlap=False, device="cpu"):
    folder, paths = tiny
    build = {"model": str(folder), "dtype": "float32"}
    tp = start_tensor_parallel(tp_size, build, device=device) if tp_size > 1 else None
    net = assemble_model(**build, device=device, tp=tp)
    return launch_engine(
        net,
        None,
        eos_token_ids=(0,),
        max_total_tokens=2048,
        engine_config=EngineConfig(check_integrity=True, overlap=overlap),
        tp=tp,
        lora=LoraConfig(max_loras_per_batch=2, max_lora_rank=8, lora_target_modules="all"),
        lora_adapters=[read_adapter(paths[n], net.config, name=n) for n in names],
    )


def submit(engine, requests, max_tokens=8):
    params = SP(max_tokens=max_tokens, temperature=0, return_logprob=True, ignore_eos=True)
    return [engine.submit(EngineRequest(tuple(p), params, lora=n), stream=False)
            for p, n in requests]  # fmt: skip


def results(handles):
    return [h.result(timeout=120) for h in handles]


@pytest.fixture(scope="module")
def reference(tiny):
    """tp_size=1 with every adapter given at start: REQUESTS together, LONG alone."""
    engine = launch_lora(tiny, 1, ("a", "b", "c"))
    try:
        together = results(submit(engine, REQUESTS))
        long = results(submit(engine, [LONG], max_tokens=40))[0]
    finally:
        engine.shutdown()
    return together, long


def test_tp2_serves_each_adapter_as_tp1(tiny, reference):
    want, _ = reference
    assert len({tuple(r.token_ids) for r in want[:3]}) == 3  # a, base, b: the adapters matter
    engine = launch_lora(tiny, 2, ("a", "b"), overlap=True)  # "c" loaded while serving
    try:
        first = results(submit(engine, REQUESTS[:3]))
        engine.load_lora_adapter("c", str(tiny[1]["c"]))
        got = results(submit(engine, REQUESTS))
        again = results(submit(engine, REQUESTS))  # prefixes cached per adapter
        stats = engine.stats()
        engine.check_integrity()
    finally:
        engine.shutdown()
    assert_same(first, want[:3])
    assert_same(got, want)
    assert_same(again, want)
    assert stats["lora_swaps"] > 2  # 3 adapters through 2 slots: paged on both ranks
    assert any(r.cached_tokens for r in again)
    assert leftover_workers() == []


def test_tp2_bad_adapter_fails_alone_and_unload_under_a_running_request(tiny, reference):
    want, want_long = reference
    engine = launch_lora(tiny, 2, ("a",))
    try:
        (long,) = submit(engine, [LONG], max_tokens=40)
        deadline = time.monotonic() + 60
        while engine.stats()["generated_tokens"] < 3:  # it runs under "a" now
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.005)
        assert long.finished_at is None
        engine.unload_lora_adapter("a")  # it finishes under "a"
        assert engine.lora_adapters() == []
        (bad,) = submit(engine, [(HEAD, "nope")])
        with pytest.raises(LoraError, match="no LoRA adapter named 'nope'"):
            bad.result(timeout=60)
        assert_same([long.result(timeout=120)], [want_long])
        engine.load_lora_adapter("b", str(tiny[1]["b"]))
        engine.load_lora_adapter("a", str(tiny[1]["a"]))  # a new uid: nothing cached reused
        got = results(submit(engine, REQUESTS[:3] + REQUESTS[4:6]))
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert_same(got, want[:3] + want[4:6])
    assert stats["lora_adapters"] == 2
    assert leftover_workers() == []


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)
def test_tp2_on_two_gpus_serves_each_adapter_as_tp1(tiny):
    """NCCL, and the decode graphs of both ranks captured with their adapter pools (fp32)."""
    one = launch_lora(tiny, 1, ("a", "b", "c"), device="cuda")
    try:
        want = results(submit(one, REQUESTS))
    finally:
        one.shutdown()
    two = launch_lora(tiny, 2, ("a", "b"), overlap=True, device="cuda")
    try:
        assert two.runner.graphs is not None and two.runner.graphs.lora_buffers is not None
        two.load_lora_adapter("c", str(tiny[1]["c"]))
        got = results(submit(two, REQUESTS))
    finally:
        two.shutdown()
    assert_same(got, want)
    assert leftover_workers() == []
