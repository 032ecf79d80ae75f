"""Seeded random numbers for sampling, the same on every device and in any batch.

A seeded request owns a `SeededGenerator`: its uniform number i is a hash of (seed, i), so
what a row draws depends on its seed and on how many numbers it drew before, never on the
rows around it, the batch order or the device. A batch's numbers are computed together on
the host (SplitMix64 over numpy uint64, a few vectorized operations whatever the batch size)
and reach the device in one copy that does not wait for it:

    uniform i of seed s = top 24 bits of mix64(mix64(s) + (i + 1) * golden) / 2**24   in [0, 1)

(SplitMix64's i-th output from the state mix64(s).) Rows without a generator draw from
torch's default RNG on the device, as `torch.rand` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_U = {c: np.uint64(c) for c in (1, 27, 30, 31, 40, _GOLDEN, _M1, _M2)}  # numpy scalars, made once


class SeededGenerator:
    """The random numbers of one seeded request (or of its draft model): a cursor, not
    thread-safe; `take()` hands out the counter of the next number."""

    __slots__ = ("seed", "key", "drawn")

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.key = _mix64(seed & _MASK64)
        self.drawn = 0  # numbers drawn so far

    def take(self) -> int:
        """The counter of the next number (and move past it)."""
        i = self.drawn
        self.drawn = i + 1
        return i

    def __repr__(self) -> str:
        return f"SeededGenerator(seed={self.seed}, drawn={self.drawn})"


def make_generator(seed: int | None, device: object = None) -> SeededGenerator | None:
    """The generator of `seed`, or None (torch's default RNG) when seed is None. `device` is
    not used: the numbers are computed on the host and are the same on every device."""
    return None if seed is None else SeededGenerator(seed)


def uniforms(
    generators: Sequence[SeededGenerator | None] | None, n: int, device: torch.device | str
) -> torch.Tensor:
    """float32 [n] in [0, 1) on `device`, one per row: from row b's generator (which moves
    on by one) where it has one, else from torch's default RNG."""
    seeded = (
        [] if generators is None else [(b, g) for b, g in enumerate(generators) if g is not None]
    )
    if not seeded:
        return torch.rand(n, device=device)
    keys = np.fromiter((g.key for _, g in seeded), dtype=np.uint64, count=len(seeded))
    counters = np.fromiter((g.take() for _, g in seeded), dtype=np.uint64, count=len(seeded))
    u = to_device(torch.from_numpy(hashed_uniforms(keys, counters)), device)
    if len(seeded) == n:
        return u
    rows = to_device(torch.tensor([b for b, _ in seeded], dtype=torch.int64), device)
    return torch.rand(n, device=device).index_copy_(0, rows, u)


def hashed_uniforms(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """float32 uniforms in [0, 1) of (key, counter) pairs (uint64 arrays of one shape).
    Array arithmetic on uint64 wraps silently, as SplitMix64 wants."""
    z = keys + (counters + _U[1]) * _U[_GOLDEN]
    z = (z ^ (z >> _U[30])) * _U[_M1]
    z = (z ^ (z >> _U[27])) * _U[_M2]
    z ^= z >> _U[31]
    return (z >> _U[40]).astype(np.float32) * np.float32(2.0**-24)


def _mix64(z: int) -> int:
    z = (z ^ (z >> 30)) * _M1 & _MASK64
    z = (z ^ (z >> 27)) * _M2 & _MASK64
    return z ^ (z >> 31)


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on `device`; the copy from pageable memory is staged at once, so it
    need not wait for the device (a blocking copy would wait for every queued kernel)."""
    return t if torch.device(device).type == "cpu" else t.to(device, non_blocking=True)
