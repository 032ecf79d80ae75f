"""Kernel benchmarks on a CUDA GPU: lmprog's Triton kernels beside a PyTorch baseline measured
in the same run, with the fraction of the hardware limit.

    python bench/bench_kernels.py            # defaults: the issue's shapes
    python bench/bench_kernels.py --sweep    # also time several tile configs per kernel

Shapes (issue 5): decode attention at batch 64, context 4096, 32 query / 8 KV heads, head dim
128, bf16 (target >= 75% of the copy bandwidth); causal prefill against torch SDPA (flash) on
the same shapes (target >= 0.9x); RMSNorm, SiLU-and-mul, RoPE bandwidth against eager torch.
Times are medians of triton.testing.do_bench (CUDA events, L2 flushed between runs); decode
attention is timed as a CUDA-graph replay (eager time beside it). `--smoke` runs every code
path on the CPU interpreter at toy sizes (its timings mean nothing).

Measured on the H200 (torch 2.11, triton 3.6), `python3 bench/bench_kernels.py`:
    decode 64 x 4096, shuffled slots   270 us, 3.99 TB/s = 93% of 4.28 (SDPA dense 1722 us)
    prefill 1x4096 / 4x2048 / 4x4096   303 / 327 / 362 TFLOP/s = 1.10x / 1.13x / 1.13x SDPA
    rms_norm / add_rms_norm / silu_and_mul / rope   89% / 93% / 97% / 85% of the copy rate
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEV = "cuda"  # "cpu" with --smoke: tiny shapes through Triton's interpreter, timings meaningless
DTYPE = torch.bfloat16  # fp16 with --smoke: the interpreter has no bf16
ROWS: list[tuple[str, str, str, str]] = []  # (name, lmprog, baseline, ratio / fraction)


def bench(fn) -> float:
    """Median milliseconds of fn()."""
    import triton.testing

    if DEV == "cpu":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def bench_graph(fn) -> float:
    """Median milliseconds of fn() captured in a CUDA graph: no launch overhead, as in the
    runtime's decode graphs (and a check that fn is capturable). Eager timing off the GPU."""
    if DEV != "cuda":
        return bench(fn)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench(graph.replay)


def report(name: str, ours: str, base: str, ratio: str) -> None:
    ROWS.append((name, ours, base, ratio))
    print(f"  {name:<40} {ours:>34} {base:>18} {ratio:>18}", flush=True)


def copy_bandwidth() -> float:
    """This card's device-to-device copy rate (read + write), TB/s: every bandwidth fraction
    below is of it (an H200 gave 4.28, an H100 3.05)."""
    src = torch.randn(512 * 2**20 if DEV == "cuda" else 2**16, device=DEV, dtype=torch.float16)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    tbs = 2 * src.numel() * 2 / ms / 1e9
    report("device copy (read + write)", f"{tbs:.2f} TB/s", "measured now", "")
    return tbs


def paged_pool(batch, ctx, hk, d, dtype, contiguous=False):
    """KV pool holding batch x ctx tokens; slots shuffled unless contiguous."""
    n = batch * ctx
    k = torch.randn(n + 1, hk, d, device=DEV, dtype=dtype)
    v = torch.randn_like(k)
    slots = torch.arange(n, device=DEV) if contiguous else torch.randperm(n, device=DEV)
    r2t = (slots + 1).int().view(batch, ctx)
    return k, v, r2t


def bench_decode(args, copy_tbs: float) -> None:
    from lmprog.runtime.kernels.attention_plan import TileConfig

    b, ctx, hq, hk, d, dt = args.batch, args.context, 32, 8, 128, DTYPE
    print(f"\n== decode attention: batch {b}, context {ctx}, {hq}q/{hk}kv heads, d {d}, bf16")
    nbytes = 2 * b * ctx * hk * d * 2 + 2 * b * hq * d * 2 + b * ctx * 4
    base_ms, base_out = _sdpa_decode(b, ctx, hq, hk, d, dt)
    for layout in ("shuffled", "contiguous"):
        k, v, r2t = paged_pool(b, ctx, hk, d, dt, contiguous=layout == "contiguous")
        q = base_out["q"]
        seq = torch.full((b,), ctx, device=DEV, dtype=torch.int32)
        ones = torch.ones(b, device=DEV, dtype=torch.int32)
        batch = (r2t, torch.arange(b, device=DEV, dtype=torch.int32), seq, ones,
                 torch.arange(b, device=DEV, dtype=torch.int32))  # fmt: skip
        configs = [(None, None)]
        if args.sweep and layout == "shuffled":
            configs += [(s, TileConfig(16, bn, w, st)) for s in (1, 2, 3, 4, 8)
                        for bn, w, st in ((64, 4, 2), (128, 4, 2), (128, 4, 3), (128, 2, 2),
                                          (256, 4, 2))]  # fmt: skip
        for splits, cfg in configs:
            case = (layout, q, k, v, r2t, batch, splits, cfg, nbytes, base_ms, copy_tbs)
            _guarded(cfg is not None, f"{layout} splits={splits} {cfg}", _decode_case, *case)


def bench_decode_regimes(args, copy_tbs: float) -> None:
    """The split heuristic across batch sizes and contexts: auto beside fixed split counts;
    with --sweep, small batches (the latency-bound regime) also at other tile configs."""
    from lmprog.runtime.kernels.attention_plan import TileConfig

    hq, hk, d = 32, 8, 128
    print("\n== decode attention across batch/context (split-KV count: auto vs fixed)")
    shapes = [(1, 1024), (1, 32768), (8, 4096), (32, 8192), (64, 1024), (256, 2048)]
    if DEV == "cpu":
        shapes = [(1, 64), (3, 32)]
    for b, ctx in shapes:
        k, v, r2t = paged_pool(b, ctx, hk, d, DTYPE)
        q = torch.randn(b, hq, d, device=DEV, dtype=DTYPE)
        idx = torch.arange(b, device=DEV, dtype=torch.int32)
        seq = torch.full((b,), ctx, device=DEV, dtype=torch.int32)
        batch = (r2t, idx, seq, torch.ones_like(idx), idx)
        nbytes = 2 * b * ctx * hk * d * 2 + 2 * b * hq * d * 2 + b * ctx * 4
        cases = [(s, None) for s in (None, 1, 2, 4, 8, 16)]
        if args.sweep and b <= 8:  # small batches: more splits, other tiles
            cases += [(s, TileConfig(16, bn, w, st)) for s in (None, 8, 16, 32, 64)
                      for bn, w, st in ((128, 4, 3), (64, 4, 2), (64, 2, 3), (128, 8, 2))]  # fmt: skip
        for splits, cfg in cases:
            case = (f"{b}x{ctx}", q, k, v, r2t, batch, splits, cfg, nbytes, 0.0, copy_tbs)
            _guarded(cfg is not None, f"{b}x{ctx} splits={splits} {cfg}", _decode_case, *case)
        del k, v


def bench_hybrid(args) -> None:
    """One mixed batch (a prefill chunk over a cached prefix beside many decodes): the planned
    two-launch family against sending every row through the extend launch."""
    from lmprog.runtime.kernels.attention import hybrid_attention
    from lmprog.runtime.kernels.attention_plan import plan_attention

    hq, hk, d = 32, 8, 128
    n_dec, ctx, chunk = (63, 4096, 2048) if DEV == "cuda" else (3, 64, 16)
    print(f"\n== hybrid batch: a {chunk}-token chunk over a {ctx - chunk} prefix + {n_dec} decodes"
          f" at context {ctx}")  # fmt: skip
    b = n_dec + 1
    k, v, r2t = paged_pool(b, ctx, hk, d, DTYPE)
    ext = [chunk] + [1] * n_dec
    q = torch.randn(sum(ext), hq, d, device=DEV, dtype=DTYPE)
    ext_t = torch.tensor(ext, device=DEV, dtype=torch.int32)
    batch = (r2t, torch.arange(b, device=DEV, dtype=torch.int32),
             torch.full((b,), ctx, device=DEV, dtype=torch.int32), ext_t,
             (torch.cumsum(ext_t, 0) - ext_t).int())  # fmt: skip
    times = {}
    for name, split_max in (("planned (extend + split-KV)", None), ("extend launch only", 0)):
        plan = plan_attention(*batch, num_q_heads=hq, num_kv_heads=hk, head_dim=d,
                              seq_lens_cpu=[ctx] * b, extend_lens_cpu=ext,
                              split_max_tokens=split_max)  # fmt: skip
        out = torch.empty_like(q)
        times[name] = bench_graph(lambda: hybrid_attention(q, k, v, plan, out=out))
    ours, base = times.values()
    report(
        "hybrid batch, planned vs extend-only",
        f"{ours * 1e3:.0f}us",
        f"{base * 1e3:.0f}us",
        f"{base / ours:.2f}x",
    )


def _guarded(sweeping: bool, name: str, fn, *args) -> None:
    """Run one benchmark case; a swept config that fails (e.g. too much shared memory) is
    reported and skipped, a default one fails the run."""
    try:
        fn(*args)
    except Exception as e:  # reported, and re-raised for the defaults
        if not sweeping:
            raise
        report(name, f"failed: {type(e).__name__}", "", "")


def _decode_case(layout, q, k, v, r2t, batch, splits, cfg, nbytes, base_ms, copy_tbs):
    from lmprog.runtime.kernels.attention import hybrid_attention
    from lmprog.runtime.kernels.attention_plan import plan_attention

    b, ctx = r2t.shape
    plan = plan_attention(*batch, num_q_heads=q.shape[1], num_kv_heads=k.shape[1],
                          head_dim=q.shape[2], seq_lens_cpu=[ctx] * b,
                          extend_lens_cpu=[1] * b, num_kv_splits=splits,
                          split_config=cfg)  # fmt: skip
    out = torch.empty_like(q)
    hybrid_attention(q, k, v, plan, out=out)
    if splits is None and base_ms:
        _check_decode(q, k, v, r2t, out)
    eager_ms = bench(lambda: hybrid_attention(q, k, v, plan, out=out))
    ms = bench_graph(lambda: hybrid_attention(q, k, v, plan, out=out))
    tbs = nbytes / ms / 1e9
    c = plan.split.config
    auto = "auto " if splits is None else ""
    name = f"{layout} {auto}splits={plan.split.num_splits} n={c.block_n} w={c.num_warps} s={c.num_stages}"
    base = f"sdpa {base_ms * 1e3:.0f}us" if splits is None and base_ms else ""
    report(
        name,
        f"{ms * 1e3:.0f}us {tbs:.2f}TB/s (eager {eager_ms * 1e3:.0f}us)",
        base,
        f"{tbs / copy_tbs:.1%} of copy {copy_tbs:.2f}",
    )


def _sdpa_decode(b, ctx, hq, hk, d, dt):
    """Baseline: SDPA over a dense [b, hq, ctx, d] cache (KV repeated over the q group, as
    transformers does), flash backend where it accepts the shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(b, hq, d, device=DEV, dtype=dt)
    kd = torch.randn(b, hk, ctx, d, device=DEV, dtype=dt).repeat_interleave(hq // hk, 1)
    vd = torch.randn_like(kd)
    with sdpa_kernel(_backends(SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)):
        ms = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q[:, :, None], kd, vd))
    return ms, {"q": q}


def _check_decode(q, k, v, r2t, out):
    """Compare 8 requests against dense fp32 attention."""
    for i in range(0, q.shape[0], max(1, q.shape[0] // 8)):
        kk = k[r2t[i].long()].float().repeat_interleave(q.shape[1] // k.shape[1], 1)
        vv = v[r2t[i].long()].float().repeat_interleave(q.shape[1] // k.shape[1], 1)
        p = torch.einsum("hd,shd->hs", q[i].float(), kk).mul(q.shape[-1] ** -0.5).softmax(-1)
        ref = torch.einsum("hs,shd->hd", p, vv)
        err = ((out[i].float() - ref).norm() / ref.norm()).item()
        assert err < 2e-2, f"decode output off the reference: rel err {err:.3g}"


def bench_prefill(args) -> None:
    from lmprog.runtime.kernels.attention_plan import TileConfig

    hq, hk, d, dt = 32, 8, 128, DTYPE
    print(f"\n== causal prefill attention: {hq}q/{hk}kv heads, d {d}, bf16, vs SDPA flash")
    for b, s in args.prefill:
        k, v, r2t = paged_pool(b, s, hk, d, dt)
        q = torch.randn(b * s, hq, d, device=DEV, dtype=dt)
        lens = torch.full((b,), s, device=DEV, dtype=torch.int32)
        idx = torch.arange(b, device=DEV, dtype=torch.int32)
        batch = (r2t, idx, lens, lens, idx * s)
        flops = 4 * b * hq * d * s * (s + 1) / 2
        # the same data, dense, for SDPA: [b, h, s, d]
        qd = q.view(b, s, hq, d).transpose(1, 2)
        kd = k[r2t.long()].permute(0, 2, 1, 3).contiguous()  # [b, hk, s, d]
        vd = v[r2t.long()].permute(0, 2, 1, 3).contiguous()
        sdpa, kd, vd = _sdpa_prefill(qd, kd, vd)
        base_ms = bench(sdpa)
        ref = sdpa().transpose(1, 2).reshape(b * s, hq, d)
        configs = [None]
        if args.sweep:
            configs += [TileConfig(*c) for c in ((128, 64, 8, 3), (128, 128, 8, 3),
                        (128, 64, 4, 4), (128, 64, 4, 2), (128, 32, 4, 3), (128, 128, 4, 3),
                        (64, 64, 4, 4))]  # fmt: skip
        for cfg in configs:
            case = (b, s, q, k, v, batch, cfg, ref, flops, base_ms)
            _guarded(cfg is not None, f"{b}x{s} {cfg}", _prefill_case, *case)


def _prefill_case(b, s, q, k, v, batch, cfg, ref, flops, base_ms):
    from lmprog.runtime.kernels.attention import hybrid_attention
    from lmprog.runtime.kernels.attention_plan import plan_attention

    plan = plan_attention(*batch, num_q_heads=q.shape[1], num_kv_heads=k.shape[1],
                          head_dim=q.shape[2], seq_lens_cpu=[s] * b, extend_lens_cpu=[s] * b,
                          extend_config=cfg)  # fmt: skip
    out = torch.empty_like(q)
    hybrid_attention(q, k, v, plan, out=out)
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 2e-2, f"prefill output off SDPA: rel err {err:.3g}"
    ms = bench(lambda: hybrid_attention(q, k, v, plan, out=out))
    c = plan.extend.config
    name = f"{b}x{s} m={c.block_m} n={c.block_n} w={c.num_warps} s={c.num_stages}"
    report(
        name,
        f"{flops / ms / 1e9:.0f} TFLOP/s",
        f"sdpa {flops / base_ms / 1e9:.0f}",
        f"{base_ms / ms:.2f}x",
    )


def _backends(*wanted):
    """The SDPA backends to allow: the fast ones on a GPU, the math one in --smoke runs."""
    from torch.nn.attention import SDPBackend

    return list(wanted) if DEV == "cuda" else [SDPBackend.MATH]


def _sdpa_prefill(qd, kd, vd):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    f = torch.nn.functional.scaled_dot_product_attention
    flash = _backends(SDPBackend.FLASH_ATTENTION)
    try:
        with sdpa_kernel(flash):
            f(qd, kd, vd, is_causal=True, enable_gqa=True)

        def run():
            with sdpa_kernel(flash):
                return f(qd, kd, vd, is_causal=True, enable_gqa=True)

        print("  (SDPA flash with enable_gqa)")
        return run, kd, vd
    except RuntimeError:
        g = qd.shape[1] // kd.shape[1]
        kd, vd = kd.repeat_interleave(g, 1), vd.repeat_interleave(g, 1)

        def run():
            with sdpa_kernel(flash):
                return f(qd, kd, vd, is_causal=True)

        print("  (SDPA flash over KV repeated to the q heads)")
        return run, kd, vd


def bench_elementwise(args, copy_tbs: float) -> None:
    from lmprog.runtime.kernels.activation import silu_and_mul, silu_and_mul_ref
    from lmprog.runtime.kernels.rmsnorm import add_rms_norm, rms_norm, rms_norm_ref
    from lmprog.runtime.kernels.rope import apply_rope, apply_rope_ref, cos_sin_cache

    t, h, inter, dt = args.tokens, 4096, 14336, DTYPE
    print(f"\n== elementwise kernels, {t} tokens, bf16 (bandwidth = bytes read + written)")
    x = torch.randn(t, h, device=DEV, dtype=dt)
    res = torch.randn_like(x)
    w = torch.randn(h, device=DEV, dtype=dt)

    def add_norm_ref():
        s = x + res
        return rms_norm_ref(s, w), s

    _pair("rms_norm", 2 * x.numel() * 2, lambda: rms_norm(x, w), lambda: rms_norm_ref(x, w),
          copy_tbs)  # fmt: skip
    _pair("add_rms_norm", 4 * x.numel() * 2, lambda: add_rms_norm(x, res, w), add_norm_ref,
          copy_tbs)  # fmt: skip
    g = torch.randn(t, 2 * inter, device=DEV, dtype=dt)
    _pair("silu_and_mul", 3 * t * inter * 2, lambda: silu_and_mul(g), lambda: silu_and_mul_ref(g),
          copy_tbs)  # fmt: skip
    g = None  # free it before the next buffers
    q = torch.randn(t, 32, 128, device=DEV, dtype=dt)
    k = torch.randn(t, 8, 128, device=DEV, dtype=dt)
    inv = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, device=DEV) / 128))
    cache = cos_sin_cache(inv, 8192)
    pos = torch.randint(0, 8192, (t,), device=DEV)
    _pair("rope (q 32x128, k 8x128)", 2 * (q.numel() + k.numel()) * 2,
          lambda: apply_rope(q, k, pos, cache), lambda: apply_rope_ref(q, k, pos, cache),
          copy_tbs)  # fmt: skip


def _pair(name, nbytes, ours, ref, copy_tbs) -> None:
    ms, base_ms = bench(ours), bench(ref)
    tbs = nbytes / ms / 1e9
    report(
        name,
        f"{ms * 1e3:.0f}us {tbs:.2f}TB/s",
        f"torch {nbytes / base_ms / 1e9:.2f}TB/s",
        f"{base_ms / ms:.2f}x, {tbs / copy_tbs:.0%} of copy",
    )


def bench_sampling(args) -> None:
    """The one sampler (lmprog.decoding.sampler, torch ops) beside a plain torch step."""
    from lmprog.core.sampling import SamplingParams
    from lmprog.decoding.rng import make_generator
    from lmprog.decoding.sampler import SamplingTensors, sample
    from lmprog.fsm.mask import unpack_bitmask

    b, vocab = (64, 128256) if DEV == "cuda" else (2, 1000)
    print(f"\n== sampling step, batch {b}, vocab {vocab}")
    logits = torch.randn(b, vocab, device=DEV)
    words = (vocab + 31) // 32
    mask = torch.randint(-(2**31), 2**31 - 1, (b, words), dtype=torch.int32, device=DEV)
    tensors = SamplingTensors.from_params([SamplingParams(temperature=0.7)] * b, device=DEV)
    generators = [make_generator(i) for i in range(b)]
    temps = torch.full((b,), 0.7, device=DEV)

    def ours():
        return sample(logits, tensors, generators=generators, bitmask=mask).token_ids

    def base():
        allowed = unpack_bitmask(mask, vocab)
        x = logits.masked_fill(~allowed, float("-inf")) / temps[:, None]
        return torch.multinomial(x.softmax(-1), 1)

    ms, base_ms = bench(ours), bench(base)
    report(
        "mask + temperature + seeded sample",
        f"{ms * 1e3:.0f}us",
        f"torch {base_ms * 1e3:.0f}us",
        f"{base_ms / ms:.2f}x",
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=16384, help="tokens for elementwise kernels")
    p.add_argument(
        "--prefill",
        type=lambda s: [tuple(map(int, x.split("x"))) for x in s.split(",")],
        default=[(1, 4096), (4, 2048), (4, 4096)],
        help="e.g. 1x4096,4x2048",
    )
    p.add_argument("--sweep", action="store_true", help="also time other tile configs")
    p.add_argument("--only", default="decode,regimes,hybrid,prefill,elementwise,sampling")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="run the script's code paths on the CPU interpreter at tiny sizes",
    )
    args = p.parse_args()
    if args.smoke:
        global DEV, DTYPE
        DEV, DTYPE = "cpu", torch.float16
        os.environ["TRITON_INTERPRET"] = "1"
        args.batch, args.context, args.tokens, args.prefill = 4, 64, 8, [(1, 64), (2, 32)]
    elif not torch.cuda.is_available():
        sys.exit("bench_kernels needs a CUDA GPU (or --smoke)")
    torch.manual_seed(0)
    import triton

    name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)"
    print(f"{name}  torch {torch.__version__}  triton {triton.__version__}")
    only = set(args.only.split(","))
    copy_tbs = copy_bandwidth()
    for name, fn in (("decode", lambda: bench_decode(args, copy_tbs)),
                     ("regimes", lambda: bench_decode_regimes(args, copy_tbs)),
                     ("hybrid", lambda: bench_hybrid(args)),
                     ("prefill", lambda: bench_prefill(args)),
                     ("elementwise", lambda: bench_elementwise(args, copy_tbs)),
                     ("sampling", lambda: bench_sampling(args))):  # fmt: skip
        if name in only:
            fn()
            torch.cuda.empty_cache()
    print("\n== summary")
    print(f"  {'kernel':<40} {'lmprog':>34} {'baseline':>18} {'ratio/fraction':>18}")
    for row in ROWS:
        print(f"  {row[0]:<40} {row[1]:>34} {row[2]:>18} {row[3]:>18}")


if __name__ == "__main__":
    main()
