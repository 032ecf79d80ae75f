"""The array operations of the sampler: the `ArrayOps` interface and its numpy form (no
torch; the torch form is arrays_torch.py, and array_ops.py picks one per array or device).

A seeded row draws the same tokens from the same logits on either path; dtypes are named by
string, reductions run over the last axis. Design: docs/design/sampling.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

Array = Any  # a numpy array or a torch tensor, as the ops at hand make them


class ArrayOps(ABC):
    """One array library on one device. Methods return new arrays unless they end in `_`
    (then they modify their first argument and return it); inputs are never modified
    otherwise. Safe from any thread (stateless but for the unseeded RNG)."""

    device: Any  # None for numpy, else the torch.device

    # ---- making arrays -----------------------------------------------------------------
    @abstractmethod
    def asarray(self, values: Sequence[Any], dtype: str) -> Array:
        """A host list as an array on the device (copied without waiting for the device)."""

    @abstractmethod
    def from_numpy(self, a: np.ndarray) -> Array:
        """A numpy array on the device (may share its memory on the host)."""

    @abstractmethod
    def zeros(self, shape: int | tuple[int, ...], dtype: str) -> Array: ...

    @abstractmethod
    def full(self, shape: int | tuple[int, ...], value: Any, dtype: str) -> Array: ...

    @abstractmethod
    def zeros_like(self, x: Array, dtype: str | None = None) -> Array: ...

    @abstractmethod
    def arange(self, n: int) -> Array:
        """int64 [n]: 0 .. n-1."""

    @abstractmethod
    def rand(self, n: int) -> Array:
        """float32 [n] uniform in [0, 1) from the library's default RNG (unseeded rows)."""

    @abstractmethod
    def stack(self, rows: Sequence[Array]) -> Array: ...

    # ---- what arrays are ----------------------------------------------------------------
    @abstractmethod
    def is_array(self, x: Any) -> bool:
        """Whether `x` is an array of this library."""

    @abstractmethod
    def dtype_name(self, x: Array) -> str:
        """ "float32", "bfloat16", "int64", "bool", ..."""

    @abstractmethod
    def astype(self, x: Array, dtype: str) -> Array:
        """`x` in `dtype` (`x` itself when it already is)."""

    @abstractmethod
    def copy(self, x: Array) -> Array: ...

    # ---- element-wise -------------------------------------------------------------------
    @abstractmethod
    def where(self, cond: Array, a: Array, b: Array | float | int) -> Array: ...

    @abstractmethod
    def masked_fill(self, x: Array, mask: Array, value: float | int) -> Array: ...

    @abstractmethod
    def isfinite(self, x: Array) -> Array: ...

    @abstractmethod
    def clamp(self, x: Array, lo: Any = None, hi: Any = None) -> Array: ...

    # ---- along the last axis ------------------------------------------------------------
    @abstractmethod
    def amax(self, x: Array, keepdims: bool = False) -> Array: ...

    @abstractmethod
    def sum(self, x: Array, keepdims: bool = False) -> Array: ...

    @abstractmethod
    def cumsum(self, x: Array) -> Array:
        """Float cumulative sums, accumulated as torch does on a CPU (in float64)."""

    @abstractmethod
    def argmax(self, x: Array) -> Array:
        """int64 [B]: each row's first maximum (a NaN counts as the maximum)."""

    @abstractmethod
    def softmax(self, x: Array) -> Array: ...

    @abstractmethod
    def log_softmax(self, x: Array) -> Array: ...

    @abstractmethod
    def topk(self, x: Array, k: int) -> tuple[Array, Array]:
        """(values, int64 indices) [B, k] of each row's k largest, in descending order."""

    @abstractmethod
    def searchsorted(self, cdf: Array, target: Array) -> Array:
        """int64 [B]: per row, the first index i with cdf[b, i] >= target[b] (rows sorted)."""

    # ---- indexing -----------------------------------------------------------------------
    @abstractmethod
    def take_along(self, x: Array, idx: Array) -> Array:
        """[B, K]: x[b, idx[b, j]]."""

    @abstractmethod
    def scatter_(self, x: Array, idx: Array, values: Array | float) -> Array:
        """x[b, idx[b, j]] = values[b, j] (or the scalar), in place."""

    @abstractmethod
    def index_put_(self, x: Array, rows: Array, cols: Array, values: Array) -> Array:
        """x[rows[n], cols[n]] = values[n], in place (pairs distinct)."""

    @abstractmethod
    def index_copy_(self, x: Array, rows: Array, values: Array) -> Array:
        """x[rows[n]] = values[n] along the first axis, in place."""


_NP_DTYPES = {"float32": np.float32, "int64": np.int64, "int32": np.int32, "bool": np.bool_}


class NumpyOps(ArrayOps):
    """numpy arrays on the host (float32 logits)."""

    device = None

    def __init__(self) -> None:
        self._rng = np.random.default_rng()

    def asarray(self, values: Sequence[Any], dtype: str) -> Array:
        return np.array(values, dtype=_NP_DTYPES[dtype])

    def from_numpy(self, a: np.ndarray) -> Array:
        return a

    def zeros(self, shape: int | tuple[int, ...], dtype: str) -> Array:
        return np.zeros(shape, dtype=_NP_DTYPES[dtype])

    def full(self, shape: int | tuple[int, ...], value: Any, dtype: str) -> Array:
        return np.full(shape, value, dtype=_NP_DTYPES[dtype])

    def zeros_like(self, x: Array, dtype: str | None = None) -> Array:
        return np.zeros(x.shape, dtype=x.dtype if dtype is None else _NP_DTYPES[dtype])

    def arange(self, n: int) -> Array:
        return np.arange(n, dtype=np.int64)

    def rand(self, n: int) -> Array:
        return self._rng.random(n, dtype=np.float32)

    def stack(self, rows: Sequence[Array]) -> Array:
        return np.stack(rows)

    def is_array(self, x: Any) -> bool:
        return isinstance(x, np.ndarray)

    def dtype_name(self, x: Array) -> str:
        return str(x.dtype.name)

    def astype(self, x: Array, dtype: str) -> Array:
        return x.astype(_NP_DTYPES[dtype], copy=False)

    def copy(self, x: Array) -> Array:
        return x.copy()

    def where(self, cond: Array, a: Array, b: Array | float | int) -> Array:
        return np.where(cond, a, b)

    def masked_fill(self, x: Array, mask: Array, value: float | int) -> Array:
        return np.where(mask, x.dtype.type(value), x)

    def isfinite(self, x: Array) -> Array:
        return np.isfinite(x)

    def clamp(self, x: Array, lo: Any = None, hi: Any = None) -> Array:
        if lo is not None:
            x = np.maximum(x, lo)
        return x if hi is None else np.minimum(x, hi)

    def amax(self, x: Array, keepdims: bool = False) -> Array:
        return x.max(axis=-1, keepdims=keepdims)

    def sum(self, x: Array, keepdims: bool = False) -> Array:
        return x.sum(axis=-1, keepdims=keepdims)

    def cumsum(self, x: Array) -> Array:
        return np.cumsum(x, axis=-1, dtype=np.float64).astype(x.dtype)

    def argmax(self, x: Array) -> Array:
        return x.argmax(axis=-1).astype(np.int64, copy=False)

    def softmax(self, x: Array) -> Array:
        with np.errstate(invalid="ignore", divide="ignore"):  # a row of -inf: NaN, as torch
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            e *= 1.0 / e.sum(axis=-1, keepdims=True)
        return e

    def log_softmax(self, x: Array) -> Array:
        with np.errstate(invalid="ignore", divide="ignore"):
            shifted = x - x.max(axis=-1, keepdims=True)
            return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))

    def topk(self, x: Array, k: int) -> tuple[Array, Array]:
        if k >= x.shape[-1]:
            idx = np.argsort(-x, axis=-1, kind="stable")
        else:
            part = np.argpartition(-x, k - 1, axis=-1)[:, :k]
            order = np.argsort(-np.take_along_axis(x, part, axis=-1), axis=-1, kind="stable")
            idx = np.take_along_axis(part, order, axis=-1)
        idx = idx.astype(np.int64, copy=False)
        return np.take_along_axis(x, idx, axis=-1), idx

    def searchsorted(self, cdf: Array, target: Array) -> Array:
        # one binary search per row, as torch.searchsorted does (side="left")
        return np.array([np.searchsorted(c, t) for c, t in zip(cdf, target)], dtype=np.int64)

    def take_along(self, x: Array, idx: Array) -> Array:
        return np.take_along_axis(x, idx, axis=-1)

    def scatter_(self, x: Array, idx: Array, values: Array | float) -> Array:
        np.put_along_axis(x, idx, values, axis=-1)
        return x

    def index_put_(self, x: Array, rows: Array, cols: Array, values: Array) -> Array:
        x[rows, cols] = values
        return x

    def index_copy_(self, x: Array, rows: Array, values: Array) -> Array:
        x[rows] = values
        return x


NUMPY = NumpyOps()
