"""The FP8 KV cache (kv_cache_dtype="fp8_e4m3"): the pool's size and layout, the torch and
Triton attention backends reading and writing it, an engine and lp.Runtime serving with it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from fp8_testing import TINY
from triton_testing import TRITON_SKIP

import lmprog as lp
from lmprog.core.sampling import SamplingParams as SP
from lmprog.runtime.assemble import assemble_model
from lmprog.runtime.config import CacheConfig
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import (
    FP8_KV,
    KVPool,
    dequantize_kv,
    kv_slots,
    kv_storage_dtype,
)
from lmprog.runtime.models import PRESETS, load_model, preset

PROMPT = [5, 17, 3, 88, 42, 9, 61, 23, 70, 11]
FED = [2, 34, 90, 7, 15]  # tokens fed one per decode step (teacher forcing)


def test_pool_stores_one_byte_per_value_and_holds_more_tokens():
    smol = preset("smollm2-135m")
    assert KVPool.bytes_per_token(smol, FP8_KV) * 2 == KVPool.bytes_per_token(smol, torch.bfloat16)
    budget = 1 << 24
    bf16 = KVPool.size_for_budget(budget, smol, torch.bfloat16)
    assert KVPool.size_for_budget(budget, smol, FP8_KV) == 2 * bf16 + 1  # the dummy slot
    net = load_model(TINY, load_format="dummy")  # fp32: an FP8 pool holds 4x the tokens
    fp8_slots, fp32_slots = kv_slots(net, None, 0.9, "fp8_e4m3"), kv_slots(net, None, 0.9)
    assert abs((fp8_slots + 1) - 4 * (fp32_slots + 1)) < 4  # the same CPU budget
    pool = KVPool.for_model(TINY, 10, torch.bfloat16, "cpu", kv_cache_dtype="fp8")
    assert pool.dtype == FP8_KV and pool.compute_dtype == torch.bfloat16
    assert pool.nbytes == TINY.num_layers * 2 * 11 * TINY.kv_size
    assert kv_storage_dtype("auto", torch.float16) == torch.float16
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_storage_dtype("fp8_e5m2", torch.bfloat16)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        CacheConfig(kv_cache_dtype="int8")


def test_pool_writes_value_over_scale_and_reads_it_back():
    pool = KVPool(8, 2, 2, 16, FP8_KV, "cpu", compute_dtype=torch.float32,
                  scales=((1.0, 0.25), (1.0, 4.0)))  # fmt: skip
    k, v = torch.randn(3, 2, 16), torch.randn(3, 2, 16) * 20
    loc = torch.tensor([4, 1, 7])
    pool.write(1, loc, k, v)
    assert pool.scales(1) == (0.25, 4.0) and pool.scales(0) == (1.0, 1.0)
    assert torch.equal(pool.k[1][loc].float(), (k / 0.25).to(FP8_KV).float())
    back_k = dequantize_kv(pool.k[1][loc], 0.25, torch.float32)
    back_v = dequantize_kv(pool.v[1][loc], 4.0, torch.float32)
    assert ((back_k - k).abs() <= k.abs() / 16 + 1e-3).all()  # e4m3: 3 mantissa bits
    assert ((back_v - v).abs() <= v.abs() / 16 + 1e-2).all()
    assert not pool.k[0].float().any()
    with pytest.raises(ValueError, match="one value per layer"):
        KVPool(8, 2, 2, 16, FP8_KV, "cpu", scales=((1.0,), (1.0,)))


def _teacher_forced_logits(model, kv_cache_dtype: str) -> torch.Tensor:
    """Logits of a prefill of PROMPT, then of each FED token decoded one step at a time."""
    n = len(PROMPT) + len(FED)
    dev = model.device
    kv = KVPool.for_model(model.config, n + 1, model.dtype, dev, kv_cache_dtype=kv_cache_dtype)
    table = torch.arange(1, n + 2, dtype=torch.int32, device=dev)[None, : n + 1].contiguous()
    out = []
    with torch.inference_mode():
        p = len(PROMPT)
        batch = ForwardBatch.build(input_ids=PROMPT, out_cache_loc=range(1, p + 1),
                                   req_pool_indices=[0], seq_lens=[p], extend_lens=[p],
                                   req_to_token=table)  # fmt: skip
        out.append(model(batch, kv))
        for i, tok in enumerate(FED):
            pos = p + i
            batch = ForwardBatch.build(input_ids=[tok], out_cache_loc=[pos + 1],
                                       req_pool_indices=[0], seq_lens=[pos + 1],
                                       extend_lens=[1], req_to_token=table)  # fmt: skip
            out.append(model(batch, kv))
    return torch.cat(out)


def test_decoding_over_an_fp8_pool_stays_close_to_the_full_precision_pool():
    model = load_model(TINY, load_format="dummy", seed=3)
    full = _teacher_forced_logits(model, "auto")
    fp8 = _teacher_forced_logits(model, "fp8_e4m3")
    err = ((fp8 - full).norm() / full.norm()).item()
    assert 0 < err < 0.05, err


@pytest.mark.skipif(TRITON_SKIP is not None, reason=TRITON_SKIP or "")
def test_triton_backend_writes_and_reads_the_fp8_pool_as_the_torch_backend():
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # else the interpreter
    torch_model = load_model(TINY, load_format="dummy", seed=4, device=dev, dtype="float32")
    triton_model = load_model(
        TINY, load_format="dummy", seed=4, attention="triton", device=dev, dtype="float32"
    )
    want = _teacher_forced_logits(torch_model, "fp8_e4m3")
    got = _teacher_forced_logits(triton_model, "fp8_e4m3")
    tol = 1e-2 if dev == "cuda" else 1e-3  # tf32 dots on the GPU
    assert ((got - want).norm() / want.norm()).item() < tol


def test_engine_serves_fp8_weights_over_an_fp8_pool_and_reuses_its_prefixes():
    net = assemble_model(TINY, device="cpu", load_format="dummy", quantization="fp8")
    engine = launch_engine(net, None, eos_token_ids=(0,), max_total_tokens=256,
                           cache_config=CacheConfig(kv_cache_dtype="fp8_e4m3"),
                           engine_config=EngineConfig(check_integrity=True))  # fmt: skip
    prompts = [PROMPT + [i] for i in range(1, 5)]
    params = SP(max_tokens=6, temperature=0, ignore_eos=True)
    try:
        assert engine.runner.kv.dtype == FP8_KV
        first = [engine.submit(EngineRequest(tuple(p), params)).result(timeout=60) for p in prompts]
        again = [engine.submit(EngineRequest(tuple(p), params)).result(timeout=60) for p in prompts]
    finally:
        engine.shutdown()
    assert all(len(r.token_ids) == 6 for r in first)
    assert all(r.cached_tokens >= len(PROMPT) for r in again)  # read back from the FP8 pool
    assert [r.token_ids for r in again] == [r.token_ids for r in first]


def test_runtime_takes_kv_cache_dtype_and_reports_it(monkeypatch):
    monkeypatch.setitem(PRESETS, "fp8-test-tiny", replace(TINY, eos_token_ids=(2,)))
    rt = lp.Runtime(model="fp8-test-tiny", load_format="dummy", device="cpu",
                    kv_cache_dtype="fp8", quantization="fp8", max_total_tokens=128)  # fmt: skip
    try:
        result = rt.generate(PROMPT, {"max_tokens": 4, "ignore_eos": True, "temperature": 0})
        stats = rt.stats()
    finally:
        rt.shutdown()
    assert result.completion_tokens == 4
    assert stats["kv_cache_dtype"] == "fp8" and stats["quantization"] == "fp8"
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        lp.Runtime(model="fp8-test-tiny", load_format="dummy", device="cpu", kv_cache_dtype="e5")
