"""Argument checks shared by the kernel wrappers: each raises TypeError/ValueError saying what
to fix, so a bad call fails at the wrapper and never inside a kernel."""

from __future__ import annotations

import os

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    dtypes: tuple[torch.dtype, ...] | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Check one tensor argument's type, rank, dtype and device; return it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype {names}; got {t.dtype} (convert it with .to())")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other inputs are on {device}; move it")
    return t


def check_runnable(name: str, t: torch.Tensor) -> None:
    """Triton kernels need CUDA tensors, or CPU tensors under the interpreter."""
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu" and interpreting():
        return
    raise ValueError(
        f"{name} is on {t.device}: the Triton kernels need CUDA tensors (or CPU tensors with "
        "TRITON_INTERPRET=1 set before importing triton); use the PyTorch reference instead"
    )


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension; call .contiguous()")


def check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def dynamic_args(*names: str) -> dict[str, tuple[str, ...]]:
    """`triton.jit` options that stop Triton from specializing on these arguments' values
    (an int equal to 1 or divisible by 16) and alignments (a pointer divisible by 16).

    For arguments that change from step to step (lengths, split counts, per-step index
    tables that are views at arbitrary offsets): otherwise each new combination compiles
    another variant of the kernel (seconds each, in the middle of serving)."""
    import inspect

    import triton

    options: dict[str, tuple[str, ...]] = {"do_not_specialize": names}
    if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters:
        options["do_not_specialize_on_alignment"] = names
    return options


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
