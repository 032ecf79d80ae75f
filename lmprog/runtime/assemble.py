"""Assembling a model for serving: the one path from a model reference to a ready module.

    net = assemble_model("smollm2-135m", device="auto", quantization=None)

Used by `lp.Runtime` and for speculative draft models: the device chosen, the weights
loaded, then the transforms applied from outside the module (the tensor-parallel shard
first, int4 / fp8, decode-sized matmul paths, fused Triton elementwise kernels).
Design: docs/design/quantization.md.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .layers.fp8_linear import Fp8Linear, quantize_fp8_
from .layers.int4 import Int4Linear, quantize_int4_
from .models import load_model
from .models.loaders.fp8 import fp8_checkpoint_scheme
from .parallel.load import load_shard

if TYPE_CHECKING:
    from .models.llama import LlamaForCausalLM

QUANTIZATIONS = (None, "int4", "fp8")


def choose_device(device: str | torch.device) -> torch.device:
    """ "auto" is CUDA when available, else the CPU; anything else must exist."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown device {device!r}; use 'auto', 'cpu' or 'cuda[:N]'") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available; use 'cpu'")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r}; use 'auto', 'cpu' or 'cuda[:N]'")
    return dev


def choose_attention(attention: str, device: torch.device) -> str:
    """ "auto": the Triton kernels on a GPU when triton is installed, else plain PyTorch."""
    if attention != "auto":
        return attention
    if device.type == "cuda":
        from .kernels import triton_available

        if triton_available():
            return "triton"
    return "torch"


def assemble_model(
    model: Any,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    load_format: str = "auto",
    attention: str = "auto",
    quantization: str | None = None,
    seed: int = 0,
    tp: Any = None,
    mmproj: str | os.PathLike[str] | None = None,
) -> LlamaForCausalLM:
    """The module for `model` (a GGUF file, an HF folder, a bundled model name or a
    ModelSource; with load_format="dummy" also an architecture preset or a ModelConfig, its
    random weights drawn with `seed`), on its device in eval mode, ready for an engine or a
    draft proposer. quantization: None, "int4" (see lmprog.runtime.layers.int4) or "fp8" (see
    lmprog.runtime.layers.fp8_linear).
    tp: this process's lmprog.runtime.parallel TPGroup: build its shard instead (on the
    group's device; `device` was resolved per rank when the group started).
    mmproj: a vision-language model's projector GGUF beside `model`, its decoder's GGUF."""

    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be None, 'int4' or 'fp8', got {quantization!r}")
    _check_fp8_checkpoint(model, load_format, quantization, tp)
    dev = choose_device(device) if tp is None else tp.device
    load: Callable[..., LlamaForCausalLM] = load_model
    if mmproj is not None:  # a GGUF decoder and its projector, never sharded (Runtime refuses)
        assert tp is None, "a vision-language model does not run under tensor parallelism"
        load = functools.partial(load_model, mmproj=mmproj)
    if tp is not None:

        def load_tp(model: Any, **kwargs: Any) -> LlamaForCausalLM:
            try:
                return load_shard(model, tp, **kwargs)
            except BaseException:  # the other ranks would wait for this one forever
                tp.close()
                raise

        load = load_tp

    net = load(
        model,
        device=dev,
        dtype=dtype,
        load_format=load_format,
        attention=choose_attention(attention, dev),
        seed=seed,
    )
    if quantization == "int4":
        quantize_int4_(net)
    if quantization == "fp8" and quantization_of(net) != "fp8":  # not an FP8 checkpoint
        quantize_fp8_(net)
    if dev.type == "cuda":
        from .layers.small_m import choose_small_m_paths_
        from .layers.triton_fused import can_fuse_elementwise, fuse_elementwise

        choose_small_m_paths_(net)  # decode-sized matmuls (FP8, bf16): the path timed fastest
        if can_fuse_elementwise(net):
            fuse_elementwise(net)
    return net


def quantization_of(net: LlamaForCausalLM) -> str | None:
    """ "fp8" or "int4" when the model's linears are, else None."""

    for module in net.modules():
        if isinstance(module, Fp8Linear):
            return "fp8"
        if isinstance(module, Int4Linear):
            return "int4"
    return None


def _check_fp8_checkpoint(model: Any, load_format: str, quantization: str | None, tp: Any) -> None:
    """An FP8 checkpoint runs as FP8 (as in vLLM); not with int4, not sharded (yet)."""
    if load_format == "dummy" or (quantization is None and tp is None):
        return

    if fp8_checkpoint_scheme(model) is None:
        return
    if quantization == "int4":
        raise ValueError("an FP8 checkpoint cannot run with quantization='int4'; use 'fp8'")
    if tp is not None:
        raise ValueError(
            "FP8 checkpoints do not load under tensor parallelism yet; use tp_size=1, or "
            "quantization='fp8' on the bf16 checkpoint (quantized after sharding)"
        )
