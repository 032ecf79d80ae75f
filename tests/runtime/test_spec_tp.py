"""Speculative decoding under tensor parallelism on the CPU (gloo, rank 1 a spawned worker):
token trees verified at tp_size=2 (each step's draft parents go to every rank, which builds
the masks; the accepted paths' KV copies follow, each rank moving its own heads) give
tp_size=1's and plain decoding's greedy outputs, for an oracle's trees (the true branch never
the first), n-gram trees and draft heads drafting trees from rank 0's captured hidden states
(replicated after the all-reduce: the drafts are tp_size=1's); an abort mid-tree leaves the
group serving. Then both ranks on threads of this process: after a tree verify whose accepted
path is its second branch, each rank's KV shard equals plain decoding's. On 2 CUDA GPUs (NCCL,
CUDA graphs): oracle and EAGLE trees at tp_size=2 equal tp_size=1."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from spec_testing import TreeOracle
from tp_testing import assert_same, leftover_workers, write_tiny

from lmprog.core.sampling import SamplingParams as SP
from lmprog.decoding.batch_sampler import BatchSampler
from lmprog.decoding.decode_state import DecodeState
from lmprog.runtime.assemble import assemble_model
from lmprog.runtime.config import CacheConfig, SchedulerConfig
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.engine.step_outputs import StepOutputs
from lmprog.runtime.executor.model_runner import ModelRunner
from lmprog.runtime.models import config_from_hf
from lmprog.runtime.parallel.channel import StepChannel
from lmprog.runtime.parallel.group import TPGroup
from lmprog.runtime.parallel.load import load_shard
from lmprog.runtime.parallel.start import start_tensor_parallel
from lmprog.runtime.request import Req, ReqOutputs
from lmprog.runtime.scheduler import Scheduler
from lmprog.runtime.speculative import SpeculativeConfig

# picked (from 60 random ones) for n-gram drafts the tiny model accepts: it loops after the
# first, the others repeat n-grams with several continuations (trees)
PROMPTS = [
    [79, 64, 43],
    [90, 70, 88, 51] * 3,
    [6, 74, 82, 69, 78, 88],
    [73, 22, 90, 87, 27, 99, 8, 87, 21, 21] * 2,
]
VOCAB = 101


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tp_testing's tiny Llama: 4 query heads, 2 KV heads (one per rank), vocabulary 101."""
    return write_tiny(tmp_path_factory.mktemp("spec_tp"))


def launch(folder, tp_size, spec=None, proposer=None, device="cpu"):
    build = {"model": str(folder), "dtype": "float32"}
    tp = start_tensor_parallel(tp_size, build, device=device) if tp_size > 1 else None
    net = assemble_model(**build, device=device, tp=tp)
    return launch_engine(
        net,
        None,
        eos_token_ids=(0,),
        max_total_tokens=2048,
        engine_config=EngineConfig(check_integrity=True),
        speculative=spec,
        proposer=proposer,
        tp=tp,
    )


def run(engine, prompts, max_tokens=20):
    params = SP(max_tokens=max_tokens, temperature=0, return_logprob=True, ignore_eos=True)
    handles = [engine.submit(EngineRequest(tuple(p), params), stream=False) for p in prompts]
    return [h.result(timeout=120) for h in handles]


@pytest.fixture(scope="module")
def plain(tiny):
    """tp_size=1 without speculation: PROMPTS, and a long continuation of the first."""
    engine = launch(tiny, 1)
    try:
        yield run(engine, PROMPTS), run(engine, PROMPTS[:1], max_tokens=100)[0]
    finally:
        engine.shutdown()


def test_oracle_trees_at_tp2_give_plain_outputs_and_abort_mid_tree(tiny, plain):
    want, long = plain
    oracle = TreeOracle(VOCAB)
    oracle.learn(PROMPTS, want)
    oracle.learn(PROMPTS[:1], [long])
    engine = launch(tiny, 2, SpeculativeConfig(num_tokens=6, adaptive=False), oracle)
    try:
        got = run(engine, PROMPTS)
        stats = engine.stats()
        assert stats["spec_tree_verifies"] > 5 and stats["spec_accepted_tokens"] > 30, stats
        # abort mid-tree: a long request stopped after its first trees
        params = SP(max_tokens=100, temperature=0, ignore_eos=True)
        handle = engine.submit(EngineRequest(tuple(PROMPTS[0]), params))
        deadline = time.monotonic() + 60
        while engine.stats()["generated_tokens"] < stats["generated_tokens"] + 10:
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.002)
        handle.abort()
        assert handle.result(timeout=60).finish_reason == "abort"
        again = run(engine, PROMPTS)  # both ranks still in step (their prefixes cached)
        engine.check_integrity()
        after = engine.stats()
    finally:
        engine.shutdown()
    assert_same(got, want)
    assert_same(again, want)
    assert after["num_running"] == after["num_waiting"] == 0
    assert after["kv_used"] == after["kv_evictable"]
    assert leftover_workers() == []


class Recorder:
    """Keeps every proposal the engine's proposer makes: context -> (drafts, parents)."""

    def __init__(self, proposer) -> None:
        self.inner, self.seen = proposer.propose, {}
        proposer.propose = self

    def __call__(self, inputs):
        out = self.inner(inputs)
        for inp, prop in zip(inputs, out):
            self.seen[tuple(inp.token_ids)] = (tuple(prop.token_ids), prop.parents)
        return out


TREE_SPECS = {
    "ngram": dict(method="ngram", ngram_min=1, ngram_max=3, ngram_branches=3, num_tokens=6),
    "eagle": dict(method="eagle", draft_load_format="dummy", tree_width=2, num_tokens=4),
    "medusa": dict(method="medusa", draft_load_format="dummy", tree_width=2, num_tokens=4),
}


@pytest.mark.parametrize("name", list(TREE_SPECS))
def test_tree_proposers_at_tp2_equal_tp1(tiny, plain, name):
    """Greedy outputs equal plain decoding's at both sizes, and the proposer drafts the same
    trees at tp_size=2 as at tp_size=1 (a head reads rank 0's captured states)."""
    want, _ = plain
    spec = SpeculativeConfig(**TREE_SPECS[name], adaptive=False)
    outputs, drafts, stats = [], [], []
    for tp_size in (1, 2):
        engine = launch(tiny, tp_size, spec)
        try:
            recorder = Recorder(engine.speculator.proposer)
            outputs.append(run(engine, PROMPTS))
            stats.append(engine.stats())
            engine.check_integrity()
        finally:
            engine.shutdown()
        drafts.append(recorder.seen)
    assert_same(outputs[0], want)
    assert_same(outputs[1], outputs[0])
    assert stats[1]["spec_tree_verifies"] > 3, stats[1]
    if name == "ngram":
        assert stats[1]["spec_accepted_tokens"] > 10, stats[1]
    trees = [d for d in drafts[1].values() if d[1] is not None]
    assert len(trees) > 3 and drafts[1] == drafts[0]
    assert leftover_workers() == []


# ---- each rank's KV after a tree's accepted path -----------------------------------------
def _req(prompt):
    req = Req("a", prompt, SP(max_tokens=20, temperature=0.0, ignore_eos=True))
    req.engine_data = DecodeState(req.params, tokenizer=None, prompt_ids=prompt,
                                  eos_token_ids=(0,), vocab_size=VOCAB, token_text=str,
                                  outputs=ReqOutputs(req))  # fmt: skip
    return req


def _step(scheduler, runner, out):
    batch = scheduler.schedule()
    res = out.process(batch, runner.forward(batch))
    scheduler.process_results(batch, res.reasons)
    moves = scheduler.take_kv_moves()
    if moves is not None:
        runner.copy_kv(moves)
    return batch, res


def _scheduler():
    return Scheduler(256, 128, SchedulerConfig(max_num_batched_tokens=64), CacheConfig())


def _rank_zero(net, group, prompt, ref, got):
    """rank 0: the prefill, then one tree whose accepted path is its second branch."""
    s = _scheduler()
    runner = ModelRunner(net, 256, s.req_to_token, cuda_graphs=False, channel=StepChannel(group))
    out, req = StepOutputs(BatchSampler((0,))), _req(prompt)
    s.submit(req)
    try:
        _step(s, runner, out)
        t1, t2, t3 = ref[1:4]
        w = (t1 + 1) % VOCAB
        req.draft_ids = [w, (w + 1) % VOCAB, t1, (t2 + 1) % VOCAB, t2, t3]
        req.draft_parents = (-1, 0, -1, 2, 2, 4)
        batch, res = _step(s, runner, out)
        assert batch.entries[0].draft_parents is not None
        assert res.accepted == [3] and list(res.tokens[0]) == ref[1:5]
        _step(s, runner, out)  # on from the moved KV
        got[0] = (runner.kv, s.req_to_token.copy(), (req.row, req.engine_data.output_ids[:6]))
    finally:
        runner.close()


def _worker(net, group, got):
    """rank 1: what lmprog.runtime.parallel.worker serves, on a table of its own."""
    table = np.zeros(_scheduler().req_to_token.shape, dtype=np.int32)
    runner = ModelRunner(net, 256, table, cuda_graphs=False)
    channel = StepChannel(group, kv_moves=runner.copy_kv)
    while (step := channel.recv(table)) is not None:
        runner.run(*step)
    got[1] = (runner.kv, table.copy(), None)
    group.close()


def test_accepted_path_kv_on_each_rank_equals_plain_decoding(tiny):
    torch.set_num_threads(1)
    config = config_from_hf(tiny)
    whole = assemble_model(str(tiny), dtype="float32", device="cpu")
    prompt = [5, 9, 13, 17, 21]
    s0 = _scheduler()
    r0 = ModelRunner(whole, 256, s0.req_to_token, cuda_graphs=False)
    out0, req0 = StepOutputs(BatchSampler((0,))), _req(prompt)
    s0.submit(req0)
    for _ in range(6):
        _step(s0, r0, out0)
    ref = req0.engine_data.output_ids
    n = len(prompt) + 5  # the prefill, the tree's 3 drafts and bonus token, one decode step
    assert req0.num_computed == n

    store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", store.port, 2, False)
    got, errors = [None, None], []

    def rank_run(rank):
        try:
            torch.set_num_threads(1)
            group = TPGroup((store, client)[rank], rank, 2, torch.device("cpu"), timeout_s=60,
                            hostname="127.0.0.1")  # fmt: skip
            net = load_shard(str(tiny), group, device=torch.device("cpu"), dtype="float32")
            if rank == 0:
                _rank_zero(net, group, prompt, ref, got)
            else:
                _worker(net, group, got)
        except BaseException as exc:  # re-raised on the test thread
            errors.append(exc)

    threads = [threading.Thread(target=rank_run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    row, outputs = got[0][2]
    assert outputs == ref[:6]
    slots0 = torch.from_numpy(s0.req_to_token[req0.row, :n].astype(np.int64))
    for rank, (kv, table, _) in enumerate(got):
        assert np.array_equal(table[row, :n], got[0][1][row, :n]), "the ranks' tables differ"
        slots = torch.from_numpy(table[row, :n].astype(np.int64))
        for layer in range(config.num_layers):  # rank r holds KV head r of 2
            for mine, whole_kv in ((kv.k, r0.kv.k), (kv.v, r0.kv.v)):
                torch.testing.assert_close(mine[layer][slots],
                                           whole_kv[layer][slots0][:, rank : rank + 1],
                                           atol=1e-4, rtol=1e-4)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)
@pytest.mark.parametrize("name", ["oracle", "eagle"])
def test_tp2_on_two_gpus_verifies_trees_as_tp1(tiny, name):
    """NCCL, each rank's table mirrored on its device, the decode and piecewise graphs (the
    EAGLE head's states captured on rank 0's): trees at tp_size=2 equal tp_size=1 (fp32)."""
    spec = SpeculativeConfig(**TREE_SPECS["eagle"], adaptive=False)
    if name == "oracle":
        spec = SpeculativeConfig(num_tokens=6, adaptive=False)
        plain = launch(tiny, 1, device="cuda")
        try:
            want = run(plain, PROMPTS)
        finally:
            plain.shutdown()
    outputs, stats = [], []
    for tp_size in (1, 2):
        oracle = None
        if name == "oracle":
            oracle = TreeOracle(VOCAB)
            oracle.learn(PROMPTS, want)
        engine = launch(tiny, tp_size, spec, oracle, device="cuda")
        try:
            outputs.append(run(engine, PROMPTS))
            stats.append(engine.stats())
        finally:
            engine.shutdown()
    assert_same(outputs[1], outputs[0])
    assert stats[1]["spec_tree_verifies"] > 3, stats[1]
    if name == "oracle":
        assert [r.token_ids for r in outputs[0]] == [r.token_ids for r in want]
        assert stats[1]["spec_accepted_tokens"] > 30, stats[1]
    assert leftover_workers() == []
