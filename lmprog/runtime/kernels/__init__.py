"""Triton kernels for the runtime's hybrid batch, each with a validating wrapper and a
plain-PyTorch reference: attention (+ attention_plan, attention_ref), rmsnorm, rope,
activation, fp8, small_m, moe, lora.

Each kernel module imports triton at import time: check `triton_available()` first. On CPU
tensors they run under Triton's interpreter (TRITON_INTERPRET=1), which is how CI checks
them. Design: docs/design/attention.md.
"""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    """True when the `triton` package can be imported (its kernels may still need a GPU or
    the interpreter to run)."""
    return importlib.util.find_spec("triton") is not None


__all__ = ["triton_available"]
