"""Hybrid attention kernels against the PyTorch reference (CPU interpreter or GPU)."""

from __future__ import annotations

import pytest
import torch
from attention_batches import make_batch, tree_mask
from kernel_helpers import DEVICE, DTYPES, ON_GPU, rel_err, requires_kernels, tolerance

pytest.importorskip("triton", reason="triton is not installed: pip install triton==3.9.0")
pytestmark = requires_kernels

from lmprog.runtime.kernels.attention import (  # noqa: E402
    decode_attention,
    extend_attention,
    hybrid_attention,
)
from lmprog.runtime.kernels.attention_plan import plan_attention  # noqa: E402
from lmprog.runtime.kernels.attention_ref import hybrid_attention_ref  # noqa: E402

HEAD_DIMS = [64, 128] if ON_GPU else [32]
HEADS = [(4, 4), (8, 2), (6, 2)]  # MHA, GQA group 4, GQA group 3 (not a power of two)
SCALE = 24 if ON_GPU else 1  # GPU runs the same batches with longer sequences
# (seq_len, extend_len): full prefill, decode, chunk over a cached prefix, short causal verify,
# a zero-token request, a second decode
HYBRID = [(37, 37), (50, 1), (64, 19), (20, 4), (9, 0), (3, 1)]


def _scaled(pairs):
    return [s * SCALE for s, _ in pairs], [e if e <= 4 else e * SCALE for _, e in pairs]


def _plan(batch, **kwargs):
    return plan_attention(*batch.tensors, num_q_heads=batch.q.shape[1],
                          num_kv_heads=batch.k_buffer.shape[1], head_dim=batch.q.shape[2],
                          **kwargs)  # fmt: skip


def _ref(batch, **kwargs):
    return hybrid_attention_ref(batch.q, batch.k_buffer, batch.v_buffer, *batch.tensors, **kwargs)


def _poisoned(q):
    return torch.full_like(q, float("nan"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_hybrid_batch_matches_reference(dtype, heads, head_dim):
    seq, ext = _scaled(HYBRID)
    batch = make_batch(seq, ext, *heads, head_dim, dtype, DEVICE)
    plan = _plan(batch, split_max_tokens=4, num_kv_splits=3)
    assert plan.extend is not None and plan.split is not None  # both launches run
    out = hybrid_attention(batch.q, batch.k_buffer, batch.v_buffer, plan, out=_poisoned(batch.q))
    assert rel_err(out, _ref(batch)) < tolerance(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_default_plan_and_sm_scale(dtype):
    seq, ext = _scaled(HYBRID)
    batch = make_batch(seq, ext, 8, 2, HEAD_DIMS[-1], dtype, DEVICE)
    plan = _plan(batch, seq_lens_cpu=seq, extend_lens_cpu=ext)
    out = hybrid_attention(batch.q, batch.k_buffer, batch.v_buffer, plan, sm_scale=0.3)
    assert rel_err(out, _ref(batch, sm_scale=0.3)) < tolerance(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_splits", [1, 3, 9])
def test_decode_split_kv(dtype, num_kv_splits):
    # 9 splits of the short rows leave some chunks empty: their merge weight must be 0.
    seq = [s * SCALE for s in (70, 1, 33, 128)]
    batch = make_batch(seq, [1] * len(seq), 8, 2, HEAD_DIMS[-1], dtype, DEVICE)
    out = decode_attention(batch.q, batch.k_buffer, batch.v_buffer, batch.req_to_token,
                           batch.req_pool_indices, batch.seq_lens, num_kv_splits=num_kv_splits,
                           out=_poisoned(batch.q))  # fmt: skip
    assert rel_err(out, _ref(batch)) < tolerance(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_extend_attention_handles_every_row(dtype):
    seq, ext = _scaled(HYBRID)
    batch = make_batch(seq, ext, 6, 2, HEAD_DIMS[0], dtype, DEVICE)
    out = extend_attention(batch.q, batch.k_buffer, batch.v_buffer, *batch.tensors)
    assert rel_err(out, _ref(batch)) < tolerance(dtype)


def _verify_batch(dtype, split_max_tokens):
    """Verify requests with tree masks beside a causal prefill (mask_indptr -1) and a decode."""
    gen = torch.Generator().manual_seed(1)
    # short verify prefixes, so that hiding a few of the new tokens changes the output well
    # beyond rounding; the long prefill and decode rows exercise the long-context paths
    seq = [40, 31, 17 * SCALE, 12 * SCALE]
    ext = [5, 6, 17 * SCALE, 1]
    batch = make_batch(seq, ext, 8, 2, HEAD_DIMS[0], dtype, DEVICE)
    blocks = [tree_mask(seq[0], 5, gen), tree_mask(seq[1], 6, gen),
              torch.ones(1, seq[3], dtype=torch.bool)]  # fmt: skip
    flat = torch.cat([m.flatten() for m in blocks]).to(DEVICE)
    indptr = torch.tensor([0, blocks[0].numel(), -1, blocks[0].numel() + blocks[1].numel()])
    plan = _plan(batch, custom_mask=flat, mask_indptr=indptr.to(DEVICE),
                 split_max_tokens=split_max_tokens, num_kv_splits=2)  # fmt: skip
    return batch, flat, indptr.to(DEVICE), plan


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_max_tokens", [0, 8])
def test_tree_mask_verify(dtype, split_max_tokens):
    batch, flat, indptr, plan = _verify_batch(dtype, split_max_tokens)
    out = hybrid_attention(batch.q, batch.k_buffer, batch.v_buffer, plan, out=_poisoned(batch.q))
    ref = _ref(batch, custom_mask=flat, mask_indptr=indptr)
    assert rel_err(out, ref) < tolerance(dtype)
    # the masks must matter: on the verify rows (11 tokens) a causal run is far off, well
    # beyond every tolerance (<= 0.016), so a kernel that ignored the mask would fail above
    causal = _ref(batch)
    assert rel_err(causal[:11], ref[:11]) > 0.05


def test_packed_custom_mask_without_indptr():
    dtype = DTYPES[0]
    seq, ext = [30, 12], [3, 12]
    batch = make_batch(seq, ext, 4, 4, HEAD_DIMS[0], dtype, DEVICE)
    flat = (torch.rand(sum(s * e for s, e in zip(seq, ext))) < 0.6).to(DEVICE)
    flat[:: seq[0]] = True  # keep every row of the first block non-empty
    out = hybrid_attention(batch.q, batch.k_buffer, batch.v_buffer, _plan(batch, custom_mask=flat))
    assert rel_err(out, _ref(batch, custom_mask=flat)) < tolerance(dtype)


def test_row_with_nothing_visible_is_zero():
    dtype = DTYPES[0]
    batch = make_batch([10], [2], 4, 2, HEAD_DIMS[0], dtype, DEVICE)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1] = False
    out = extend_attention(batch.q, batch.k_buffer, batch.v_buffer, *batch.tensors,
                           custom_mask=mask.flatten().to(DEVICE))  # fmt: skip
    assert torch.all(out[1] == 0) and torch.all(out[0] != 0)


def test_rejects_bad_inputs():
    batch = make_batch([8, 4], [8, 1], 4, 2, HEAD_DIMS[0], DTYPES[0], DEVICE)
    plan = _plan(batch)
    other = torch.float16 if DTYPES[0] != torch.float16 else torch.float32
    with pytest.raises(TypeError, match="k_buffer"):
        hybrid_attention(batch.q, batch.k_buffer.to(other), batch.v_buffer, plan)
    with pytest.raises(ValueError, match="q must be"):
        hybrid_attention(batch.q[:, :2], batch.k_buffer, batch.v_buffer, plan)
    with pytest.raises(ValueError, match="extend_len <= seq_len"):
        _plan(batch, seq_lens_cpu=[8, 4], extend_lens_cpu=[9, 1])
    with pytest.raises(ValueError, match="custom_mask has 3 entries"):
        _plan(batch, custom_mask=torch.ones(3, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match="must be positive"):
        hybrid_attention(batch.q, batch.k_buffer, batch.v_buffer, plan, sm_scale=-0.1)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        plan_attention(*batch.tensors, num_q_heads=5, num_kv_heads=2, head_dim=HEAD_DIMS[0])


@pytest.mark.skipif(not ON_GPU, reason="compiles kernels: needs a CUDA GPU")
def test_warm_up_compiles_every_variant_a_decode_or_verify_row_can_pick():
    """After warm_up, split launches of any width (1..16 rows of a GQA-4 request) and any
    number of KV splits, and extend launches, run without compiling another kernel variant
    (a 1-3 s stall)."""
    from lmprog.runtime.kernels.attention import _attn_tile_kernel, _merge_splits_kernel, warm_up

    def compiled():
        return sum(
            len(c[0])
            for fn in (_attn_tile_kernel, _merge_splits_kernel)
            for c in fn.device_caches.values()
        )

    hq, hkv, d, slots = 32, 8, 128, 20000
    g = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(slots + 1, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(slots + 1, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    table = torch.randperm(slots, device="cuda", generator=g)[: 4 * 4096].view(4, 4096) + 1
    table = table.to(torch.int32)
    assert warm_up(k, v, table, num_q_heads=hq) >= 4
    before = compiled()
    for e in (1, 2, 3, 5, 8, 13, 16, 17, 40):
        qkv = torch.randn(e, hq + 2 * hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        for s in (1, 2, 3, 9, 16, 17, 40, 64):
            seq = 60 * e + 100 + s
            plan = plan_attention(
                table,
                torch.tensor([2], device="cuda"),
                torch.tensor([seq], device="cuda"),
                torch.tensor([e], device="cuda"),
                torch.zeros(1, dtype=torch.int64, device="cuda"),
                num_q_heads=hq,
                num_kv_heads=hkv,
                head_dim=d,
                seq_lens_cpu=[seq],
                extend_lens_cpu=[e],
                num_kv_splits=s,
            )
            hybrid_attention(qkv[:, :hq], k, v, plan)
    torch.cuda.synchronize()
    assert compiled() == before


def test_warm_up_runs_each_launch_variant_once():
    """GQA group 4: rows of 1-4, 5-8 and 9-16 tokens take BLOCK_M 16, 32 and 64; each runs
    without splits, and with splits merged at BLOCK_S 16, 32 and 64; 17 rows: the extend
    launch."""
    from lmprog.runtime.kernels.attention import warm_up

    k = torch.randn(65, 2, 32, device=DEVICE)
    table = torch.arange(1, 65, dtype=torch.int32, device=DEVICE).view(1, 64)
    assert warm_up(k, k.clone(), table, num_q_heads=8) == 13


@pytest.mark.skipif(ON_GPU, reason="the GPU runs the kernels themselves")
def test_launch_variants_compile_for_sm90():
    """The interpreter runs code a GPU compile refuses: compile the extend launch and the
    split launch (with and without KV splits, at two BLOCK_M) as a Llama-3.1-8B step runs
    them, to a cubin for sm_90, in a process without the interpreter. The split launches
    (every decode) must not spill registers."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("compile_sm90.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(script), "attention"], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    if run.returncode == 3:  # this triton has no CUDA backend or ptxas to compile with
        pytest.skip(run.stdout.strip())
    assert run.returncode == 0, run.stderr[-3000:]
    compiled = [json.loads(line) for line in run.stdout.splitlines()]
    assert {c["attention"] for c in compiled} == {"extend", "split"}
    assert {c["kv_splits"] for c in compiled} == {True, False}
    for c in compiled:
        assert 0 < c["shared"] <= 227 * 1024, c
        if c["attention"] == "split":
            assert c["spills"] == 0, c
