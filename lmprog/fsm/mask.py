"""Token masks of constrained sequences as int32 bitmasks, the encoding of llguidance and xgrammar.

    allowed_bitmask(guides, width, device) -> int32 [B, ceil(width / 32)]   (FSM -> sampler)
    allowed_bitmask(guides, width, out=rows) the same, written into a reused host array
    apply_bitmask_(logits, bitmask)         in place: logits[b, t] = -inf where the bit is 0
    unpack_bitmask(bitmask, width)          -> bool [B, width] (draft distributions, tests)

Token t is allowed iff bit t % 32 of word t // 32 is set. `guides[b]` may be None (that row
allows everything); padding ids past the vocabulary are forbidden for constrained rows. Arrays
are torch tensors or numpy arrays (`device=None`). Design: docs/design/constraints.md.
"""

from __future__ import annotations

import ctypes
import hashlib
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from lmprog.fsm.guide import Guide, prefetch_bitmask_words, thread_scratch
from lmprog.fsm.mask_kernel import Kernel, kernel

if TYPE_CHECKING:
    import torch


def num_words(width: int) -> int:
    """Bitmask words of a row of `width` tokens."""
    return (width + 31) // 32


def allowed_bitmask(
    guides: Sequence[Guide | None], width: int, device: Any = "cpu", *, out: Any = None
) -> Any:
    """int32 [len(guides), ceil(width / 32)]: the tokens each guide allows next (None rows:
    every bit set). A new tensor on the torch `device`, or a numpy array where `device` is
    None; stacked from cached rows (never waits for the device).

    out: host memory to write the rows into instead, returned (`device` unused): a
    C-contiguous int32 CPU tensor or writable numpy array of that shape, reused from step
    to step as the peers' fills reuse theirs (one per thread: it is written in place). A
    position's first mask is computed straight into its row there."""
    if not guides:
        raise ValueError("allowed_bitmask needs at least one guide (None = unconstrained)")
    if out is not None:
        _write_rows(guides, width, *_host_rows(out, len(guides), (width + 31) >> 5))
        return out
    if device is None or device == "cpu" or getattr(device, "type", device) == "cpu":
        # a new array, written as `out` is (a first visit's mask computed into it; every
        # torch call before the computation, whose cache-cold aftermath makes each cost µs)
        host = np.empty((len(guides), (width + 31) >> 5), _I32)
        if device is None:
            _write_rows(guides, width, host, _address(host))
            return host
        tm: Any = sys.modules.get("torch")  # (an import statement costs 1 µs when imported)
        if tm is None:
            import torch as tm
        tensor = tm.from_numpy(host)
        _write_rows(guides, width, host, tensor.data_ptr())
        return tensor
    prefetch_bitmask_words(guides)
    import torch

    device = torch.device(device)
    full: torch.Tensor | None = None  # the row of an unconstrained sequence, made once
    rows = []
    for g in guides:
        if g is not None:
            rows.append(_row(g, width, device))
            continue
        if full is None:
            full = torch.full((num_words(width),), -1, dtype=torch.int32, device=device)
        rows.append(full)
    return torch.stack(rows)


def _write_rows(guides: Sequence[Guide | None], width: int, rows: np.ndarray, address: int) -> None:
    """The guides' rows written into `rows` [len(guides), ceil(width / 32)] (C-contiguous
    int32, at `address`), by each guide itself where its words span the row
    (`Guide.write_bitmask_words`)."""
    n = (width + 31) >> 5
    if len(guides) == 1:  # the decode step's case at a glance ([1, n]: the row itself)
        g = guides[0]
        if g is not None and g.index.num_words == n and width >= g.index.vocab_size:
            g.write_bitmask_words(rows, address)
            return
    else:
        prefetch_bitmask_words(guides)
    for b, g in enumerate(guides):
        if g is not None and g.index.num_words == n and width >= g.index.vocab_size:
            g.write_bitmask_words(rows[b], address + 4 * n * b)
        else:
            rows[b] = _cpu_row(g, width)


def _host_rows(out: Any, batch: int, n: int) -> tuple[np.ndarray, int]:
    """`out` as a numpy array [batch, n] and its data's address; ValueError unless it is a
    C-contiguous int32 CPU tensor, or writable numpy array, of that shape. A tensor's view
    is kept per thread for the next call with the same tensor (`.numpy()` costs 1 µs a
    step); it does not hold the tensor, and is used only while the tensor it was made for
    is alive (a weak reference) and holds those words at that address."""
    if type(out) is np.ndarray:
        if out.dtype is _I32 and out.flags.c_contiguous and out.flags.writeable:
            if out.shape == (batch, n) and n:
                return out, _address(out)
    else:
        tm = sys.modules.get("torch")
        if tm is not None and isinstance(out, tm.Tensor) and out.dtype is tm.int32:
            if out.is_cpu and out.is_contiguous() and out.shape == (batch, n) and n:
                address = out.data_ptr()
                last = getattr(_VIEWS, "last", None)
                if last is not None and last[0]() is out and last[1] == (address, batch, n):
                    return last[2], address
                words = (ctypes.c_int32 * (batch * n)).from_address(address)
                rows = np.ctypeslib.as_array(words).reshape(batch, n)
                _VIEWS.last = (weakref.ref(out), (address, batch, n), rows)
                return rows, address
    raise ValueError(
        f"out must be a C-contiguous, writable int32 host array of shape {(batch, n)}, "
        f"got {type(out).__name__} {getattr(out, 'dtype', '')} "
        f"{tuple(getattr(out, 'shape', ()))}"
    )


_VIEWS = threading.local()  # .last: (a weak reference to a tensor, its layout, its view)


def apply_bitmask_(logits: Any, bitmask: Any) -> Any:
    """Set every logit whose bit is 0 to -inf, in place; returns `logits` [B, V] (floating,
    V <= 32 * words). bitmask: int32 [B, words], of the logits' kind (a torch tensor on
    their device, or a numpy array). (A forbidden logit that is NaN or +inf may end NaN.)"""
    # The host's decode step at a glance (what check_bitmask would find, in order): float32
    # logits [B, V] and int32 words [B, ceil(V / 32)], numpy arrays or CPU tensors.
    host = type(logits) is np.ndarray
    if host:
        fast = type(bitmask) is np.ndarray and logits.dtype is _F32 and bitmask.dtype is _I32
    else:
        tm = sys.modules.get("torch")  # (a numpy caller never imports it here)
        fast = (
            tm is not None
            and type(logits) is tm.Tensor
            and type(bitmask) is tm.Tensor
            and logits.dtype is tm.float32
            and bitmask.dtype is tm.int32
            and logits.is_cpu
            and bitmask.is_cpu
        )
    if (
        fast
        and logits.ndim == 2
        and bitmask.shape == (logits.shape[0], (logits.shape[1] + 31) >> 5)
    ):
        k = kernel()
        if k is None or not (
            _select_numpy(k, logits, bitmask)
            if host
            else _select_torch(k, logits, bitmask, _F32_NEG_INF)
        ):
            _apply_numpy(*((logits, bitmask) if host else (logits.numpy(), bitmask.numpy())))
        return logits
    check_bitmask(logits, bitmask)
    if isinstance(logits, np.ndarray):
        if logits.dtype != np.float32:
            raise ValueError(f"numpy logits must be float32, got {logits.dtype}")
        _apply_numpy(logits, bitmask)
        return logits
    import torch

    if logits.device.type == "cpu":
        k, neg = kernel(), _NEG_INF_BITS.get(str(logits.dtype))
        if k is not None and neg is not None and _select_torch(k, logits, bitmask, neg):
            return logits
        if logits.dtype == torch.float32:
            _apply_numpy(logits.numpy(), bitmask.numpy())
            return logits
    batch, width = logits.shape
    lut = _lut(logits.device, logits.dtype)
    index = bitmask.contiguous().view(torch.uint8).reshape(-1).to(torch.int32)
    return logits.add_(lut.index_select(0, index).view(batch, -1)[:, :width])


def unpack_bitmask(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """bool [B, width] from an int32 bitmask tensor [B, words]; the inverse of `allowed_bitmask`."""
    import torch

    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask[:, :, None] >> shifts) & 1
    return bits.flatten(1)[:, :width].bool()


def check_bitmask(logits: Any, bitmask: Any) -> None:
    """ValueError/TypeError unless `bitmask` is an int32 [B, ceil(V / 32)] mask of logits [B, V]
    (both numpy arrays, or both torch tensors on one device)."""
    if isinstance(logits, np.ndarray) or isinstance(bitmask, np.ndarray):
        if not (isinstance(logits, np.ndarray) and isinstance(bitmask, np.ndarray)):
            raise TypeError("expected the logits and the bitmask both numpy or both torch")
        floating, dtype = np.issubdtype(logits.dtype, np.floating), bitmask.dtype.name
    else:
        import torch

        if not isinstance(logits, torch.Tensor) or not isinstance(bitmask, torch.Tensor):
            raise TypeError("expected torch tensors of logits and of the bitmask")
        floating, dtype = logits.dtype.is_floating_point, str(bitmask.dtype).removeprefix("torch.")
        if bitmask.device != logits.device:
            raise ValueError(f"the bitmask is on {bitmask.device}, the logits on {logits.device}")
    if logits.ndim != 2 or not floating:
        raise ValueError(
            f"expected 2-D floating logits, got shape {tuple(logits.shape)} dtype {logits.dtype}"
        )
    want = (logits.shape[0], num_words(logits.shape[1]))
    if dtype != "int32" or tuple(bitmask.shape) != want:
        raise ValueError(
            f"the bitmask must be int32 of shape {want} (one bit per logit), got "
            f"{bitmask.dtype} {tuple(bitmask.shape)}"
        )


# ---- applying -----------------------------------------------------------------------------
# _BYTE_BIAS[byte] = the 8 additive biases of the 8 tokens a mask byte covers (bit i -> token
# 8 * byte_index + i): 0 where the bit is set, -inf elsewhere.
_BYTE_BIAS = np.where((np.arange(256)[:, None] >> np.arange(8)) & 1, 0.0, -np.inf).astype(
    np.float32
)
_BYTE_BIAS.flags.writeable = False
_F32, _I32 = np.dtype(np.float32), np.dtype(np.int32)  # (native byte order)
_LUTS: dict[tuple[Any, Any], Any] = {}  # (torch device, dtype) -> the table there


def _select_torch(k: Kernel, x: torch.Tensor, words: torch.Tensor, neg: int) -> bool:
    """The compiled select on CPU logits [B, V] whose -inf has the bits `neg` (False, nothing
    done: rows not of unit stride)."""
    rows, width = x.shape
    if x.is_contiguous() and words.is_contiguous():
        if rows == 1 and neg == _F32_NEG_INF:
            k.row_f32(x.data_ptr(), words.data_ptr(), width)
        else:
            k.rows[8 * x.element_size()](
                x.data_ptr(), words.data_ptr(), width, rows, width, words.shape[1], neg
            )
        return True
    if x.stride(1) != 1 or words.stride(1) != 1:
        return False
    k.rows[8 * x.element_size()](
        x.data_ptr(), words.data_ptr(), width, rows, x.stride(0), words.stride(0), neg
    )
    return True


def _select_numpy(k: Kernel, x: np.ndarray, words: np.ndarray) -> bool:
    """The compiled select on numpy float32 logits [B, V] (False, nothing done: read-only
    logits, for numpy's error, or rows not of unit stride)."""
    rows, width = x.shape
    if not x.flags.writeable or not x.size:
        return not x.size
    if x.flags.c_contiguous and words.flags.c_contiguous:
        px = _address(x)
        pw = _address(words) if words.flags.writeable else words.ctypes.data
        if rows == 1:
            k.row_f32(px, pw, width)
        else:
            k.rows[32](px, pw, width, rows, width, words.shape[1], _F32_NEG_INF)
        return True
    (xs, x1), (ws, w1) = x.strides, words.strides
    if x1 != 4 or w1 != 4 or xs % 4 or ws % 4:
        return False
    k.rows[32](x.ctypes.data, words.ctypes.data, width, rows, xs >> 2, ws >> 2, _F32_NEG_INF)
    return True


def _address(a: Any) -> int:
    """A writable C-contiguous array's address (0.5 us; `.ctypes.data` costs 1.4)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(a))


# -inf's bits per float type, for the compiled select
_F32_NEG_INF = 0xFF800000
_NEG_INF_BITS = {
    "torch.float32": _F32_NEG_INF,
    "torch.float16": 0xFC00,
    "torch.bfloat16": 0xFF80,
    "torch.float64": 0xFFF0000000000000,
}


def _apply_numpy(x: np.ndarray, words: np.ndarray) -> None:
    # Without the kernel: a row at a time, through a scratch row of biases per thread (a new
    # [V] temporary each time is a fresh allocation's page faults); in a batch, rows with
    # every bit set (no constraint) change nothing and are skipped.
    rows = range(1) if len(words) == 1 else np.flatnonzero((words != -1).any(axis=1))
    scratch, flat = _scratch(words.shape[1])
    width = x.shape[1]
    bias = flat if width == len(flat) else flat[:width]
    for b in rows:
        # mode="clip": no bounds check (a byte indexes all 256 rows), and `out` unbuffered
        _BYTE_BIAS.take(words[b].view(np.uint8), 0, scratch, "clip")
        row = x[b]
        np.add(row, bias, out=row)


_SCRATCH = threading.local()  # .rows: {words: (float32 [4 * words, 8] scratch, its flat view)}


def _new_bias_rows(n_words: int) -> tuple[np.ndarray, np.ndarray]:
    scratch = np.empty((4 * n_words, 8), dtype=np.float32)
    return scratch, scratch.reshape(-1)


def _scratch(n_words: int) -> tuple[np.ndarray, np.ndarray]:
    return thread_scratch(_SCRATCH, n_words, _new_bias_rows)


def _lut(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    import torch

    lut: torch.Tensor | None = _LUTS.get((device, dtype))
    if lut is None:
        lut = _LUTS.setdefault(
            (device, dtype), torch.tensor(_BYTE_BIAS, dtype=dtype, device=device)
        )
    return lut


# ---- cached per-position rows -------------------------------------------------------------
# The guide caches its position's bitmask words (numpy) on the index; here each gets a device
# row per (device, width) (device None: a numpy row), shared between positions with the same
# allowed set (all the "inside a JSON string" positions of a schema share one row), so device
# memory grows with the number of distinct sets: at most ROW_CACHE_SIZE of each per (index,
# device, width).

ROW_CACHE_SIZE = 512


def _cpu_row(guide: Guide | None, width: int) -> np.ndarray:
    """A row in host memory: the position's cached words themselves where they cover the
    row (no logit past the vocabulary's words), else a padded row."""
    if guide is None:
        full = _FULL_ROWS.get(width)
        if full is None:
            full = _FULL_ROWS.setdefault(width, np.full(num_words(width), -1, dtype=np.int32))
        return full
    words = guide.bitmask_words()  # [ceil(vocab / 32)]
    n = len(words)
    # Logits as wide as the words (no id past the vocabulary's words; the usual case at a
    # glance: exactly its words' width), else a padded row.
    if width == 32 * n or (32 * n - 32 < width <= 32 * n and width >= guide.index.vocab_size):
        return words
    return _row(guide, width, None)


_FULL_ROWS: dict[int, np.ndarray] = {}  # width -> a row with every bit set


@overload
def _row(guide: Guide, width: int, device: None) -> np.ndarray: ...
@overload
def _row(guide: Guide, width: int, device: torch.device) -> Any: ...
def _row(guide: Guide, width: int, device: torch.device | None) -> Any:
    """The guide position's bitmask row: cached by position, then by allowed set, else built."""
    index, kind = guide.index, ("bitmask", device, width)
    key = "eos" if guide.eos_consumed else guide.state
    by_state = index.state_cache(kind, ROW_CACHE_SIZE)
    row = by_state.get(key) if key != -1 else None
    if row is None:
        words = guide.bitmask_words()
        digest = hashlib.blake2b(words.tobytes(), digest_size=16).digest()
        by_set = index.state_cache((*kind, "set"), ROW_CACHE_SIZE)
        row = by_set.get(digest)
        if row is None:
            row = _build_row(words, index.vocab_size, width, device)
            by_set.put(digest, row)
        if key != -1:
            by_state.put(key, row)
    return row


def _build_row(words: np.ndarray, vocab_size: int, width: int, device: torch.device | None) -> Any:
    """Words over the vocabulary -> a row of `width` bits (ids past the vocabulary: 0), on
    the torch `device` or (None) a numpy array."""
    out = np.zeros(num_words(width), dtype=np.int32)
    n = min(len(out), len(words))
    out[:n] = words[:n]
    if width < 32 * n:  # clear the bits of ids past the logits' width
        bits = np.unpackbits(out.view(np.uint8), bitorder="little")
        bits[width:] = 0
        out = np.packbits(bits, bitorder="little").view(np.int32)
    if device is None:
        out.flags.writeable = False  # shared by every position with this allowed set
        return out
    import torch

    # Pageable memory is staged at once: a non-blocking copy needs no wait for the device.
    return torch.from_numpy(out).to(device, non_blocking=True)
