"""Seeded random numbers for sampling, the same on every device and in any batch.

A seeded request's uniform i is a hash of (seed, i) (SplitMix64, vectorized on the host),
so its draws never depend on the batch or the device. Rows without a generator use the
array library's default RNG. Formula: docs/design/sampling.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .array_ops import ops_on

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
    """The generator of `seed`, or None (the default RNG) when seed is None. `device` is
    not used: the numbers are computed on the host and are the same on every device."""
    return None if seed is None else SeededGenerator(seed)


def uniforms(generators: Sequence[SeededGenerator | None] | None, n: int, device: Any) -> Any:
    """float32 [n] in [0, 1) on the torch `device` (None: a numpy array), one per row: from
    row b's generator (which moves on by one) where it has one, else from the default RNG."""
    ops = ops_on(device)
    seeded = (
        [] if generators is None else [(b, g) for b, g in enumerate(generators) if g is not None]
    )
    if not seeded:
        return ops.rand(n)
    keys = np.fromiter((g.key for _, g in seeded), dtype=np.uint64, count=len(seeded))
    counters = np.fromiter((g.take() for _, g in seeded), dtype=np.uint64, count=len(seeded))
    u = ops.from_numpy(hashed_uniforms(keys, counters))
    if len(seeded) == n:
        return u
    rows = ops.asarray([b for b, _ in seeded], "int64")
    return ops.index_copy_(ops.rand(n), rows, u)


def hashed_uniforms(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """float32 uniforms in [0, 1) of (key, counter) pairs (uint64 arrays of one shape).
    Array arithmetic on uint64 wraps silently, as SplitMix64 wants."""
    z = keys + (counters + _U[1]) * _U[_GOLDEN]
    z = (z ^ (z >> _U[30])) * _U[_M1]
    z = (z ^ (z >> _U[27])) * _U[_M2]
    z ^= z >> _U[31]
    u: np.ndarray = (z >> _U[40]).astype(np.float32) * np.float32(2.0**-24)
    return u


def _mix64(z: int) -> int:
    z = (z ^ (z >> 30)) * _M1 & _MASK64
    z = (z ^ (z >> 27)) * _M2 & _MASK64
    return z ^ (z >> 31)
