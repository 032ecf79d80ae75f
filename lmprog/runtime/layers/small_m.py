"""Decode-sized matmuls (up to 16 rows) on the path that timed fastest at start-up.

On CUDA, `choose_small_m_paths_` times each (K, N) layer shape on every candidate path
(cuBLAS or small_m_matmul configs; the FP8 variants) inside a CUDA graph and keeps the
fastest for calls of up to 16 rows. LMPROG_SMALL_M=0 keeps bf16/fp16 layers on cuBLAS.
Design: docs/design/quantization.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from .fp8_linear import Fp8Linear

if TYPE_CHECKING:
    from ..kernels.small_m import SmallMConfig

log = logging.getLogger(__name__)
ENV_VAR = "LMPROG_SMALL_M"  # "0": no small-M Triton kernel for bf16/fp16 layers
CHECK_TOL = 1e-2  # a config whose output is further than this from cuBLAS's is not used
Timer = Callable[[Callable[[], None]], float]
# (parent, attribute, layer) of a layer to time: an nn.Linear, or an Fp8Linear in an fp8 group
_Member = tuple[nn.Module, str, Any]


class SmallMLinear(nn.Linear):
    """An nn.Linear whose calls of up to 16 rows run kernels.small_m.small_m_matmul with
    `config`; the replaced layer's Parameters (not copies). Its split-K counters are a
    buffer outside the state_dict; its launches run on one stream, as a forward does."""

    counters: torch.Tensor  # a buffer

    def __init__(self, linear: nn.Linear, config: SmallMConfig) -> None:
        nn.Module.__init__(self)  # nn.Linear's __init__ would allocate a second weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.config = config
        counters = config.new_counters(self.out_features, linear.weight.device)
        self.register_buffer("counters", counters, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..kernels.small_m import SMALL_M, small_m_matmul

        rows = x.numel() // max(self.in_features, 1)
        if rows > SMALL_M or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(rows, self.in_features)
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
        counters = self.counters if self.config.split_k > 1 else None
        y = small_m_matmul(x2, self.weight, self.bias, config=self.config, counters=counters)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, small-M kernel {self.config.label}"


@dataclass
class ShapeTiming:
    """One shape's start-up timing: microseconds per layer for one row on each path, and
    the path its layers keep."""

    kind: str  # "fp8", "bfloat16" or "float16"
    k: int
    n: int
    layers: int
    us: dict[str, float]
    chosen: str


def choose_small_m_paths_(model: nn.Module, *, timer: Timer | None = None) -> list[ShapeTiming]:
    """Per (kind, K, N) of the model's FP8 (per-channel) and 16-bit nn.Linear layers on a
    kernel device (CUDA, or Triton's interpreter): time each path (`timer`: microseconds of
    one call of a function running every layer of the shape once; default graph_us) and keep
    the fastest for those layers' calls of up to 16 rows. Logs each shape's timings."""
    timer = timer or graph_us
    results = []
    for (kind, k, n), members in _shape_groups(model).items():
        if kind == "fp8":
            dtype = next(model.parameters()).dtype  # the activations' (the embedding's)
            x = torch.randn(1, k, device=members[0][2].weight.device, dtype=dtype)
            result = _choose_fp8([layer for _, _, layer in members], x, timer)
        else:
            result = _choose_dense(members, timer)
        results.append(result)
        times = ", ".join(f"{label} {us:.1f}" for label, us in result.us.items())
        tbs = k * n * (1 if kind == "fp8" else 2) / result.us[result.chosen] / 1e6
        log.info("small-M %s %d -> %d (%d layers), us per layer for one row: %s; kept %s "
                 "(%.2f TB/s of weights)", kind, k, n, result.layers, times, result.chosen,
                 tbs)  # fmt: skip
    return results


def _shape_groups(model: nn.Module) -> dict[tuple[str, int, int], list[_Member]]:
    """(kind, K, N) -> [(parent, attribute, layer)] of the layers this module times."""
    from ..kernels import triton_available
    from ..kernels._checks import interpreting

    dense = os.environ.get(ENV_VAR, "1") != "0" and triton_available()
    groups: dict[tuple[str, int, int], list[_Member]] = {}
    for parent in model.modules():
        for attr, child in parent.named_children():
            w = getattr(child, "weight", None)
            if not isinstance(w, torch.Tensor) or not (w.is_cuda or interpreting()):
                continue
            if isinstance(child, Fp8Linear) and child.group is None:
                kind = "fp8"
            elif type(child) is nn.Linear and dense and w.dtype in (torch.float16, torch.bfloat16):
                kind = str(w.dtype).removeprefix("torch.")
            else:
                continue
            if w.is_contiguous():
                key = (kind, child.in_features, child.out_features)
                groups.setdefault(key, []).append((parent, attr, child))
    return groups


def _choose_fp8(layers: list[Fp8Linear], x: torch.Tensor, timer: Timer) -> ShapeTiming:
    """The W8A8 paths (fused quantization, or quantize + _scaled_mm) against the weight-only
    small_m_matmul's candidate configs that compute x @ the dequantized weights."""
    from ..kernels.attention_plan import _num_sms
    from ..kernels.fp8_ref import dequantize_fp8
    from ..kernels.small_m import candidate_configs, small_m_matmul

    first = layers[0]
    n, k = first.out_features, first.in_features
    counters = torch.zeros(n, dtype=torch.int32, device=x.device)  # >= any config's tiles
    with torch.no_grad():
        want = x.float() @ dequantize_fp8(first.weight, first.weight_scale, None).t()
        configs = _checked_configs(
            "fp8", k, n, [c for c in candidate_configs(n, k, _num_sms(x.device), fp8=True)
                          if c.fits(x.element_size())], want,
            lambda c: small_m_matmul(x, first.weight, w_scale=first.weight_scale, config=c,
                                     counters=counters),
        )  # fmt: skip
    paths: dict[str, tuple[bool, SmallMConfig | None]] = {
        "fused": (True, None),
        "scaled_mm": (False, None),
        **{label: (False, config) for label, config in configs.items()},
    }

    def use(path: tuple[bool, SmallMConfig | None]) -> None:
        for layer in layers:
            layer.small_m_fused = path[0]
            layer.use_small_m(path[1])

    def run(path: tuple[bool, SmallMConfig | None]) -> Callable[[], None]:
        use(path)

        def fn() -> None:
            for layer in layers:
                layer(x)

        return fn

    us = {label: timer(run(path)) / len(layers) for label, path in paths.items()}
    chosen = min(us, key=us.__getitem__)  # a tie keeps the first: the fused kernel
    use(paths[chosen])
    return ShapeTiming("fp8", k, n, len(layers), us, chosen)


def _checked_configs(
    kind: str,
    k: int,
    n: int,
    candidates: Iterable[SmallMConfig],
    want: torch.Tensor,
    compute: Callable[[SmallMConfig], torch.Tensor],
) -> dict[str, SmallMConfig]:
    """{label: config} of the candidates whose output (`compute(config)`) is within CHECK_TOL
    of `want` (relative norm); the others are logged and left out."""
    configs: dict[str, SmallMConfig] = {}
    for config in candidates:
        got = compute(config).float()
        err = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
        if err <= CHECK_TOL:
            configs[config.label] = config
        else:
            log.warning("small-M %s %d -> %d: config %s left out (relative error %.2e)",
                        kind, k, n, config.label, err)  # fmt: skip
    return configs


def _choose_dense(members: list[_Member], timer: Timer) -> ShapeTiming:
    """cuBLAS against each candidate config that computes what cuBLAS does; the layers are
    swapped for SmallMLinear only where a config won."""
    from ..kernels.attention_plan import _num_sms  # the SMs (a small count off CUDA)
    from ..kernels.small_m import candidate_configs, small_m_matmul

    layers = [layer for _, _, layer in members]
    w0, b0 = layers[0].weight, layers[0].bias
    n, k = w0.shape
    x = torch.randn(1, k, device=w0.device, dtype=w0.dtype)
    counters = torch.zeros(n, dtype=torch.int32, device=w0.device)  # >= any config's tiles
    kind = str(w0.dtype).removeprefix("torch.")

    def run(config: SmallMConfig | None) -> Callable[[], None]:
        def fn() -> None:
            for layer in layers:
                if config is None:
                    F.linear(x, layer.weight, layer.bias)
                else:
                    small_m_matmul(x, layer.weight, layer.bias, config=config, counters=counters)

        return fn

    with torch.no_grad():
        want = F.linear(x, w0, b0).float()
        configs: dict[str, SmallMConfig | None] = {"cublas": None}
        configs |= _checked_configs(
            kind, k, n, candidate_configs(n, k, _num_sms(w0.device)), want,
            lambda c: small_m_matmul(x, w0, b0, config=c, counters=counters),
        )  # fmt: skip
        us = {label: timer(run(config)) / len(layers) for label, config in configs.items()}
    chosen = min(us, key=us.__getitem__)  # a tie keeps cuBLAS
    config = configs[chosen]
    if config is not None:
        for parent, attr, layer in members:
            setattr(parent, attr, SmallMLinear(layer, config))
    return ShapeTiming(kind, k, n, len(layers), us, chosen)


def graph_us(fn: Callable[[], None], replays: int = 10) -> float:
    """Microseconds of one fn(), replayed from a CUDA graph (after a warm-up call)."""
    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


__all__ = ["ENV_VAR", "ShapeTiming", "SmallMLinear", "choose_small_m_paths_", "graph_us"]
