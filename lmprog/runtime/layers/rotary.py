"""Rotary position embedding (neox / rotate-half layout), with linear, Llama-3 and YaRN scaling.

cos/sin are computed once per forward from the positions (not from a table), so any position
up to the model's context works and the math matches transformers' bit for bit in fp32.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # layers never import models at runtime
    from ..models.config import RopeScaling


def inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """The fp32 inverse frequencies [head_dim // 2], after scaling."""
    even = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float()
    base = 1.0 / (theta ** (even / head_dim))
    if scaling is None:
        return base
    if scaling.rope_type == "linear":
        return base / scaling.factor
    if scaling.rope_type == "freq_factors":
        assert len(scaling.factors) == head_dim // 2, "one factor per frequency"
        return base / torch.tensor(scaling.factors, dtype=torch.float32, device="cpu")
    if scaling.rope_type == "yarn":
        return _yarn(head_dim, theta, scaling)
    return _llama3(base, scaling)


def _yarn(dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    # Frequencies that turn fewer than beta_slow times over the original context are
    # interpolated (/ factor), more than beta_fast times kept, a linear ramp between
    # (transformers' _compute_yarn_parameters, op for op).
    def correction_dim(rotations: float) -> float:
        return (
            dim
            * math.log(s.original_max_position / (rotations * 2 * math.pi))
            / (2 * math.log(theta))
        )

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = torch.arange(dim // 2, dtype=torch.float32, device="cpu")  # cpu: not under meta
    keep = 1 - ((ramp - low) / (high - low)).clamp(0, 1)  # the extrapolated frequency's share
    pos_freqs = theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    return (1.0 / (s.factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep


def _llama3(base: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Long wavelengths are divided by `factor`, short ones kept, the band between blended.
    low_wavelen = s.original_max_position / s.low_freq_factor
    high_wavelen = s.original_max_position / s.high_freq_factor
    wavelen = 2 * math.pi / base
    scaled = torch.where(wavelen > low_wavelen, base / s.factor, base)
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    """cos_sin(positions) once per step; apply(x, cos, sin) per layer on [T, heads, head_dim]."""

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self._inv_freq = inv_freq(head_dim, theta, scaling)  # plain attribute: survives meta init
        self._scale = 1.0 if scaling is None else scaling.cos_sin_scale  # YaRN's attention factor
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> (cos, signed sin), each [T, 1, head_dim] in `dtype` (fp32 math).

        The sin's first half is negated so that apply() needs no cat/neg:
        rotate_half(x) * sin == roll(x, head_dim / 2) * signed_sin.
        """
        freq = self._on_device.get(positions.device)
        if freq is None:
            freq = self._on_device.setdefault(positions.device, self._inv_freq.to(positions.device))
        angles = positions.float()[:, None] * freq[None, :]
        sin, cos = angles.sin(), angles.cos()
        if self._scale != 1.0:
            sin, cos = sin * self._scale, cos * self._scale
        cos = torch.cat((cos,) * 2, dim=-1)[:, None, :]
        return cos.to(dtype), torch.cat((-sin, sin), dim=-1)[:, None, :].to(dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """x [T, heads, head_dim] rotated by position: x * cos + rotate_half(x) * sin."""
        return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)
