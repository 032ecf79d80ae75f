"""FP8 (e4m3) linears, applied to a loaded model from outside (`quantization="fp8"`).

    quantize_fp8_(model)              bf16/fp32 weights quantized at load (per channel)
    fp8_shells_(model, names, ...)    empty layers an FP8 checkpoint fills, then finalize_fp8_

Per-channel or block scales; activations quantized at every call. lm_head and MoE routers
stay in the model dtype. CUDA and CPU paths: docs/design/quantization.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..kernels.fp8_ref import FP8, dequantize_fp8, quantize_fp8_ref, quantize_weight_fp8

if TYPE_CHECKING:
    from ..kernels.small_m import SmallMConfig

log = logging.getLogger(__name__)
ALIGN = 16  # torch._scaled_mm wants K and N multiples of 16
# kept in the model dtype, as vLLM and SGLang keep them: the output projection, MoE routers
KEEP = frozenset({"lm_head", "gate", "shared_expert_gate"})


class Fp8Linear(nn.Module):
    """y = x @ W^T + b with W in e4m3 (docs/design/quantization.md).

    weight [N, K] e4m3; weight_scale fp32 [N] (per channel) or [N, K / group] (block);
    input_scale: None (dynamic) or the static activation scale. Parameters, so that a
    model's `load_weights` fills them by name (row slices of fused q/k/v, gate/up)."""

    use_kernels: bool | None = None  # None: the Triton/_scaled_mm path on CUDA, else PyTorch
    small_m_counters: torch.Tensor  # a buffer, registered with a small-M config
    small_m_fused: bool = True  # <= 16 rows through fp8_matmul_small_m (layers/small_m.py)
    small_m_config: SmallMConfig | None = None  # else through small_m_matmul with this config

    def __init__(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        group: int | None = None,
        input_scale: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.group = group
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale = nn.Parameter(weight_scale, requires_grad=False)
        self.input_scale = _param(input_scale)
        self.bias = _param(bias)
        self._dequantized: torch.Tensor | None = None
        self._prepare()

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, per_tensor: bool = False) -> Fp8Linear:
        """The layer's weight quantized per output channel (or with one per-tensor scale)."""
        q, scale = quantize_weight_fp8(linear.weight.detach(), per_tensor=per_tensor)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale, bias)

    @classmethod
    def empty(cls, linear: nn.Linear, *, group: int | None, static: bool) -> Fp8Linear:
        """An unfilled layer of `linear`'s shape on its device, for an FP8 checkpoint (an
        input scale per output row, one per fused shard, until finalize())."""
        n, k = linear.weight.shape
        dev = linear.weight.device
        scale_shape = (n,) if group is None else (n, -(-k // group))
        return cls(
            torch.empty((n, k), dtype=FP8, device=dev),
            torch.ones(scale_shape, dtype=torch.float32, device=dev),
            None if linear.bias is None else torch.empty_like(linear.bias),
            group=group,
            input_scale=torch.ones(n, device=dev) if static else None,
        )

    def finalize(self) -> None:
        """After loading: one input scale for the layer (the largest of its fused shards',
        as vLLM does), scales checked, the CPU's dequantized copy rebuilt."""
        with torch.no_grad():
            if self.input_scale is not None and self.input_scale.numel() > 1:
                self.input_scale = _param(self.input_scale.max().reshape(1))
            for name in ("weight_scale", "input_scale"):
                t = getattr(self, name)
                if t is not None and not bool(torch.isfinite(t).all() and (t > 0).all()):
                    raise ValueError(f"an FP8 {name} is not a positive finite number")
        self._prepare()

    def _prepare(self) -> None:
        w = self.weight
        self._dequantized = None
        if w.device.type == "cpu":  # the PyTorch path's fp32 weights, made once
            self._dequantized = dequantize_fp8(w.detach(), self.weight_scale.detach(), self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        kernels = x.is_cuda if self.use_kernels is None else self.use_kernels
        y = self._kernels(x2) if kernels else self._reference(x2)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def use_small_m(self, config: SmallMConfig | None) -> None:
        """Calls of up to 16 rows through the weight-only small_m_matmul with `config` (None:
        the W8A8 paths again); its split-K counters a buffer outside the state_dict."""
        self.small_m_config = config
        counters = (
            None if config is None else config.new_counters(self.out_features, self.weight.device)
        )
        self.register_buffer("small_m_counters", counters, persistent=False)

    def _kernels(self, x: torch.Tensor) -> torch.Tensor:
        from ..kernels.fp8 import block_fp8_matmul, fp8_matmul_small_m, quantize_fp8
        from ..kernels.small_m import SMALL_M, small_m_matmul

        x = x if x.stride(-1) == 1 else x.contiguous()
        config = self.small_m_config
        if config is not None and self.group is None and x.shape[0] <= SMALL_M:
            counters = self.small_m_counters if config.split_k > 1 else None
            y = small_m_matmul(x, self.weight, w_scale=self.weight_scale, config=config,
                               counters=counters)  # fmt: skip
        elif self.group is None and self.small_m_fused and x.shape[0] <= SMALL_M:
            w, s = self.weight, self.weight_scale
            y = fp8_matmul_small_m(x, w, s, scale=self.input_scale)
        elif self.group is not None:
            x_q, x_s = quantize_fp8(x, group=self.group)
            y = block_fp8_matmul(x_q, x_s, self.weight, self.weight_scale, self.group)
        else:
            x_q, x_s = quantize_fp8(x, scale=self.input_scale)
            y = torch._scaled_mm(
                x_q,
                self.weight.t(),
                scale_a=x_s,
                scale_b=self.weight_scale.view(1, -1),
                out_dtype=torch.bfloat16,
                use_fast_accum=True,
            )
        return y.to(x.dtype)

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        x_q, x_s = quantize_fp8_ref(x, group=self.group, scale=self.input_scale)
        w = self._dequantized
        if w is None or w.device != x.device:
            w = dequantize_fp8(self.weight, self.weight_scale, self.group)
        return (dequantize_fp8(x_q, x_s, self.group) @ w.t()).to(x.dtype)

    def extra_repr(self) -> str:
        kind = "dynamic" if self.input_scale is None else "static"
        scales = "per-channel" if self.group is None else f"blocks of {self.group}"
        return f"in={self.in_features}, out={self.out_features}, fp8 e4m3 {scales}, {kind}"


def _param(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t, requires_grad=False)


def check_fp8_device(model: nn.Module) -> None:
    """FP8 matmuls need an Ada/Hopper (compute capability 8.9+) GPU, or the CPU."""
    dev = next(model.parameters()).device
    if dev.type == "cuda" and torch.cuda.get_device_capability(dev) < (8, 9):
        name = torch.cuda.get_device_name(dev)
        raise ValueError(f"quantization='fp8' needs compute capability 8.9+ (Ada, Hopper); {name}")


def _linears(
    model: nn.Module, names: set[str] | None = None
) -> Iterator[tuple[nn.Module, str, str, nn.Linear]]:
    """(parent, attribute, qualified name, layer) of every plain nn.Linear not in KEEP."""
    for qualified, parent in model.named_modules():
        for attr, child in parent.named_children():
            name = f"{qualified}.{attr}" if qualified else attr
            if type(child) is nn.Linear and attr not in KEEP:
                if names is None or name in names:
                    yield parent, attr, name, child


def quantize_fp8_(model: nn.Module, *, per_tensor: bool = False) -> int:
    """Replace, in place, every nn.Linear of `model` but the output projection and MoE
    routers by an Fp8Linear with per-channel (or per-tensor) e4m3 weights; returns how many. A layer whose
    K or N is not a multiple of 16 stays as it is (logged)."""
    check_fp8_device(model)
    replaced, kept = 0, []
    for parent, attr, name, child in list(_linears(model)):
        if child.in_features % ALIGN or child.out_features % ALIGN:
            kept.append(name)
            continue
        setattr(parent, attr, Fp8Linear.from_linear(child, per_tensor=per_tensor))
        replaced += 1
    if kept:
        log.info("fp8: %d linears kept unquantized (K or N not a multiple of 16): %s",
                 len(kept), ", ".join(kept[:4]))  # fmt: skip
    if not replaced:
        raise ValueError("quantization='fp8': no linear layer of this model can be quantized")
    return replaced


def fp8_shells_(model: nn.Module, names: set[str], *, group: int | None, static: bool) -> None:
    """Swap the nn.Linear layers named in `names` for empty Fp8Linear layers (to be filled by
    the model's load_weights from an FP8 checkpoint, then `finalize_fp8_`)."""
    check_fp8_device(model)
    found = set()
    for parent, attr, name, child in list(_linears(model, names)):
        if group is not None and child.in_features % group:
            raise ValueError(
                f"{name}: K={child.in_features} is not a multiple of the block size {group}"
            )
        setattr(parent, attr, Fp8Linear.empty(child, group=group, static=static))
        found.add(name)
    if found != names:
        raise ValueError(
            f"the FP8 checkpoint quantizes layers this model lacks: {sorted(names - found)[:4]}"
        )


def finalize_fp8_(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, Fp8Linear):
            module.finalize()


__all__ = [
    "Fp8Linear",
    "check_fp8_device",
    "finalize_fp8_",
    "fp8_shells_",
    "quantize_fp8_",
]
