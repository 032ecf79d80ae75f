"""apply_bitmask_'s host kernel: logits[b, t] = bit t set ? logits[b, t] : -inf, in one pass,
compiled on first use by the system's C compiler and loaded with ctypes.

    k = kernel()       # the loaded kernel, or None: no C compiler, or the build failed
    k.row_f32(x_address, words_address, width)            one float32 row
    k.rows[bits](x, words, width, rows, x_stride, w_stride, neg)   rows of 16/32/64-bit floats

numpy's apply is two passes over the row (a byte table's biases, then their sum) and no
numpy or torch op selects by a packed bit in one; this loop does, on the floats' bits (the
-inf of each float type is a bit pattern, `neg`): a word with every bit set is skipped, a
word of zeros is a run of -inf stores, any other is a select the compiler vectorises. Plain
C99 with no instruction-set flag (the compiler's baseline for the machine; on x86 an AVX2
clone beside it, which the CPU picks at load), built once per user into cache_dir()/kernels,
keyed by the source, the compiler and the machine, and checked on a small case when loaded.
With no compiler, or a build, load or check that fails, the caller keeps numpy's path
(logged at debug). Design: docs/design/constraints.md, "Masks".
"""

from __future__ import annotations

import contextlib
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

#if defined(LMPROG_CLONES) && defined(__x86_64__) && defined(__ELF__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

static const uint32_t BIT[32] = {
    1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,
    1u << 8,  1u << 9,  1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
    1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,
    1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};

/* One row: x[t] = bit t of w set ? x[t] : neg, for t < width (w: ceil(width / 32) words). */
#define SELECT_ROW(NAME, T)                                                         \
    static inline void NAME(T *restrict x, const uint32_t *restrict w,              \
                            int64_t width, T neg) {                                 \
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
    CLONES void NAME(T *x, const uint32_t *w, int64_t width, int64_t rows,          \
                     int64_t x_stride, int64_t w_stride, T neg) {                   \
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
CLONES void lmprog_select_f32(uint32_t *x, const uint32_t *w, int64_t width) {
    row32(x, w, width, 0xff800000u);
}
"""

_FLAGS = ["-std=c99", "-O3", "-shared", "-fPIC"]
# Tried in turn: an AVX2 clone beside the baseline, chosen by the CPU when the library loads
# (GCC/Clang's target_clones, x86 ELF only; ~1 us less on a sparse 49k row), then plain C.
_VARIANTS = [["-DLMPROG_CLONES"], []]
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
        k = _open(path)
        if k is not None:
            return k
        _log.debug("the cached mask kernel %s is unusable: building it anew", path)
    with tempfile.TemporaryDirectory(prefix="lmprog-kernel-", ignore_cleanup_errors=True) as tmp:
        for n, defines in enumerate(_VARIANTS):
            built = _compile(cc, defines, Path(tmp) / f"mask_select{n}.so")
            k = None if built is None else _open(built)
            if built is None or k is None:
                continue
            cached = _cache(built, path)  # (this process keeps its build where None)
            return k if cached is None else _open(cached) or k
    return None


def _open(path: Path) -> Kernel | None:
    """The library at `path`, if it loads and selects right on a small case."""
    try:
        k = Kernel(ctypes.CDLL(str(path)), path)
    except (OSError, AttributeError) as exc:  # a truncated or foreign file
        _log.debug("the mask kernel %s did not load: %s", path, exc)
        return None
    if not _selects_right(k):
        _log.debug("the mask kernel %s selects wrong: not used", path)
        return None
    return k


def _selects_right(k: Kernel) -> bool:
    """Each function on two rows of 70 floats: words all set, zero, mixed; tails of 6 bits."""
    words = (ctypes.c_uint32 * 6)(0xFFFFFFFF, 0x12345678, 0b10110, 0, 0x9ABCDEF0, 0xFFFFFFFF)
    keep = [words[3 * (t // 70) + t % 70 // 32] >> (t % 70 % 32) & 1 for t in range(140)]
    for bits, ctype, neg in [
        (16, ctypes.c_uint16, 0xFC00),
        (32, ctypes.c_uint32, 0xFF800000),
        (64, ctypes.c_uint64, 0xFFF0000000000000),
    ]:
        for rows in (1, 2):
            x = (ctype * 140)(*range(1, 141))
            if rows == 1 and bits == 32:
                k.row_f32(ctypes.addressof(x), ctypes.addressof(words), 70)
            else:
                k.rows[bits](ctypes.addressof(x), ctypes.addressof(words), 70, rows, 70, 3, neg)
            want = [t + 1 if t >= 70 * rows or keep[t] else neg for t in range(140)]
            if list(x) != want:
                return False
    return True


def _cache(built: Path, path: Path) -> Path | None:
    """`built` copied to `path` (atomically: another process may be writing the same file);
    None where the folder is not writable (this process keeps its own build)."""
    staged = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, staged)
        os.replace(staged, path)
        return path
    except OSError as exc:
        _log.debug("the mask kernel is not cached at %s: %s", path, exc)
        return None
    finally:
        with contextlib.suppress(OSError):  # (no staged file left behind)
            staged.unlink(missing_ok=True)


def _compile(cc: list[str], defines: list[str], out: Path) -> Path | None:
    src = out.with_suffix(".c")
    src.write_text(_SOURCE, encoding="utf-8")
    argv = [*cc, *_FLAGS, *defines, "-o", str(out), str(src)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        _log.debug("the mask kernel's compiler did not run (%s): %s", " ".join(argv), exc)
        return None
    if done.returncode != 0 or not out.exists():
        _log.debug(
            "the mask kernel did not compile (%s, exit %d): %s",
            " ".join(argv),
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
        repr(_VARIANTS),
        " ".join(cc),
        ident,
        platform.machine(),
        sys.platform,
        str(ctypes.sizeof(ctypes.c_void_p)),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
