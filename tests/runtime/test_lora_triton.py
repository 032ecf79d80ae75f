"""LoRA inside a whole model on the Triton path (a GPU, or the CPU interpreter): the
kernels' forward equals the PyTorch path's, and decode CUDA graphs with adapters (their
static layout, padding and stale blocks) equal the eager forward, batch after batch."""

from __future__ import annotations

import pytest
import torch
from lora_testing import write_adapter
from triton_testing import (  # noqa: F401 - one_thread is a fixture
    one_thread,
    requires_triton,
    run_captured,
    run_uncaptured,
    setup,
)

from lmprog.runtime.config import LoraConfig
from lmprog.runtime.executor.cuda_graph import CudaGraphRunner
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.lora import LoraManager, read_adapter
from lmprog.runtime.lora.ops import LoraBatch

pytestmark = requires_triton


def _manager(model, tmp_path, slots=3):
    cfg = model.config
    specs = [("a", 4, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                       "down_proj")), ("b", 8, ("q_proj", "v_proj")),
             ("c", 2, ("o_proj", "down_proj"))]  # fmt: skip
    adapters = []
    for i, (name, rank, targets) in enumerate(specs):
        folder = write_adapter(tmp_path / name, cfg, rank=rank, targets=targets, seed=i, std=1.0)
        adapters.append(read_adapter(folder, cfg, name=name))
    return LoraManager(model, LoraConfig(max_loras_per_batch=slots), adapters)


def _forward(model, manager, fb, kv, uids, triton):
    plan = manager.prepare(uids, fb.extend_lens.tolist())
    manager.context.batch = (
        None if plan is None else LoraBatch.from_plan(plan, kv.k[0].device, triton)
    )
    try:
        return model(fb, kv)
    finally:
        manager.context.batch = None


def check_lora_graphs(device, capture, dtype, tol, tmp_path):
    model, g, table, kvs = setup(device, dtype, num_layers=2, rows=8, num_slots=600)
    manager = _manager(model, tmp_path)
    rows = table.shape[0]
    uid_of_row = [
        manager.resolve(n) if n else 0 for n in ("a", None, "b", "c", "a", "b", None, "c")
    ]
    lens = torch.randint(3, 30, (rows,), generator=g).tolist()

    def batch(sel, ext):
        loc = torch.cat([table[r, lens[r] - n : lens[r]].cpu() for r, n in zip(sel, ext)])
        return ForwardBatch.build(
            input_ids=torch.randint(0, 50, (len(loc),), generator=g),
            out_cache_loc=loc,
            req_pool_indices=sel,
            seq_lens=[lens[r] for r in sel],
            extend_lens=ext,
            req_to_token=table,
            device=device,
        )

    with torch.inference_mode():
        prefill = batch(list(range(rows)), list(lens))
        uids = [uid_of_row[r] for r in range(rows)]
        got = _forward(model, manager, prefill, kvs[0], uids, triton=True)
        want = _forward(model, manager, prefill, kvs[1], uids, triton=False)
        assert (got - want).abs().max().item() <= tol * want.abs().max().item()
        graphs = CudaGraphRunner(model, kvs[0], table, batch_sizes=(1, 4, 8), capture=capture,
                                 lora=manager)  # fmt: skip
        for n in (3, 8, 5, 1, 8, 2):
            sel = torch.randperm(rows, generator=g)[:n].tolist()
            for r in sel:
                lens[r] += 1
            step = batch(sel, [1] * n)
            uids = [uid_of_row[r] for r in sel]
            plan = manager.prepare(uids, [1] * n, block_m=16)
            got = graphs.maybe_run(step, kvs[0], lora=plan)
            if plan is None:
                got = graphs.maybe_run(step, kvs[0])
            want = _forward(model, manager, step, kvs[1], uids, triton=False)
            assert got is not None and got.shape == want.shape
            diff, scale = (got - want).abs().max().item(), want.abs().max().item()
            assert diff <= tol * scale, (n, diff, scale)


def test_lora_graph_layout_runs_uncaptured(one_thread, tmp_path):
    run_uncaptured(lambda *args: check_lora_graphs(*args, tmp_path))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
@pytest.mark.parametrize(
    "dtype",
    [
        "float32",
        pytest.param(
            "bfloat16",
            marks=pytest.mark.xfail(
                strict=True,
                reason="open bug: on an H100 (2026-12-07) the bf16 LoRA decode graph of a full "
                "bucket (8 rows, 3 adapters) gave logits 20.9 apart at a scale of 36.3 from the "
                "PyTorch path (fp32 and the eager bf16 prefill agree); bf16 LoRA steps now run "
                "eagerly (CudaGraphRunner keeps LoRA graphs to fp32), so maybe_run declines",
            ),
        ),
    ],
)
def test_lora_graphs_replay(dtype, one_thread, tmp_path):
    run_captured(lambda *args: check_lora_graphs(*args, tmp_path), dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_engine_on_gpu_matches_merged_models(tmp_path):
    """The engine on a GPU (Triton kernels, decode graphs with adapters, overlap scheduling,
    piecewise graphs for the base steps): a batch mixing 3 adapters and the base gives the
    greedy tokens of each merged model (fp32; TF32 matrix units round the two paths apart,
    so a rare near-tie may flip a late token: all first tokens and 6 of 8 whole outputs)."""
    import copy

    from engine_testing import TINY, random_llama
    from lora_testing import merged

    from lmprog.core.sampling import SamplingParams
    from lmprog.runtime.engine.io import EngineRequest
    from lmprog.runtime.engine.launch import launch_engine

    model = random_llama(TINY, 0.3, device="cuda", attention="triton")
    names = ("a", "b", "c")
    folders = {n: write_adapter(tmp_path / n, TINY, rank=4 + 2 * i, seed=i)
               for i, n in enumerate(names)}  # fmt: skip
    adapters = [read_adapter(folders[n], TINY, name=n) for n in names]
    engine = launch_engine(copy.deepcopy(model), None, eos_token_ids=(2,), max_total_tokens=4000,
                           lora=LoraConfig(max_loras_per_batch=3), lora_adapters=adapters)  # fmt: skip
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [[3 + i, 7, 11 + i, 5] * (i + 1) for i in range(8)]
    loras = ["a", None, "b", "c", "a", None, "c", "b"]
    try:
        handles = [engine.submit(EngineRequest(tuple(p), params, lora=n), stream=False)
                   for p, n in zip(prompts, loras)]  # fmt: skip
        got = [h.result().token_ids for h in handles]
    finally:
        engine.shutdown()
    same = 0
    for p, n, tokens in zip(prompts, loras, got):
        ref = launch_engine(merged(model, folders[n]) if n else model, None,
                            eos_token_ids=(2,), max_total_tokens=4000)  # fmt: skip
        try:
            want = ref.submit(EngineRequest(tuple(p), params), stream=False).result().token_ids
        finally:
            ref.shutdown()
        assert tokens[0] == want[0], n
        same += tokens == want
    assert same >= 6, same
