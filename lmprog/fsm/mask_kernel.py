"""apply_bitmask_'s host kernel: logits[b, t] = bit t set ? logits[b, t] : -inf, in one pass,
compiled on first use by the system's C compiler and loaded with ctypes.

    k = kernel()       # the loaded kernel, or None: no C compiler, or the build failed
    k.row_f32(x_address, words_address, width)            one float32 row
    k.rows[bits](x, words, width, rows, x_stride, w_stride, neg)   rows of 16/32/64-bit floats

numpy's apply is two passes over the row (a byte table's biases, then their sum) and no
numpy or torch op selects by a packed bit in one; this loop does, on the floats' bits (the
-inf of each float type is a bit pattern, `neg`): a word with every bit set is skipped, a
word of zeros is a run of -inf stores, any other is a select the compiler vectorises. Plain
C99 with no instruction-set flag (the compiler's baseline for the machine), built once per
user into cache_dir()/kernels, keyed by the source, the compiler and the machine; with no
compiler, or a build or load that fails, the caller keeps numpy's path (logged at debug).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from lmprog.core.cache_files import cache_dir

_log = logging.getLogger(__name__)

_SOURCE = r"""
#include <stdint.h>

static const uint32_t BIT[32] = {
    1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,
    1u << 8,  1u << 9,  1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
    1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,
    1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};

/* One row: x[t] = bit t of w set ? x[t] : neg, for t < width (w: ceil(width / 32) words). */
#define SELECT_ROW(NAME, T)                                                         \
    static void NAME(T *restrict x, const uint32_t *restrict w, int64_t width,      \
                     T neg) {                                                       \
        int64_t full = width >> 5;                                                  \
        for (int64_t k = 0; k < full; k++) {                                        \
            uint32_t m = w[k];                                                      \
            T *restrict p = x + (k << 5);                                           \
            if (m == 0xffffffffu) continue;                                         \
            if (m == 0) {                                                           \
                for (int j = 0; j < 32; j++) p[j] = neg;                            \
                continue;                                                           \
            }                                                                       \
            for (int j = 0; j < 32; j++) p[j] = (m & BIT[j]) ? p[j] : neg;          \
        }                                                                           \
        for (int64_t t = full << 5; t < width; t++)                                 \
            if (!(w[full] & BIT[t & 31])) x[t] = neg;                               \
    }

#define SELECT_ROWS(NAME, ROW, T)                                                   \
    void NAME(T *x, const uint32_t *w, int64_t width, int64_t rows,                 \
              int64_t x_stride, int64_t w_stride, T neg) {                          \
        for (int64_t r = 0; r < rows; r++)                                          \
            ROW(x + r * x_stride, w + r * w_stride, width, neg);                    \
    }

SELECT_ROW(row16, uint16_t)
SELECT_ROW(row32, uint32_t)
SELECT_ROW(row64, uint64_t)
SELECT_ROWS(lmprog_select_rows16, row16, uint16_t)
SELECT_ROWS(lmprog_select_rows32, row32, uint32_t)
SELECT_ROWS(lmprog_select_rows64, row64, uint64_t)

/* The decode step's case in three arguments (a ctypes call costs ~0.1 us an argument). */
void lmprog_select_f32(uint32_t *x, const uint32_t *w, int64_t width) {
    row32(x, w, width, 0xff800000u);
}
"""

_FLAGS = ["-std=c99", "-O3", "-shared", "-fPIC"]
_VERSION = 1  # of the functions' signatures (part of the cache key)


class Kernel:
    """The loaded library's functions, their argument types set."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self.path = path
        self.row_f32 = lib.lmprog_select_f32
        self.row_f32.argtypes, self.row_f32.restype = [p, p, i64], None
        self.rows: dict[int, Any] = {}  # bits per float -> the function
        for bits, word in [(16, ctypes.c_uint16), (32, ctypes.c_uint32), (64, ctypes.c_uint64)]:
            fn = getattr(lib, f"lmprog_select_rows{bits}")
            fn.argtypes, fn.restype = [p, p, i64, i64, i64, i64, word], None
            self.rows[bits] = fn


_LOCK = threading.Lock()
_UNSET: Any = object()
_KERNEL: Kernel | None = _UNSET


def kernel() -> Kernel | None:
    """This process's kernel: loaded from the cache, else compiled there, once (None where
    that failed; not tried again in this process)."""
    k = _KERNEL
    if k is _UNSET:
        k = _load_once()
    return k


def _load_once() -> Kernel | None:
    global _KERNEL
    with _LOCK:
        if _KERNEL is _UNSET:
            try:
                _KERNEL = load()
            except Exception as exc:  # noqa: BLE001 - an odd $CC or home: numpy's apply stays
                _log.debug("the mask kernel was not built: %s", exc)
                _KERNEL = None
        return _KERNEL


def compiler() -> list[str] | None:
    """The C compiler's command: $CC where set, else the first of cc, gcc, clang on PATH."""
    cc = os.environ.get("CC")
    if cc:
        argv = shlex.split(cc)
        found = shutil.which(argv[0]) if argv else None
        return [found, *argv[1:]] if found else None
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def load(folder: Path | None = None) -> Kernel | None:
    """The kernel from `folder` (default cache_dir()/kernels), compiled into it first where
    it is not there; None (logged at debug) where there is no compiler or a step fails."""
    cc = compiler()
    if cc is None:
        _log.debug("no C compiler (CC, cc, gcc, clang): the mask apply stays numpy's")
        return None
    folder = cache_dir() / "kernels" if folder is None else folder
    path = folder / f"mask_select-{_key(cc)}.so"
    if path.exists():
        try:
            return Kernel(ctypes.CDLL(str(path)), path)
        except (OSError, AttributeError) as exc:  # a truncated or foreign file: build anew
            _log.debug("the mask kernel %s did not load (%s): rebuilding it", path, exc)
    with tempfile.TemporaryDirectory(prefix="lmprog-kernel-", ignore_cleanup_errors=True) as tmp:
        built = _compile(cc, Path(tmp))
        if built is None:
            return None
        try:  # into the cache (atomic: another process may be building the same file)
            folder.mkdir(parents=True, exist_ok=True)
            staged = folder / f".{path.name}.{os.getpid()}-{threading.get_ident()}"
            shutil.copyfile(built, staged)
            os.replace(staged, path)
            built = path
        except OSError as exc:  # an unwritable cache: this process uses its own build
            _log.debug("the mask kernel is not cached (%s): loading it from %s", exc, built)
        try:
            return Kernel(ctypes.CDLL(str(built)), built)
        except (OSError, AttributeError) as exc:
            _log.debug("the compiled mask kernel did not load: %s", exc)
            return None


def _compile(cc: list[str], tmp: Path) -> Path | None:
    src, out = tmp / "mask_select.c", tmp / "mask_select.so"
    src.write_text(_SOURCE, encoding="utf-8")
    try:
        done = subprocess.run(
            [*cc, *_FLAGS, "-o", str(out), str(src)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        _log.debug("the mask kernel's compiler %s did not run: %s", cc, exc)
        return None
    if done.returncode != 0 or not out.exists():
        _log.debug(
            "the mask kernel did not compile (%s, exit %d): %s",
            " ".join(cc),
            done.returncode,
            done.stderr[-2000:],
        )
        return None
    return out


def _key(cc: list[str]) -> str:
    """The source, the flags, the compiler (its path, size and mtime: a new compiler builds
    anew) and the machine and Python's pointer size."""
    try:
        stat = os.stat(cc[0])
        ident = f"{stat.st_size}:{stat.st_mtime_ns}"
    except OSError:
        ident = "?"
    parts = [
        str(_VERSION),
        _SOURCE,
        " ".join(_FLAGS),
        " ".join(cc),
        ident,
        platform.machine(),
        sys.platform,
        str(ctypes.sizeof(ctypes.c_void_p)),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
