"""The runtime's CPU benchmark (issue 4), default model (SmolLM2-135M GGUF, dequantized, fp32).

Both sides run in the same process on the same weights, one after the other, and the
results are printed side by side as ratios:

  decode     batch-1 decode tokens/s: lmprog's Runtime against transformers' `generate` on a
             LlamaForCausalLM holding the very same (dequantized) tensors. Decode time is the
             difference between a 1+N-token and a 1-token generation of the same prompt, so
             neither side's prefill is counted. Target >= 1.5x. Also the Runtime with
             quantization="int4" (the same Q4_1 weights read as 4-bit codes; bf16 compute).
  batching   output tokens/s of 32 requests submitted together against one request alone
             (prefill included, radix cache flushed before each run). Target >= 8x.

    python bench/bench_runtime_cpu.py                     # torch threads: 1
    python bench/bench_runtime_cpu.py --threads 2 --decode-tokens 64 --batch 32
    python bench/bench_runtime_cpu.py --profile           # + where the decode step's time goes
"""

from __future__ import annotations

import argparse
import time

import torch

PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden press. Explain"
)


def hf_twin(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' LlamaForCausalLM with our model's tensors (fused shards split back)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model.config
    assert c.architecture == "llama" and c.rope_scaling is None
    cfg = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        max_position_embeddings=c.max_position,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_word_embeddings,
        bos_token_id=c.bos_token_id,
        eos_token_id=list(c.eos_token_ids),
    )
    hf = LlamaForCausalLM(cfg).to(torch.float32).eval()
    state = {}
    for name, tensor in model.state_dict().items():
        if ".qkv_proj." in name:
            q, k, v = tensor.split([c.q_size, c.kv_size, c.kv_size])
            for part, t in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                state[name.replace("qkv_proj", part)] = t
        elif ".gate_up_proj." in name:
            gate, up = tensor.chunk(2)
            state[name.replace("gate_up_proj", "gate_proj")] = gate
            state[name.replace("gate_up_proj", "up_proj")] = up
        else:
            state[name] = tensor
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected, (missing, unexpected)
    hf.tie_weights()
    return hf.to(dtype)


def best_of(fn, repeats: int) -> float:
    return min(fn() for _ in range(repeats))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def decode_rates(engines: dict, ids: list[int], n: int, repeats: int) -> dict[str, float]:
    """Batch-1 decode tokens/s of each engine, prefill excluded: engines[name](tokens) runs
    one greedy generation of `tokens` tokens. The engines take turns within each repeat so
    that a noisy neighbour on the machine hurts them alike; the best repeat counts."""
    best = {name: float("inf") for name in engines}
    for _ in range(repeats):
        for name, run in engines.items():
            best[name] = min(best[name], timed(lambda: run(1 + n)) - timed(lambda: run(1)))
    return {name: n / seconds for name, seconds in best.items()}


def runtime_generator(rt, ids: list[int]):
    from lmprog.core.sampling import SamplingParams

    def run(tokens: int) -> None:
        rt.flush_cache()
        rt.generate_offline(
            [ids], SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        )

    return run


def hf_generator(hf, ids: list[int]):
    x = torch.tensor([ids])
    mask = torch.ones_like(x)

    def run(tokens: int) -> None:
        with torch.inference_mode():
            hf.generate(
                x,
                attention_mask=mask,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=0,
            )

    return run


def batch_rate(rt, prompts: list[list[int]], max_tokens: int, repeats: int) -> float:
    from lmprog.core.sampling import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    def run() -> float:
        rt.flush_cache()
        return timed(lambda: rt.generate_offline(prompts, params))

    return len(prompts) * max_tokens / best_of(run, repeats)


def profile_decode(rt, ids: list[int], n: int) -> None:
    from torch.profiler import profile

    from lmprog.core.sampling import SamplingParams

    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    rt.generate_offline([ids], params)
    prof = profile()
    rt.engine.call(prof.start)  # the model runs on the engine thread: profile that thread
    rt.generate_offline([ids], params)
    rt.engine.call(prof.stop)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batch-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="both sides run in this dtype (the weights are the GGUF's, dequantized)",
    )
    ap.add_argument("--no-int4", action="store_true", help="skip the quantization='int4' runtime")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from lmprog.backends.runtime import Runtime

    t0 = time.perf_counter()
    rt = Runtime(device="cpu", dtype=args.dtype, max_total_tokens=16384, num_threads=args.threads)
    print(
        f"Runtime ready in {time.perf_counter() - t0:.1f} s (torch threads: {args.threads}, "
        f"{args.dtype})"
    )
    hf = hf_twin(rt.engine.runner.model, rt.dtype)
    runtimes = {"lmprog Runtime": rt}
    if not args.no_int4 and args.dtype == "float32":
        runtimes["lmprog Runtime int4"] = Runtime(
            device="cpu", max_total_tokens=16384, quantization="int4"
        )
    ids = rt.tokenizer.encode(PROMPT, add_special_tokens=False)
    engines = {name: runtime_generator(r, ids) for name, r in runtimes.items()}
    engines["transformers generate"] = hf_generator(hf, ids)
    for run in engines.values():  # warm-up
        run(4)

    rates = decode_rates(engines, ids, args.decode_tokens, args.repeats)
    base = rates["transformers generate"]
    print(
        f"\nbatch-1 decode ({args.decode_tokens} tokens, best of {args.repeats}; target >= 1.5x):"
    )
    for name, rate in rates.items():
        print(f"  {name:24s} {rate:8.1f} tok/s   {rate / base:5.2f}x")

    prompts = [ids[: len(ids) - i % 7] + [198 + i] for i in range(args.batch)]  # distinct tails
    print(
        f"\nthroughput ({args.batch_tokens} output tokens per request, prefill included; "
        "target >= 8x):"
    )
    for name, r in runtimes.items():
        one = batch_rate(r, prompts[:1], args.batch_tokens, args.repeats)
        many = batch_rate(r, prompts, args.batch_tokens, args.repeats)
        print(
            f"  {name:24s} batch 1 {one:7.1f} tok/s   batch {args.batch} {many:7.1f} tok/s   "
            f"{many / one:5.2f}x"
        )
    stats = rt.stats()
    print(
        f"\nengine: {stats['steps']} steps, {stats['generated_tokens']} tokens generated, "
        f"busy {stats['busy_seconds']:.1f} s, mean step "
        f"{stats['busy_seconds'] / max(1, stats['steps']) * 1e3:.1f} ms"
    )
    if args.profile:
        profile_decode(rt, ids, args.decode_tokens)
    for r in runtimes.values():
        r.shutdown()


if __name__ == "__main__":
    main()
