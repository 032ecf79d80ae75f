"""The Triton attention backend gives the reference backend's logits through a whole model.

On a CUDA machine it runs there; elsewhere under Triton's CPU interpreter (tests/conftest.py
sets it up).
"""

import torch
from triton_testing import ON_GPU, one_thread, requires_triton  # noqa: F401

from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.layers.attention import create_attention_backend
from lmprog.runtime.models import ModelConfig, load_model


def check_against_reference(device):
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
    model = load_model(cfg, load_format="dummy", seed=3, device=device, dtype="float32")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(10)  # sharp attention, so a wrong mask shows
    g = torch.Generator().manual_seed(0)
    slots = (torch.randperm(60, generator=g) + 1).int()
    r2t = torch.zeros(4, 64, dtype=torch.int32)
    r2t[0, :20], r2t[1, :7], r2t[2, :12] = slots[:20], slots[20:27], slots[27:39]
    steps = [  # (rows, seq_lens, extend_lens): prefill; hybrid chunk+prefills; decodes
        ([0], [16], [16]),
        ([1, 0, 2], [6, 19, 12], [6, 3, 12]),
        ([0, 1, 2], [20, 7, 12], [1, 1, 1]),
    ]
    logits = {}
    for name in ("torch", "triton"):
        model.attention = create_attention_backend(name, 4, 2, 16, device)
        kv = KVPool.for_model(cfg, 64, torch.float32, device)
        outs = []
        for rows, lens, ext in steps:
            loc = torch.cat([r2t[r, s - n : s] for r, s, n in zip(rows, lens, ext)])
            ids = (loc * 7 % 50).tolist()
            b = ForwardBatch.build(
                input_ids=ids,
                out_cache_loc=loc,
                req_pool_indices=rows,
                seq_lens=lens,
                extend_lens=ext,
                req_to_token=r2t,
                logits_indices=range(len(ids)),
                device=device,
            )
            with torch.inference_mode():
                outs.append(model(b, kv).cpu())
        logits[name] = torch.cat(outs)
    diff = (logits["torch"] - logits["triton"]).abs().max().item()
    # fp32 tl.dot runs in TF32 on a GPU (10-bit mantissa); exact fp32 in the interpreter
    rel = 2e-2 if device == "cuda" else 1e-4
    assert diff < rel * logits["torch"].abs().max().item(), diff


@requires_triton
def test_triton_backend_matches_reference_backend(one_thread):
    check_against_reference("cuda" if ON_GPU else "cpu")
