"""How far bf16 rounding alone moves the LoRA graph test's model (issue 37): the scenario of
tests/runtime/test_lora_triton.py (tiny sharp Llama, 3 adapters, a prefill of 8 rows, decode
steps of 3, 8, 5, 1, 8, 2 rows) on the CPU, twice on two KV caches: one side rounds the LoRA
add once (y + B(Ax) in fp32, as the Triton expand kernel does), the other twice (B(Ax) to the
dtype, then the sum: the PyTorch path). Same algorithm otherwise. Prints, per step, the
largest logit difference over the logits' scale, for bf16 and fp32, three adapter/weight
scales and three seeds.

    python3 bench/lora_bf16_rounding.py      # about a minute on one CPU thread
"""

import sys

import torch

sys.path.insert(
    0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tests" / "runtime")
)
import pathlib
import tempfile

import numpy as np
from lora_testing import write_adapter

from lmprog.runtime.config import LoraConfig
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.lora import LoraManager, read_adapter
from lmprog.runtime.lora import layers as llayers
from lmprog.runtime.lora import ops as lops
from lmprog.runtime.lora.ops import LoraBatch
from lmprog.runtime.models import ModelConfig, load_model

torch.set_num_threads(1)
orig = lops.lora_delta_ref


def fused(x, y, a, b, slices, segments):  # one rounding of y + delta, as the kernel
    rank = b.shape[2]
    bounds = np.cumsum([0, *slices]).tolist()
    for slot, rows in segments:
        u = (x.index_select(0, rows).float() @ a[slot].float().T).to(x.dtype).float()
        parts = [
            u[:, j * rank : (j + 1) * rank] @ b[slot, bounds[j] : bounds[j + 1]].float().T
            for j in range(len(slices))
        ]
        d = torch.cat(parts, 1)
        y[rows] = (y[rows].float() + d).to(y.dtype)
    return y


def run(dtype, std, mul, seed=0):
    cfg = ModelConfig(
        "llama",
        vocab_size=50,
        hidden_size=32,
        intermediate_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position=128,
    )
    model = load_model(
        cfg, load_format="dummy", seed=3, device="cpu", dtype=dtype, attention="torch"
    )
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(mul)
    tmp = pathlib.Path(tempfile.mkdtemp())
    specs = [
        ("a", 4, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
        ("b", 8, ("q_proj", "v_proj")),
        ("c", 2, ("o_proj", "down_proj")),
    ]
    adapters = [
        read_adapter(write_adapter(tmp / n, cfg, rank=r, targets=t, seed=i, std=std), cfg, name=n)
        for i, (n, r, t) in enumerate(specs)
    ]
    manager = LoraManager(model, LoraConfig(max_loras_per_batch=3), adapters)
    g = torch.Generator().manual_seed(seed)
    rows = 8
    slots = (torch.randperm(600, generator=g)[: rows * 64] + 1).int()
    table = slots.view(rows, 64)
    kvs = [KVPool.for_model(cfg, 600, model.dtype, "cpu") for _ in range(2)]
    uid_of_row = [
        manager.resolve(n) if n else 0 for n in ("a", None, "b", "c", "a", "b", None, "c")
    ]
    lens = torch.randint(3, 30, (rows,), generator=g).tolist()

    def batch(sel, ext):
        loc = torch.cat([table[r, lens[r] - n : lens[r]] for r, n in zip(sel, ext)])
        return ForwardBatch.build(
            input_ids=torch.randint(0, 50, (len(loc),), generator=g),
            out_cache_loc=loc,
            req_pool_indices=sel,
            seq_lens=[lens[r] for r in sel],
            extend_lens=ext,
            req_to_token=table,
        )

    def fwd(fb, kv, uids, fn):
        plan = manager.prepare(uids, fb.extend_lens.tolist())
        manager.context.batch = (
            None if plan is None else LoraBatch.from_plan(plan, torch.device("cpu"), False)
        )
        llayers.lora_delta_ref = fn
        try:
            return model(fb, kv).float()
        finally:
            manager.context.batch = None
            llayers.lora_delta_ref = orig

    out = []
    with torch.inference_mode():
        pf = batch(list(range(rows)), list(lens))
        uids = [uid_of_row[r] for r in range(rows)]
        a, b = fwd(pf, kvs[0], uids, fused), fwd(pf, kvs[1], uids, orig)
        out.append(("prefill", (a - b).abs().max().item() / b.abs().max().item()))
        for n in (3, 8, 5, 1, 8, 2):
            sel = torch.randperm(rows, generator=g)[:n].tolist()
            for r in sel:
                lens[r] += 1
            st = batch(sel, [1] * n)
            uids = [uid_of_row[r] for r in sel]
            a, b = fwd(st, kvs[0], uids, fused), fwd(st, kvs[1], uids, orig)
            out.append((n, (a - b).abs().max().item() / b.abs().max().item()))
    return out


for dtype in ("bfloat16", "float32"):
    for std, mul in ((1.0, 10), (0.3, 10), (1.0, 1)):
        for seed in (0, 1, 2):
            r = run(dtype, std, mul, seed)
            print(
                dtype,
                "std",
                std,
                "x",
                mul,
                "seed",
                seed,
                " ".join(f"{k}:{v:.3g}" for k, v in r),
                flush=True,
            )
