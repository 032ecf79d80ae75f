"""KV bytes per token, and how many requests a fixed KV budget holds (issue 19, item 3):
DeepSeek-V2-Lite's latent attention beside dense Llamas, from the configs by the runtime's
own `KVPool.bytes_per_token` / `size_for_budget`, and measured through the engine
(`bench_gpu.py --model deepseek-v2-lite` runs `measure_capacity` for the model and its
dense baseline; `--smoke` on the CPU).

    python3 bench/kv_capacity.py          # the table (no GPU, nothing built but configs)
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.models import PRESETS

TABLE = ("deepseek-v2-lite", "llama-3.2-3b", "llama-3.1-8b", "llama-2-7b")
BUDGET_GIB = 16  # the fixed KV budget of the table's last columns
CONTEXT = 4096  # tokens a request holds


def kv_row(name: str, dtype: torch.dtype = torch.bfloat16, budget_gib: float = BUDGET_GIB,
           context: int = CONTEXT) -> dict:  # fmt: skip
    """One model's KV cost: bytes per token, slots in the budget, requests of `context`
    tokens that fit at once."""
    cfg = PRESETS[name]
    slots = KVPool.size_for_budget(int(budget_gib * 2**30), cfg, dtype)
    return {
        "name": name,
        "bytes": KVPool.bytes_per_token(cfg, dtype),
        "slots": slots,
        "requests": slots // context,
    }


def measure_capacity(name: str, *, budget_bytes: int, prompt_len: int, output_len: int,
                     requests: int, device: str, dtype: str, max_running: int,
                     chunk: int) -> dict:  # fmt: skip
    """The most requests decoding in one engine step while `requests` random prompts of
    `prompt_len` tokens generate `output_len` tokens each, through a pool of the slots
    `budget_bytes` hold (the scheduler's own admission, retraction and chunking)."""
    import lmprog as lp

    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    cfg = PRESETS[name]
    slots = KVPool.size_for_budget(budget_bytes, cfg, torch_dtype)
    rt = lp.Runtime(
        model=name,
        load_format="dummy",
        device=device,
        dtype=dtype,
        attention="triton",
        cuda_graphs=False,  # capacity, not speed: no capture time
        max_total_tokens=slots,
        context_length=prompt_len + output_len,
        max_running_requests=max_running,
        max_num_batched_tokens=chunk,
    )
    peak, steps = [0], [0]
    metrics = rt.engine.metrics
    original = metrics.on_step

    def on_step(duration, fed, decodes, generated):
        peak[0], steps[0] = max(peak[0], decodes), steps[0] + 1
        original(duration, fed, decodes, generated)

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, cfg.vocab_size, (requests, prompt_len), generator=g).tolist()
    params = {"max_tokens": output_len, "ignore_eos": True, "temperature": 0.0}
    metrics.on_step = on_step
    t0 = time.perf_counter()
    try:
        results = rt.generate_offline(prompts, params)
    finally:
        metrics.on_step = original
        retractions = rt.stats().get("num_retractions", 0)
        rt.shutdown()
        del rt  # the next model needs the GPU memory
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    assert all(r.completion_tokens == output_len for r in results)
    return {
        "name": name,
        "bytes": KVPool.bytes_per_token(cfg, torch_dtype),
        "slots": slots,
        "fits": slots // (prompt_len + output_len),
        "peak": peak[0],
        "steps": steps[0],
        "retractions": retractions,
        "wall": time.perf_counter() - t0,
    }


def main() -> None:
    lite = PRESETS["deepseek-v2-lite"]
    rows = [kv_row(n) for n in TABLE]
    print(f"bf16 KV cache; {BUDGET_GIB} GiB budget; requests of {CONTEXT} tokens\n")
    print("| model | KV bytes / token | vs DeepSeek-V2-Lite | slots | requests |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        ratio = r["bytes"] / rows[0]["bytes"]
        print(f"| {r['name']} | {r['bytes']:,} | {ratio:.2f}x | {r['slots']:,} | {r['requests']} |")
    # the same model if each head cached its own K (qk_nope + qk_rope) and V (formula)
    mha = lite.num_layers * lite.num_heads * (lite.head_dim + lite.v_head_dim) * 2
    print(
        f"\nDeepSeek-V2-Lite with per-head K/V (MHA): {mha:,} bytes / token; latent: "
        f"{rows[0]['bytes']:,} ({1 - rows[0]['bytes'] / mha:.1%} smaller)"
    )


if __name__ == "__main__":
    main()
