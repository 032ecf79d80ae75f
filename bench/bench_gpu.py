"""End-to-end GPU benchmarks (issue 5): lmprog beside transformers measured in the same run,
with the fraction of the hardware limit: the card's copy bandwidth and dense bf16 matmul rate,
measured at start (bench/hardware.py; an H200 gave 4.28 TB/s and 787 TFLOP/s, an H100 3.05 TB/s),
and the KV pool sized from the memory free at start.

    python3 bench/bench_gpu.py                 # Llama-3.1-8B shape, bf16, random weights
    python3 bench/bench_gpu.py --smoke         # every code path on the CPU (Triton's
                                               # interpreter, a toy model); timings meaningless
    python3 bench/bench_gpu.py --model deepseek-v2-lite   # latent attention + 64 experts,
                                               # then KV capacity beside llama-3.2-3b (3.)
    python3 bench/bench_gpu.py --model mixtral-8x7b --hf-requests 8   # 8 experts, top-2;
                                               # --smoke --model mixtral-8x7b: a toy Mixtral
    python3 bench/bench_gpu.py --no-hf --quantization fp8 --kv-cache-dtype fp8_e4m3
                                               # the lmprog benchmarks in bf16, then with FP8
                                               # weights and KV, and the ratios (fp8_compare.py)

1. Batch-1 decode. transformers `generate` (LlamaForCausalLM from a LlamaConfig, random init,
   same dtype and GPU, greedy, 32 tokens) beside lmprog: the model-level loop (greedy on the
   GPU, no host sync per step) eager, with the decode CUDA graph, and with the graph plus the
   fused RMSNorm/SiLU kernels (layers/triton_fused.py); then one request through the engine
   (`lp.Runtime(...).generate`), eager and with the decode graphs (fused) in its model runner.
   Limit: reading every weight but the embedding table once per token (of a mixture of
   experts, the active ones: top-k of E). Mixtral / Qwen-MoE presets: transformers'
   MixtralForCausalLM / Qwen2-3MoeForCausalLM (its default grouped_mm experts).
2. Offline throughput: N requests (default 2,000), input lengths uniform in [32, 1024], output
   lengths uniform in [16, 512], random token ids, seed 0, ignore_eos, greedy, through
   `lp.Runtime(model, load_format="dummy", device="cuda").generate(prompts, params)` with the
   decode CUDA graphs and fused kernels; transformers `generate` on the first 64 requests as
   one left-padded batch (tokens counted: the requests' own input + output lengths). Roofline
   for the workload: max(FLOPs / matmul rate, minimum bytes / copy bandwidth), `workload_floor`.

3. KV capacity (a latent-attention model, or --dense-baseline): KV bytes per token and the
   most requests decoding together at a fixed KV budget (--kv-budget-gb), the model beside a
   dense model of similar active size, through the engine (bench/kv_capacity.py).

The engine here is built with cuda_graphs=False so its first decode runs eagerly; then
`install_graphs` fuses the elementwise layers and sets `runner.graphs` (what the model runner
does itself at start-up by default, without the fusion).

Measured on the H200 (torch 2.11, triton 3.6, transformers 5.17), `python3 bench/bench_gpu.py
--hf-requests 8` (max_running 512, chunk 8192, KV 600k tokens), 2026-11-30, third session:
    batch-1 decode, model loop: graph + fused 210.7 tok/s (74% of the 285 tok/s weight-read
        limit); engine (lp.Runtime, overlap scheduling): 209.4 tok/s, 188.1 without overlap;
        transformers generate 11.0 tok/s
    offline 2,000 requests: 25,586 total tok/s (62.7 s; 50% of the 51.7k tok/s roofline,
        390 TFLOP/s achieved); transformers, 8 requests padded: 149 tok/s
    (docs/benchmarks.md has the runs before, the run-to-run spread and the profiles)
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported anywhere
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import torch
from fp8_compare import compare_fp8, fp8_bytes_saved, kv_itemsize
from hardware import Hardware, measure

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS: list[tuple[str, str, str, str]] = []  # (name, lmprog, baseline, ratio / fraction)


def log(*args) -> None:
    print(*args, flush=True)


def section(name: str, fn, *args):
    """Run one benchmark; a failure is printed and the others still run."""
    log(f"\n== {name}")
    t0 = time.perf_counter()
    try:
        return fn(*args)
    except Exception:  # a benchmark script reports and goes on
        traceback.print_exc()
        ROWS.append((name, "FAILED", "", "see traceback"))
        return None
    finally:
        log(f"   ({time.perf_counter() - t0:.1f} s)")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ---------------------------------------------------------------- model shapes and limits


def smoke_config():
    from lmprog.runtime.models import ModelConfig

    return ModelConfig(
        "llama",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position=4096,
        bos_token_id=1,
        eos_token_ids=(2,),
    )


def smoke_mla_config():
    """A toy DeepSeek-V2: latent attention with YaRN, a dense first layer, then 8 experts."""
    from lmprog.runtime.models import ModelConfig, RopeScaling

    yarn = RopeScaling("yarn", factor=4.0, original_max_position=256, mscale=0.707,
                       mscale_all_dim=0.707)  # fmt: skip
    return ModelConfig("deepseek_v2", vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_layers=2, num_heads=4, num_kv_heads=4, head_dim=24,
                       max_position=4096, rope_scaling=yarn, bos_token_id=1, eos_token_ids=(2,),
                       kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                       num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=64, norm_topk_prob=False,
                       mlp_only_layers=(0,))  # fmt: skip


def smoke_moe_config(cfg):
    """A Mixtral / Qwen-MoE preset's architecture in toy sizes (its routing and shared
    expert kept), for --smoke."""
    from dataclasses import replace

    return replace(
        smoke_config(), architecture=cfg.architecture, num_experts=min(cfg.num_experts, 8),
        num_experts_per_tok=min(cfg.num_experts_per_tok, 2), moe_intermediate_size=32,
        shared_expert_intermediate_size=min(cfg.shared_expert_intermediate_size, 64),
        shared_expert_gate=cfg.shared_expert_gate, norm_topk_prob=cfg.norm_topk_prob,
        attention_bias=cfg.attention_bias, qk_norm=cfg.qk_norm,
    )  # fmt: skip


def linear_params(cfg, batch: int = 1) -> int:
    """Parameters read per step of `batch` tokens: every parameter of the model (built on the
    meta device, so any architecture counts right) but the embedding table, of which a step
    reads one row per token (tied: the output projection reads it whole); routed experts
    count the share a batch hits with uniform routing, 1 - (1 - top_k / E)**batch (one
    token: top_k / E, the active weights, what each token multiplies by)."""
    from lmprog.runtime.models import build_model

    total = 0
    for name, p in build_model(cfg, device="meta").named_parameters():
        if name == "model.embed_tokens.weight" and not cfg.tie_word_embeddings:
            continue
        share = 1.0
        if ".experts." in name:
            share = 1 - (1 - cfg.num_experts_per_tok / cfg.num_experts) ** batch
        total += int(p.numel() * share)
    return total


KV_MEMORY_SHARE = 0.85  # of the free memory: weights + KV; the rest for activations, graphs


def default_kv_tokens(cfg, free_bytes: int, itemsize: int = 2) -> int:
    """600k KV tokens, or what fits beside the weights in 85% of the memory free at start
    (an H200's 140 GB: 600k for Llama-3.1-8B, ~200k beside Mixtral-8x7B's 93 GB of bf16
    weights; an H100's 79 GB: ~390k for Llama-3.1-8B)."""
    from lmprog.runtime.models import build_model

    weights = sum(p.numel() for p in build_model(cfg, device="meta").parameters()) * itemsize
    room = KV_MEMORY_SHARE * free_bytes - weights
    if room <= 0:
        raise SystemExit(
            f"{cfg.architecture} weights ({weights / 1e9:.0f} GB) leave no room for a KV pool in "
            f"{free_bytes / 1e9:.0f} GB free: pass --kv-tokens, or a smaller --model"
        )
    return min(600_000, int(room / kv_bytes_per_token(cfg, itemsize)))


def kv_bytes_per_token(cfg, itemsize: int) -> int:
    """The pool's own count (per-head K/V, or latent attention's c_kv + k_pe)."""
    from lmprog.runtime.executor.kv_pool import KVPool

    return KVPool.bytes_per_token(cfg, torch.uint8) * itemsize  # uint8: values per token


def attention_flops_per_pair(cfg) -> int:
    """FLOPs of one (query, key) pair over all layers and heads: q.k and p.v (latent
    attention, absorbed: over kv_lora_rank + the RoPE key, then kv_lora_rank)."""
    if cfg.kv_lora_rank:
        return 2 * cfg.num_layers * cfg.num_heads * (2 * cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    return 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim


def workload_floor(cfg, in_lens, out_lens, itemsize: int, max_batch: int, hw: Hardware) -> dict:
    """Least time the workload needs on the hardware, whatever the scheduling.

    FLOPs: 2 x linear params per fed token (prompt tokens and every output token but the
    last), attention_flops_per_pair per (query, key) pair (causal prompts:
    n(n+1)/2 pairs; decode token at context c: c pairs). Bytes: the KV cache written once and
    read by each decode step, and the weights at least once per decode step, with at most
    `max_batch` requests decoding together (of a mixture of experts, those max_batch tokens
    hit)."""
    p = linear_params(cfg)
    att = attention_flops_per_pair(cfg)
    flops = bytes_ = 0.0
    kvb = kv_bytes_per_token(cfg, itemsize)
    for n, m in zip(in_lens, out_lens):
        fed = n + m - 1
        flops += 2 * p * fed + att * (n * (n + 1) / 2)
        ctx = (m - 1) * n + (m - 1) * m / 2  # decode steps at contexts n+1 .. n+m-1
        flops += att * ctx
        bytes_ += kvb * (fed + ctx)
    decode_steps = int(np.ceil(sum(m - 1 for m in out_lens) / max_batch))
    bytes_ += decode_steps * linear_params(cfg, max_batch) * itemsize
    t_flops, t_bytes = flops / (hw.bf16_tflops * 1e12), bytes_ / (hw.copy_tbs * 1e12)
    return {
        "flops": flops,
        "bytes": bytes_,
        "t_flops": t_flops,
        "t_bytes": t_bytes,
        "floor": max(t_flops, t_bytes),
    }


def make_workload(n: int, vocab: int, in_range, out_range, seed: int = 0):
    rng = np.random.default_rng(seed)
    in_lens = rng.integers(in_range[0], in_range[1] + 1, n)
    out_lens = rng.integers(out_range[0], out_range[1] + 1, n)
    prompts = [rng.integers(3, vocab, int(k)).tolist() for k in in_lens]
    return prompts, [int(k) for k in out_lens]


# ---------------------------------------------------------------- transformers baseline


def hf_model(cfg, device, dtype):
    from transformers import AutoModelForCausalLM

    if cfg.kv_lora_rank:
        hf_cfg = hf_deepseek_v2_config(cfg)
    elif cfg.num_experts:
        hf_cfg = hf_moe_config(cfg)
    else:
        hf_cfg = hf_llama_config(cfg)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(hf_cfg)
    finally:
        torch.set_default_dtype(previous)
    return model.to(device=device, dtype=dtype).eval()


def hf_deepseek_v2_config(cfg):
    from transformers import DeepseekV2Config

    s, rope = cfg.rope_scaling, {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if s is not None:
        rope = {"rope_type": "yarn", "rope_theta": cfg.rope_theta, "factor": s.factor,
                "original_max_position_embeddings": s.original_max_position,
                "beta_fast": s.beta_fast, "beta_slow": s.beta_slow, "mscale": s.mscale,
                "mscale_all_dim": s.mscale_all_dim}  # fmt: skip
    moe = cfg.moe_intermediate_size or 1
    return DeepseekV2Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        q_lora_rank=cfg.q_lora_rank, kv_lora_rank=cfg.kv_lora_rank,
        qk_nope_head_dim=cfg.qk_nope_head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim,
        v_head_dim=cfg.v_head_dim, n_routed_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok, moe_intermediate_size=moe,
        n_shared_experts=cfg.shared_expert_intermediate_size // moe,
        first_k_dense_replace=len(cfg.mlp_only_layers) if cfg.num_experts else cfg.num_layers,
        topk_method="group_limited_greedy" if cfg.n_group > 1 else "greedy",
        n_group=cfg.n_group, topk_group=cfg.topk_group,
        routed_scaling_factor=cfg.routed_scaling_factor, norm_topk_prob=cfg.norm_topk_prob,
        max_position_embeddings=cfg.max_position, rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters=rope, tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=cfg.bos_token_id, eos_token_id=list(cfg.eos_token_ids), pad_token_id=0,
    )  # fmt: skip


def hf_moe_config(cfg):
    """transformers' config of a Mixtral / Qwen2-MoE / Qwen3-MoE ModelConfig."""
    import transformers as tf

    common = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=cfg.max_position,
        rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        num_experts_per_tok=cfg.num_experts_per_tok, bos_token_id=cfg.bos_token_id,
        eos_token_id=list(cfg.eos_token_ids), pad_token_id=0,
    )  # fmt: skip
    if cfg.architecture == "mixtral":
        return tf.MixtralConfig(
            intermediate_size=cfg.moe_intermediate_size, num_local_experts=cfg.num_experts,
            head_dim=cfg.head_dim, **common,
        )  # fmt: skip
    moe = dict(
        intermediate_size=cfg.intermediate_size, moe_intermediate_size=cfg.moe_intermediate_size,
        num_experts=cfg.num_experts, norm_topk_prob=cfg.norm_topk_prob,
        decoder_sparse_step=cfg.decoder_sparse_step, mlp_only_layers=list(cfg.mlp_only_layers),
    )  # fmt: skip
    if cfg.architecture == "qwen2_moe":
        return tf.Qwen2MoeConfig(
            shared_expert_intermediate_size=cfg.shared_expert_intermediate_size,
            qkv_bias=cfg.attention_bias, **moe, **common,
        )  # fmt: skip
    return tf.Qwen3MoeConfig(head_dim=cfg.head_dim, attention_bias=cfg.attention_bias, **moe,
                             **common)  # fmt: skip


def hf_llama_config(cfg):
    from transformers import LlamaConfig

    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    s = cfg.rope_scaling
    if s is not None:
        rope = {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "rope_theta": cfg.rope_theta,
            "original_max_position_embeddings": s.original_max_position,
        }
    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters=rope,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=list(cfg.eos_token_ids),
        pad_token_id=0,
    )


def hf_generate(model, ids, mask, new_tokens: int) -> float:
    """Seconds for greedy generate of exactly `new_tokens` tokens."""
    sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    sync()
    assert out.shape[1] == ids.shape[1] + new_tokens, out.shape
    return time.perf_counter() - t0


def hf_baselines(cfg, args, prompts, out_lens) -> dict:
    model = hf_model(cfg, args.device, args.torch_dtype)
    dev = args.device
    res = {}
    ids = torch.randint(3, cfg.vocab_size, (1, 16), device=dev)
    hf_generate(model, ids, torch.ones_like(ids), 4)  # warm-up
    t = hf_generate(model, ids, torch.ones_like(ids), args.hf_decode_tokens)
    res["decode_tok_s"] = args.hf_decode_tokens / t
    log(
        f"   transformers batch-1 decode: {args.hf_decode_tokens} tokens in {t:.2f} s = "
        f"{res['decode_tok_s']:.1f} tok/s"
    )
    n = min(args.hf_requests, len(prompts))
    if n == 0:
        return res
    sub, outs = prompts[:n], out_lens[:n]
    width = max(len(p) for p in sub)
    ids = torch.zeros(n, width, dtype=torch.int64)
    mask = torch.zeros(n, width, dtype=torch.int64)
    for i, p in enumerate(sub):  # left padding
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    t = hf_generate(model, ids.to(dev), mask.to(dev), max(outs))
    useful = sum(len(p) for p in sub) + sum(outs)
    res["offline_tok_s"] = useful / t
    log(
        f"   transformers offline, {n} requests in one padded batch ({width} + {max(outs)} "
        f"tokens wide): {t:.2f} s, {useful} tokens of the requests = {useful / t:,.0f} tok/s"
    )
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return res


# ---------------------------------------------------------------- lmprog: model-level decode


class Decode1:
    """One request decoding greedily on its own small pool; every step's inputs are computed
    on the device from the previous step's (no host sync, no host-to-device copy)."""

    def __init__(self, model, prompt_len: int, max_len: int, kv_cache_dtype: str = "auto") -> None:
        from lmprog.runtime.executor.kv_pool import KVPool

        self.model, self.prompt_len = model, prompt_len
        dev = model.device
        self.kv = KVPool.for_model(
            model.config, max_len, model.dtype, dev, kv_cache_dtype=kv_cache_dtype
        )
        self.table = torch.arange(1, max_len + 1, dtype=torch.int32, device=dev).view(1, max_len)
        self.prompt = torch.randint(3, model.config.vocab_size, (prompt_len,)).tolist()
        self.zero = torch.zeros(1, dtype=torch.int64, device=dev)
        self.one = torch.ones(1, dtype=torch.int64, device=dev)

    def reset(self) -> None:
        from lmprog.runtime.executor.forward_batch import ForwardBatch

        n = self.prompt_len
        fb = ForwardBatch.build(
            input_ids=self.prompt,
            out_cache_loc=range(1, n + 1),
            req_pool_indices=[0],
            seq_lens=[n],
            extend_lens=[n],
            req_to_token=self.table,
        )
        self.tok = self.model(fb, self.kv).argmax(-1)
        self.pos = torch.full((1,), n, dtype=torch.int64, device=self.table.device)

    def batch(self):
        from lmprog.runtime.executor.forward_batch import ForwardBatch

        return ForwardBatch(
            input_ids=self.tok,
            positions=self.pos,
            out_cache_loc=self.pos + 1,
            req_pool_indices=self.zero,
            seq_lens=self.pos + 1,
            extend_lens=self.one,
            extend_start_loc=self.zero,
            req_to_token=self.table,
            logits_indices=self.zero,
        )

    def run(self, forward, steps: int) -> float:
        """Milliseconds per step of `steps` greedy steps after a reset and 3 warm-up steps."""
        self.reset()
        for _ in range(3):
            self._step(forward)
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            self._step(forward)
        sync()
        return (time.perf_counter() - t0) * 1e3 / steps

    def _step(self, forward) -> None:
        self.tok = forward(self.batch()).argmax(-1)
        self.pos = self.pos + 1


def model_decode(model, args) -> dict:
    """Batch-1 decode at the model level: eager, graph, graph + fused kernels."""
    from lmprog.runtime.executor.cuda_graph import CudaGraphRunner
    from lmprog.runtime.layers.triton_fused import fuse_elementwise

    cfg = model.config
    itemsize = torch.empty((), dtype=model.dtype).element_size()
    max_len = args.decode_prompt + args.decode_steps + 64
    state = Decode1(model, args.decode_prompt, max_len, args.kv_cache_dtype)
    ms_eager = state.run(lambda b: model(b, state.kv), args.eager_steps)
    state.reset()  # same inputs through both paths: the logits must agree
    graphs = CudaGraphRunner(model, state.kv, state.table, batch_sizes=(1,))
    want = model(state.batch(), state.kv).clone()
    got = graphs.maybe_run(state.batch(), state.kv).clone()
    rel = ((got - want).abs().max() / want.abs().max()).item()
    bucket = graphs.buckets[0]  # the same static inputs and plan, eagerly: must be identical
    same_plan = model(bucket.batch, state.kv, plan=bucket.plan)
    exact = (got - same_plan).abs().max().item()
    ms_graph = state.run(lambda b: graphs.maybe_run(b, state.kv), args.decode_steps)
    fused = fuse_elementwise(model)
    graphs_fused = CudaGraphRunner(model, state.kv, state.table, batch_sizes=(1,))
    state.reset()
    got_fused = graphs_fused.maybe_run(state.batch(), state.kv)
    rel_fused = ((got_fused - want).abs().max() / want.abs().max()).item()
    ms_fused = state.run(lambda b: graphs_fused.maybe_run(b, state.kv), args.decode_steps)
    ctx = args.decode_prompt + args.decode_steps // 2
    weights = linear_params(cfg) * itemsize - fp8_bytes_saved(model, itemsize)
    kv_item = kv_itemsize(args.kv_cache_dtype, itemsize)
    floor_ms = (weights + ctx * kv_bytes_per_token(cfg, kv_item)) / (args.hw.copy_tbs * 1e9)
    log(
        f"   graph replay vs eager on its own static inputs and plan: max abs diff {exact:.2e}; "
        f"graph vs plain eager logits: max rel diff {rel:.2e} (bf16, other split count); "
        f"fused ({fused} modules) vs plain eager {rel_fused:.2e}"
    )
    for name, ms in (("eager", ms_eager), ("graph", ms_graph), ("graph+fused", ms_fused)):
        log(
            f"   model-level {name:12s} {ms:7.2f} ms/step = {1e3 / ms:6.1f} tok/s "
            f"({floor_ms / ms:.0%} of the weight-read limit {1e3 / floor_ms:.0f} tok/s)"
        )
    return {
        "eager": 1e3 / ms_eager,
        "graph": 1e3 / ms_graph,
        "fused": 1e3 / ms_fused,
        "profile": lambda: profile_replay(graphs_fused, state),
        "limit": 1e3 / floor_ms,
        "rel_diff": max(rel, rel_fused),
    }


def profile_replay(graphs, state, replays: int = 5) -> None:
    """CUDA kernel time inside the batch-1 graph, grouped (matmuls / attention / other)."""
    from torch.profiler import ProfilerActivity, profile

    batch = state.batch()
    graphs.maybe_run(batch, state.kv)
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graphs.maybe_run(batch, state.kv)
        sync()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: -e.device_time_total)
    groups: dict[str, list[float]] = {}
    for e in events:
        name = e.key.lower()
        kind = (
            "matmul"
            if any(k in name for k in ("gemm", "gemv", "nvjet", "cutlass", "sm90"))
            else "attention"
            if "attn" in name or "merge" in name
            else "other"
        )
        g = groups.setdefault(kind, [0.0, 0])
        g[0] += e.device_time_total / replays
        g[1] += e.count / replays
    total = sum(g[0] for g in groups.values())
    log(
        f"   kernel time per step {total / 1e3:.2f} ms: "
        + ", ".join(f"{k} {v[0] / 1e3:.2f} ms in {v[1]:.0f} kernels" for k, v in groups.items())
    )
    for e in events[:10]:
        log(
            f"     {e.device_time_total / replays / 1e3:7.3f} ms {e.count / replays:5.0f}x  "
            f"{e.key[:90]}"
        )


# ---------------------------------------------------------------- lmprog: the engine


def install_graphs(rt, max_batch: int, fuse: bool, piecewise_tokens: int = 0):
    """Fuse the elementwise layers, then (re)capture the engine runner's decode graphs (and
    piecewise graphs for other steps of up to `piecewise_tokens` tokens) on the engine thread
    (the runner replays `runner.graphs` / `runner.piecewise`, as launch_engine sets them up)."""
    from lmprog.runtime.executor.cuda_graph import CudaGraphRunner
    from lmprog.runtime.executor.piecewise_graph import PiecewiseGraphRunner
    from lmprog.runtime.layers.triton_fused import TritonRMSNorm, fuse_elementwise

    runner = rt.engine.runner

    def setup():
        if fuse and not any(isinstance(m, TritonRMSNorm) for m in runner.model.modules()):
            fuse_elementwise(runner.model)
        t0 = time.perf_counter()
        runner.graphs = CudaGraphRunner(
            runner.model, runner.kv, runner.req_to_token, max_batch_size=max_batch
        )
        log(
            f"   captured decode graphs for batch sizes {runner.graphs.batch_sizes} in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        if piecewise_tokens:
            t0 = time.perf_counter()
            runner.piecewise = PiecewiseGraphRunner(
                runner.model, runner.kv, runner.req_to_token, max_tokens=piecewise_tokens
            )
            log(
                f"   captured piecewise graphs for token counts {runner.piecewise.token_buckets} "
                f"in {time.perf_counter() - t0:.1f} s"
            )
        return runner.graphs

    return rt.engine.call(setup)


def make_runtime(args):
    import lmprog as lp

    # cuda_graphs=False: the first engine decode runs eagerly; install_graphs adds them later
    return lp.Runtime(
        model=args.model,
        load_format="dummy",
        device=args.device,
        dtype=args.dtype,
        attention="triton",
        cuda_graphs=False,
        max_total_tokens=args.kv_tokens,
        context_length=args.context,
        max_running_requests=args.max_running,
        max_num_batched_tokens=args.chunk,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
    )


def engine_decode(rt, args, prompt_len: int, tokens: int) -> float:
    prompt = torch.randint(3, rt.model_config.vocab_size, (prompt_len,)).tolist()
    params = {"max_tokens": tokens, "ignore_eos": True, "temperature": 0.0}
    rt.generate_offline(prompt, {**params, "max_tokens": 4})  # warm-up
    t0 = time.perf_counter()
    res = rt.generate_offline(prompt, params)
    t = time.perf_counter() - t0
    assert res.completion_tokens == tokens, res.completion_tokens
    return tokens / t


def offline(rt, args, prompts, out_lens, graphs) -> dict:
    params = [{"max_tokens": m, "ignore_eos": True, "temperature": 0.0} for m in out_lens]
    warm_p, warm_o = make_workload(
        min(32, len(prompts)), rt.model_config.vocab_size, args.in_range, args.out_range, seed=1
    )
    rt.generate_offline(
        warm_p, [{"max_tokens": m, "ignore_eos": True, "temperature": 0.0} for m in warm_o]
    )
    rt.flush_cache()
    before = rt.stats()
    g0 = graphs.replays if graphs else 0
    piecewise = rt.engine.runner.piecewise
    p0 = piecewise.replays if piecewise else 0
    steps = StepLog(rt.engine.metrics)
    t0 = time.perf_counter()
    try:
        results = _with_progress(rt, lambda: rt.generate_offline(prompts, params), before)
    finally:
        steps.detach()
    wall = time.perf_counter() - t0
    steps.report()
    after = rt.stats()
    got = [r.completion_tokens for r in results]
    assert got == out_lens, "every request must generate exactly its output length"
    total_in, total_out = sum(len(p) for p in prompts), sum(out_lens)
    res = {
        "wall": wall,
        "total_tok_s": (total_in + total_out) / wall,
        "out_tok_s": total_out / wall,
        "in": total_in,
        "out": total_out,
        "steps": after["steps"] - before["steps"],
        "overlapped": after["overlapped_steps"] - before["overlapped_steps"],
        "busy": after["busy_seconds"] - before["busy_seconds"],
        "cached": after["cached_tokens"] - before["cached_tokens"],
    }
    res["graph_steps"] = (graphs.replays - g0) if graphs else 0
    res["piecewise_steps"] = (piecewise.replays - p0) if piecewise else 0
    res["eager_steps"] = res["steps"] - res["graph_steps"] - res["piecewise_steps"]
    log(
        f"   {len(prompts)} requests, {total_in:,} input + {total_out:,} output tokens in "
        f"{wall:.1f} s: {res['total_tok_s']:,.0f} total tok/s, {res['out_tok_s']:,.0f} output "
        f"tok/s; {res['steps']} steps ({res['graph_steps']} decode graph, "
        f"{res['piecewise_steps']} piecewise graph, "
        f"{res.get('eager_steps', 0)} eager; {res['overlapped']} overlapped), engine busy "
        f"{res['busy']:.1f} s, "
        f"cached prompt tokens {res['cached']}"
    )
    return res


class StepLog:
    """Every engine step's (duration, fed tokens, decodes) while attached, by wrapping the
    engine's metrics hook (called on the engine thread; an append per step)."""

    def __init__(self, metrics) -> None:
        self.metrics = metrics
        self.rows: list[tuple[float, int, int]] = []
        self._orig = metrics.on_step

        def on_step(duration, fed, decodes, generated):
            self.rows.append((duration, fed, decodes))
            self._orig(duration, fed, decodes, generated)

        metrics.on_step = on_step

    def detach(self) -> None:
        self.metrics.on_step = self._orig

    def report(self) -> None:
        """Where the engine's time went: decode-only steps, steps with prompt tokens."""
        if not self.rows:
            return
        kinds = {"decode-only": [], "with prefill": []}
        for d, fed, dec in self.rows:
            kinds["decode-only" if fed == dec else "with prefill"].append((d, fed, dec))
        for name, rows in kinds.items():
            if rows:
                t = sum(r[0] for r in rows)
                toks = sum(r[1] for r in rows)
                log(
                    f"   {name:12s}: {len(rows)} steps, {t:.1f} s, {t / len(rows) * 1e3:.1f} ms "
                    f"mean, {toks:,} fed tokens, {toks / t:,.0f} fed tok/s"
                )
        first = " ".join(f"{d * 1e3:.0f}ms/{fed}t/{dec}d" for d, fed, dec in self.rows[:12])
        log(f"   first steps (time/fed/decodes): {first}")
        slow = sorted(self.rows, reverse=True)[:8]
        log("   slowest: " + " ".join(f"{d * 1e3:.0f}ms/{fed}t/{dec}d" for d, fed, dec in slow))


def _with_progress(rt, fn, before: dict, every_s: float = 15.0):
    """fn() in a thread; the engine's counters printed every `every_s` seconds meanwhile (so a
    run cut short by a timeout still says how far it got)."""
    from concurrent.futures import ThreadPoolExecutor, wait

    t0 = time.perf_counter()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(fn)
        while not wait([future], timeout=every_s).done:
            st = rt.stats()
            log(
                f"   ... {time.perf_counter() - t0:5.0f} s: {st['steps'] - before['steps']} steps, "
                f"{st['generated_tokens'] - before['generated_tokens']:,} generated, "
                f"{st['prefill_tokens'] - before['prefill_tokens']:,} prefilled, "
                f"running {st['num_running']}, waiting {st['num_waiting']}"
            )
        return future.result()


def driver_offline(model, args, prompts, out_lens) -> dict:
    """The fallback when the engine cannot run: scheduler + model runner + decode graphs,
    greedy argmax on the GPU, one host sync per step, no per-request sampler/text state."""
    from lmprog.core.sampling import SamplingParams
    from lmprog.runtime.config import SchedulerConfig
    from lmprog.runtime.executor.cuda_graph import CudaGraphRunner
    from lmprog.runtime.executor.model_runner import ModelRunner
    from lmprog.runtime.request import Req
    from lmprog.runtime.scheduler import Scheduler

    sched = Scheduler(
        args.kv_tokens,
        args.context,
        SchedulerConfig(max_num_batched_tokens=args.chunk, max_running_requests=args.max_running),
    )
    runner = ModelRunner(model, sched.cache.capacity, sched.req_to_token)
    graphs = CudaGraphRunner(model, runner.kv, runner.req_to_token, max_batch_size=args.max_running)
    reqs = [
        Req(i, p, SamplingParams(max_tokens=m, ignore_eos=True, temperature=0.0))
        for i, (p, m) in enumerate(zip(prompts, out_lens))
    ]
    sync()
    t0 = time.perf_counter()
    for r in reqs:
        sched.submit(r)
    steps = graph_steps = 0
    with torch.inference_mode():
        while sched.has_work:
            batch = sched.schedule()
            if batch.is_empty:
                continue
            fb = runner.build(batch)
            logits = graphs.maybe_run(fb, runner.kv)
            graph_steps += logits is not None
            if logits is None:
                logits = model(fb, runner.kv)
            tokens = logits.argmax(-1).tolist()
            for e, toks in zip(batch.entries, _entry_tokens(batch, tokens)):
                e.req.token_ids.extend(toks)  # the decoding side, minimal: greedy tokens
            sched.process_results(batch)
            steps += 1
    wall = time.perf_counter() - t0
    got = [len(r.token_ids) - r.prompt_len for r in reqs]
    assert got == out_lens, "every request must generate exactly its output length"
    total_in, total_out = sum(len(p) for p in prompts), sum(out_lens)
    log(
        f"   minimal driver: {len(prompts)} requests in {wall:.1f} s = "
        f"{(total_in + total_out) / wall:,.0f} total tok/s; {steps} steps ({graph_steps} graph)"
    )
    return {
        "wall": wall,
        "total_tok_s": (total_in + total_out) / wall,
        "in": total_in,
        "out": total_out,
    }


def _entry_tokens(batch, tokens: list[int]) -> list[tuple[int, ...]]:
    """The sampled token of each entry: logits rows come `end - logits_from` per entry that
    wants logits, the last of them sampled when entry.sample."""
    out, row = [], 0
    for e in batch.entries:
        if e.logits_from is None:
            out.append(())
            continue
        row += e.end - e.logits_from
        out.append((tokens[row - 1],) if e.sample else ())
    return out


def lmprog_benches(args, prompts, out_lens, hf: dict) -> dict:
    rt = make_runtime(args)
    model = rt.engine.runner.model
    cfg = model.config
    itemsize = torch.empty((), dtype=model.dtype).element_size()
    dec = section(
        "model-level batch-1 decode", lambda: rt.engine.call(lambda: model_decode(model, args))
    )
    eng_eager = section(
        "engine batch-1 decode, eager",
        engine_decode,
        rt,
        args,
        args.decode_prompt,
        args.eager_steps * 2,
    )
    graphs = section(
        "install CUDA graphs in the engine",
        install_graphs,
        rt,
        args.max_running,
        True,
        0 if args.no_piecewise else args.chunk,
    )
    rt.engine.set_overlap(False)
    eng_sync = section(
        "engine batch-1 decode, CUDA graphs, no overlap scheduling",
        engine_decode,
        rt,
        args,
        args.decode_prompt,
        args.decode_steps,
    )
    rt.engine.set_overlap(True)
    eng_graph = section(
        "engine batch-1 decode, CUDA graphs",
        engine_decode,
        rt,
        args,
        args.decode_prompt,
        args.decode_steps,
    )
    if eng_eager:
        log(f"   engine eager: {eng_eager:.1f} tok/s")
    if eng_graph:
        log(
            f"   engine graphs: {eng_graph:.1f} tok/s (without overlap scheduling: "
            f"{eng_sync or 0:.1f})"
        )
    hf_dec = hf.get("decode_tok_s")
    if dec:
        ROWS.append(
            (
                "batch-1 decode, model loop, graph+fused",
                f"{dec['fused']:.1f} tok/s",
                f"HF {hf_dec:.1f}" if hf_dec else "HF n/a",
                f"{dec['fused'] / dec['limit']:.0%} of {dec['limit']:.0f} (weights)",
            )
        )
        ROWS.append(
            (
                "batch-1 decode, model loop, graph",
                f"{dec['graph']:.1f} tok/s",
                "",
                f"{dec['graph'] / dec['limit']:.0%}",
            )
        )
        ROWS.append(
            (
                "batch-1 decode, model loop, eager",
                f"{dec['eager']:.1f} tok/s",
                "",
                f"{dec['eager'] / dec['limit']:.0%}",
            )
        )
    limit = dec["limit"] if dec else None
    for name, v in (
        ("engine, graphs", eng_graph),
        ("engine, graphs, no overlap", eng_sync),
        ("engine, eager", eng_eager),
    ):
        if v:
            frac = f"{v / limit:.0%}" if limit else ""
            ratio = f"{v / hf_dec:.1f}x HF" if hf_dec else ""
            ROWS.append((f"batch-1 decode, {name}", f"{v:.1f} tok/s", ratio, frac))
    if args.requests and args.compare_overlap:
        rt.engine.set_overlap(False)
        sync_res = section(
            "offline throughput, no overlap scheduling",
            offline,
            rt,
            args,
            prompts,
            out_lens,
            graphs,
        )
        rt.engine.set_overlap(True)
        if sync_res:
            ROWS.append(
                (
                    f"offline {len(prompts)} req, no overlap",
                    f"{sync_res['total_tok_s']:,.0f}",
                    "",
                    "",
                )
            )
    if args.requests:
        res = section("offline throughput", offline, rt, args, prompts, out_lens, graphs)
        if res is None or args.driver:
            rt.shutdown()
            del rt
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            rt = None
            name = (
                "offline throughput, minimal driver (engine failed)"
                if res is None
                else "offline throughput, minimal driver"
            )
            res_d = section(name, driver_offline, model, args, prompts, out_lens)
            res = res if res is not None else res_d
        if res:
            floor = workload_floor(
                cfg, [len(p) for p in prompts], out_lens, itemsize, args.max_running, args.hw
            )
            log(
                f"   workload floor: {floor['flops'] / 1e15:.1f} PFLOP -> {floor['t_flops']:.1f} s "
                f"at {args.hw.bf16_tflops:.0f} TFLOP/s; {floor['bytes'] / 1e12:.1f} TB -> "
                f"{floor['t_bytes']:.1f} s at {args.hw.copy_tbs:.2f} TB/s; achieved "
                f"{floor['flops'] / res['wall'] / 1e12:.0f} TFLOP/s"
            )
            hf_off = hf.get("offline_tok_s")
            ROWS.append(
                (
                    f"offline {len(prompts)} req, total tok/s",
                    f"{res['total_tok_s']:,.0f}",
                    f"HF {hf_off:,.0f} ({res['total_tok_s'] / hf_off:.0f}x)"
                    if hf_off
                    else "HF n/a",
                    f"{floor['floor'] / res['wall']:.0%} of roofline "
                    f"({(res['in'] + res['out']) / floor['floor']:,.0f} tok/s)",
                )
            )
    if args.profile and dec and rt is not None:  # last: the profiler (CUPTI) can leave
        section(
            "kernel time of one batch-1 graph step (fused)",  # per-call overhead behind
            rt.engine.call,
            dec["profile"],
        )
    if rt is not None:
        rt.shutdown()
    return {
        "engine decode": eng_graph,
        "model decode": dec["fused"] if dec else None,
        "offline": res["total_tok_s"] if args.requests and res else None,
    }


# ---------------------------------------------------------------- main


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="toy model on the CPU interpreter")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--hf-requests", type=int, default=64)
    p.add_argument("--hf-decode-tokens", type=int, default=32)
    p.add_argument("--no-hf", action="store_true")
    p.add_argument(
        "--profile",
        action="store_true",
        help="kernel-time breakdown of the batch-1 graph step (torch profiler)",
    )
    p.add_argument(
        "--driver",
        action="store_true",
        help="also measure the offline workload through a minimal scheduler+model loop",
    )
    p.add_argument(
        "--compare-overlap",
        action="store_true",
        help="also run the offline workload without overlap scheduling",
    )
    p.add_argument(
        "--no-piecewise",
        action="store_true",
        help="run non-decode steps eagerly (no piecewise CUDA graphs)",
    )
    p.add_argument("--decode-prompt", type=int, default=128)
    p.add_argument("--decode-steps", type=int, default=256)
    p.add_argument("--eager-steps", type=int, default=16)
    p.add_argument("--max-running", type=int, default=512)
    p.add_argument("--chunk", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument(
        "--kv-tokens",
        type=int,
        default=None,
        help="KV pool size (default: 600k, or what fits in 85%% of the memory free at start)",
    )
    p.add_argument("--context", type=int, default=2048)
    p.add_argument(
        "--quantization",
        choices=("fp8",),
        default=None,
        help="also run the lmprog benchmarks with FP8 weights, beside the bf16 pass",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=("auto", "fp8_e4m3", "fp8"),
        default="auto",
        help="the FP8 pass's KV cache (with or without --quantization)",
    )
    p.add_argument(
        "--dense-baseline",
        default="",
        help="KV capacity beside this dense preset (default: llama-3.2-3b for a latent-"
        "attention model, none otherwise)",
    )
    p.add_argument("--kv-budget-gb", type=float, default=4.0, help="KV budget of the capacity run")
    p.add_argument("--capacity-prompt", type=int, default=960)
    p.add_argument("--capacity-output", type=int, default=64)
    args = p.parse_args()
    args.in_range, args.out_range = (32, 1024), (16, 512)
    args.device, args.dtype, args.torch_dtype = "cuda", "bfloat16", torch.bfloat16
    from lmprog.runtime.models import PRESETS

    if args.smoke:
        PRESETS["smoke-tiny"] = smoke_config()  # a toy architecture, for this process only
        latent = PRESETS[args.model].kv_lora_rank > 0
        toy = "smoke-tiny"
        if latent:  # the model's architecture in toy sizes, beside the toy Llama
            toy = "smoke-tiny-mla"
            PRESETS[toy] = smoke_mla_config()
            args.dense_baseline = "smoke-tiny"
        elif PRESETS[args.model].num_experts:
            toy = "smoke-tiny-moe"
            PRESETS[toy] = smoke_moe_config(PRESETS[args.model])
        args.model, args.device, args.dtype, args.torch_dtype = (
            toy,
            "cpu",
            "float32",
            torch.float32,
        )
        args.requests, args.hf_requests, args.hf_decode_tokens = min(args.requests, 12), 4, 4
        args.decode_prompt, args.decode_steps, args.eager_steps = 8, 6, 3
        args.max_running, args.chunk, args.kv_tokens, args.context = 8, 64, 4096, 256
        args.in_range, args.out_range = (4, 24), (2, 8)
        args.kv_budget_gb, args.capacity_prompt, args.capacity_output = 2**-14, 24, 8
    elif not args.dense_baseline and PRESETS[args.model].kv_lora_rank:
        args.dense_baseline = "llama-3.2-3b"
    args.hw = measure(args.device)
    log(f"hardware: {args.hw.describe()}")
    if args.kv_tokens is None:
        args.kv_tokens = default_kv_tokens(PRESETS[args.model], args.hw.free_bytes)
    return args


def kv_capacity_benches(args) -> None:
    """KV bytes per token and the most concurrent requests at a fixed KV budget: the model
    beside its dense baseline, computed and measured through the engine (kv_capacity.py)."""
    from kv_capacity import measure_capacity

    from lmprog.runtime.executor.kv_pool import KVPool
    from lmprog.runtime.models import PRESETS

    budget = int(args.kv_budget_gb * 2**30)
    per_request = args.capacity_prompt + args.capacity_output
    for name in (args.model, args.dense_baseline):
        fits = KVPool.size_for_budget(budget, PRESETS[name], args.torch_dtype) // per_request
        res = section(
            f"KV capacity, {name}: {args.kv_budget_gb:g} GB of KV, requests of "
            f"{args.capacity_prompt} + {args.capacity_output} tokens",
            lambda name=name, fits=fits: measure_capacity(
                name,
                budget_bytes=budget,
                prompt_len=args.capacity_prompt,
                output_len=args.capacity_output,
                requests=max(4, fits * 3 // 2),
                device=args.device,
                dtype=args.dtype,
                max_running=max(args.max_running, 2 * fits),
                chunk=args.chunk,
            ),  # fmt: skip
        )
        if res:
            log(
                f"   {res['bytes']:,} KV bytes/token, {res['slots']:,} slots: {res['fits']} "
                f"requests fit; peak {res['peak']} decoding together ({res['steps']} steps, "
                f"{res['retractions']} retractions, {res['wall']:.1f} s)"
            )
            ROWS.append(
                (
                    f"KV capacity {name}",
                    f"{res['peak']} concurrent",
                    f"{res['fits']} fit",
                    f"{res['bytes']:,} B/token",
                )
            )


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    if torch.cuda.is_available():
        log(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    from lmprog.runtime.models import PRESETS

    cfg = PRESETS[args.model]
    prompts, out_lens = make_workload(args.requests, cfg.vocab_size, args.in_range, args.out_range)
    hf = {}
    if not args.no_hf:
        hf = section("transformers baselines", hf_baselines, cfg, args, prompts, out_lens) or {}
    if args.quantization or args.kv_cache_dtype != "auto":  # FP8 beside bf16 (fp8_compare.py)
        compare_fp8(args, lambda a: lmprog_benches(a, prompts, out_lens, hf), ROWS, log)
    else:
        lmprog_benches(args, prompts, out_lens, hf)
    if args.dense_baseline:
        kv_capacity_benches(args)
    log("\n== summary")
    log(f"  {'benchmark':44s} {'lmprog':>16s} {'baseline':>22s}  fraction / ratio")
    for name, ours, base, frac in ROWS:
        log(f"  {name:44s} {ours:>16s} {base:>22s}  {frac}")


if __name__ == "__main__":
    main()
