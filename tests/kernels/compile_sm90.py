"""Compile the small-M matmul's runtime configs and the attention kernel's launch variants
for the H100/H200 (sm_90) without a GPU.

    python tests/kernels/compile_sm90.py [small_m] [attention]   (default both; TRITON_INTERPRET
                                              unset: the interpreter's @triton.jit objects
                                              cannot be compiled)

Triton lowers each kernel to a cubin for sm_90 here (its bundled ptxas; no driver needed),
which catches what its CPU interpreter accepts and a GPU compile refuses. One JSON line per
compiled variant: config, split_k, even_k, shared (bytes the compiled kernel uses),
shared_bound (SmallMConfig.shared_bytes), spills (ptxas's spill stores); for attention the
launch (extend or split), tile config, shared and spills. Exit 3: this triton cannot compile
for CUDA here (no NVIDIA backend or ptxas).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# Llama-3.1-8B's linear shapes (K, N) on a 132-SM H200, and one K no BLOCK_K divides
SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (4096, 128256), (4000, 4096)]


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
        return 2
    from lmprog.runtime.kernels import small_m

    wanted = set(sys.argv[1:]) or {"small_m", "attention"}
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(90).path
    except (ImportError, RuntimeError, AttributeError) as exc:
        print(f"no CUDA compiler in this triton: {exc}")
        return 3
    if "attention" in wanted:
        _compile_attention(ptxas)
    if "small_m" not in wanted:
        return 0
    seen = set()
    for k, n in SHAPES:
        for fp8 in (False, True):
            for config in small_m.candidate_configs(n, k, 132, fp8=fp8):
                even = k % config.block_k == 0
                if (config, even, fp8) not in seen:
                    seen.add((config, even, fp8))
                    _compile(small_m, config, even, fp8, ptxas)
    return 0


def _sm90(kernel, signature, constexprs, aligned, warps: int, stages: int, ptxas: str):
    """(shared bytes, spill stores) of `kernel` compiled for sm_90 with these arguments."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(kernel, signature, constexprs, aligned)
    options = {"num_warps": warps, "num_stages": stages}
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return compiled.metadata.shared, _spill_stores(ptxas, compiled.asm["ptx"])


def _compile(small_m, config, even: bool, fp8: bool, ptxas: str) -> None:
    constexprs = {"HAS_BIAS": not even, "W_FP8": fp8, "SPLIT_K": config.split_k,
                  "EVEN_K": even, "BLOCK_M": small_m.SMALL_M, "BLOCK_N": config.block_n,
                  "BLOCK_K": config.block_k}  # fmt: skip
    aligned = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11)}
    shared, spills = _sm90(small_m._small_m_kernel, _signature(fp8), constexprs, aligned,
                           config.num_warps, config.num_stages, ptxas)  # fmt: skip
    row = {
        "config": config.label,
        "fp8": fp8,
        "split_k": config.split_k,
        "even_k": even,
        "shared": shared,
        "shared_bound": config.shared_bytes(2),
        "spills": spills,
    }
    print(json.dumps(row), flush=True)


def _signature(fp8: bool) -> dict[str, str]:
    pointers = {"X": "*bf16", "W": "*fp8e4nv" if fp8 else "*bf16", "Bias": "*bf16",
                "Ws": "*fp32" if fp8 else "*bf16", "Y": "*bf16", "Partials": "*fp32",
                "Counters": "*i32"}  # fmt: skip
    ints = {name: "i32" for name in ("m", "n", "k", "stride_x", "k_split")}
    consts = ("HAS_BIAS", "W_FP8", "SPLIT_K", "EVEN_K", "BLOCK_M", "BLOCK_N", "BLOCK_K")
    return {**pointers, **ints, **dict.fromkeys(consts, "constexpr")}


def _compile_attention(ptxas: str) -> None:
    """The d=128 GQA-4 launches a Llama-3.1-8B step runs, at the default tile configs."""
    from lmprog.runtime.kernels import attention
    from lmprog.runtime.kernels.attention_plan import default_configs

    kernel = attention._attn_tile_kernel
    types = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "PartO": "*fp32",
             "PartLse": "*fp32", "ReqToToken": "*i32", "Mask": "*u8",
             "sm_scale_log2": "fp32", "v_scale": "fp32"}  # fmt: skip
    signature = {}
    for param in kernel.params:
        if param.is_constexpr:
            signature[param.name] = "constexpr"
        elif param.name[0].isupper():
            signature[param.name] = types.get(param.name, "*i64")
        else:
            signature[param.name] = types.get(param.name, "i32")
    # what a launch specializes on: 16-aligned pointers and strides (d=128, 8 kv heads)
    aligned = {(i,): [["tt.divisibility", 16]] for i, param in enumerate(kernel.params)
               if param.name not in attention._STEP_ARGS
               and (signature[param.name][0] == "*" or param.name.startswith("stride"))}  # fmt: skip
    extend, split = default_configs(torch.device("cuda"), 128)
    launches = [("extend", extend, False), ("split", split, False)]
    launches += [("split", dataclasses.replace(split, block_m=bm), True) for bm in (16, 64)]
    for name, cfg, is_split in launches:
        constexprs = {"NUM_Q_HEADS": 32, "GROUP": 4, "HEAD_DIM": 128, "BLOCK_D": 128,
                      "ROPE_DIM": 0, "BLOCK_R": 16, "BLOCK_M": cfg.block_m,
                      "BLOCK_N": cfg.block_n, "SPLIT": is_split, "HAS_MASK": False}  # fmt: skip
        shared, spills = _sm90(kernel, signature, constexprs, aligned, cfg.num_warps,
                               cfg.num_stages, ptxas)  # fmt: skip
        row = {"attention": name, "config": str(cfg), "kv_splits": is_split,
               "shared": shared, "spills": spills}  # fmt: skip
        print(json.dumps(row), flush=True)


def _spill_stores(ptxas: str, ptx: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "k.ptx")
        src.write_text(ptx)
        run = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", str(src), "-o", str(src) + ".o"],
                             capture_output=True, text=True, check=True)  # fmt: skip
    return sum(int(v) for v in re.findall(r"(\d+) bytes spill stores", run.stderr))


if __name__ == "__main__":
    sys.exit(main())
