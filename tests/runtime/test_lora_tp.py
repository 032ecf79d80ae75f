"""LoRA adapters under tensor parallelism, sharded as the layers they wrap: each rank's
adapter pool holds all of A and its rows of B for the column-parallel q/k/v and gate/up, its
columns of A and all of B for the row-parallel o and down (whose partial B A_r x_r joins
the base's partial sums before the all-reduce). Each rank's sharded model (load_shard, the
workers' loader) runs a batch mixing two adapters and the base; the gathered logits equal
the single-process model's. The ranks run on threads of this process over an in-process
all-reduce / all-gather (the sum the gloo or NCCL group computes)."""

from __future__ import annotations

import threading

import pytest
import torch
from lora_testing import write_adapter

from lmprog.runtime.assemble import assemble_model
from lmprog.runtime.config import LoraConfig
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.lora import LoraManager, read_adapter
from lmprog.runtime.lora.ops import LoraBatch
from lmprog.runtime.models import ModelConfig
from lmprog.runtime.models.config import local_config
from lmprog.runtime.parallel import ShardPlan
from lmprog.runtime.parallel.load import load_shard

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
