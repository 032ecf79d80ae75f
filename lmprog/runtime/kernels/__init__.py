"""Triton kernels for the runtime's hybrid batch, each with a validating wrapper and a
plain-PyTorch reference.

Modules (each imports triton at import time; check `triton_available()` first):

- `attention`      hybrid (prefill chunk / decode / verify) attention over the paged KV pool:
                   `hybrid_attention`, `extend_attention`, `decode_attention`
- `attention_plan` the per-batch host-side plan (`plan_attention`), torch only, no triton
- `attention_ref`  the PyTorch reference of the same attention, no triton
- `rmsnorm`        `rms_norm` (+ fused residual add)
- `rope`           `apply_rope` in place on q and k, `cos_sin_cache`; `rope_and_store`
                   (rotary on a fused qkv + the K/V pool write, one pass)
- `activation`     `silu_and_mul`

Sampling has no kernel of its own: lmprog.decoding.sampler's torch ops serve every device.

The Triton kernels run on CUDA tensors, and on CPU tensors under Triton's interpreter
(`TRITON_INTERPRET=1` set before triton is imported), which is how CI checks them.
"""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    """True when the `triton` package can be imported (its kernels may still need a GPU or
    the interpreter to run)."""
    return importlib.util.find_spec("triton") is not None


__all__ = ["triton_available"]
