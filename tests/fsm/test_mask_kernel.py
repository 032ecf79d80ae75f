"""The compiled select of apply_bitmask_ against numpy's apply and a reference, its build
(cached, rebuilt, uncached) and the fallback where no C compiler is there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import lmprog.fsm.mask as mask_module
from lmprog.fsm import mask_kernel
from lmprog.fsm.mask import apply_bitmask_, num_words

torch.set_num_threads(1)

needs_cc = pytest.mark.skipif(mask_kernel.compiler() is None, reason="no C compiler here")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """The kernel built into a fresh folder (the first use's path: compile, cache, load)."""
    if mask_kernel.compiler() is None:
        pytest.skip("no C compiler here")
    k = mask_kernel.load(tmp_path_factory.mktemp("kernels"))
    assert k is not None, "a C compiler is there, yet the kernel did not build"
    return k


def with_kernel(monkeypatch, k):
    monkeypatch.setattr(mask_module, "kernel", lambda: k)


def random_rows(rng, rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 logits [rows, width] and int32 words: rows sparse, full, empty, dense, random."""
    n = num_words(width)
    words = np.zeros((rows, n), dtype=np.int32)
    for r in range(rows):
        kind = r % 5
        if kind == 0:  # a few tokens
            words[r, rng.integers(0, n, 3)] = rng.integers(-(2**31), 2**31, 3, dtype=np.int64)
        elif kind == 1:
            words[r] = -1
        elif kind == 3:  # most tokens
            words[r] = -1
            words[r, rng.integers(0, n, max(1, n // 10))] = rng.integers(-(2**31), 2**31, 1)
        elif kind == 4:
            words[r] = rng.integers(-(2**31), 2**31, n, dtype=np.int64)
    # bits past the width are set at random too: the select must not write there
    return rng.standard_normal((rows, width)).astype(np.float32), words


def reference(logits: np.ndarray, words: np.ndarray) -> np.ndarray:
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, : logits.shape[1]]
    return np.where(bits.astype(bool), logits, np.float32(-np.inf))


WIDTHS = [1, 7, 31, 32, 33, 95, 1000, 4097, 49152 - 5, 49152]


@pytest.mark.parametrize("width", WIDTHS)
def test_compiled_equals_numpy_float32(kernel, monkeypatch, width):
    """Numpy arrays and CPU tensors, one row and a batch, widths on and off a word's end:
    the compiled select and numpy's apply give the reference's floats, bit for bit."""
    rng = np.random.default_rng(width)
    logits, words = random_rows(rng, 7, width)
    expected = reference(logits, words)
    for k in [kernel, None]:
        with_kernel(monkeypatch, k)
        for rows in [slice(0, 7), slice(2, 3), slice(4, 5)]:
            x, w = logits[rows].copy(), words[rows].copy()
            assert apply_bitmask_(x, w) is x
            assert x.tobytes() == expected[rows].tobytes(), (k, rows)
            xt = torch.from_numpy(logits[rows].copy())
            assert apply_bitmask_(xt, torch.from_numpy(w)) is xt
            assert xt.numpy().tobytes() == expected[rows].tobytes(), (k, rows)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("width", [33, 1000, 4097])
def test_compiled_other_dtypes(kernel, monkeypatch, dtype, width):
    """16- and 64-bit floats: the compiled select equals the table path (no kernel)."""
    rng = np.random.default_rng(width + 1)
    logits, words = random_rows(rng, 5, width)
    x = torch.from_numpy(logits).to(dtype)
    results = []
    for k in [kernel, None]:
        with_kernel(monkeypatch, k)
        y = x.clone()
        assert apply_bitmask_(y, torch.from_numpy(words)) is y
        results.append(y)
    assert torch.equal(results[0], results[1])
    assert np.array_equal(results[0].float().numpy(), reference(x.float().numpy(), words))


def test_compiled_on_strided_rows(kernel, monkeypatch):
    """Rows of a wider buffer (a row stride past the width), words sliced from a wider
    array; a layout the select does not take (a transposed view) falls back."""
    rng = np.random.default_rng(5)
    logits, words = random_rows(rng, 6, 1000)
    expected = reference(logits, words)
    with_kernel(monkeypatch, kernel)
    wide = np.zeros((6, 1100), np.float32)
    wide[:, :1000] = logits
    wide_words = np.zeros((6, num_words(1000) + 3), np.int32)
    wide_words[:, : num_words(1000)] = words
    x, w = wide[::2, :1000], wide_words[::2, : num_words(1000)]
    apply_bitmask_(x, w)
    assert np.array_equal(x, expected[::2]) and (wide[:, 1000:] == 0).all()
    assert np.array_equal(wide[1::2, :1000], logits[1::2])  # rows between left as they were
    xt = torch.from_numpy(logits.copy()).t().contiguous().t()  # column-major: stride(1) != 1
    apply_bitmask_(xt, torch.from_numpy(words))
    assert np.array_equal(xt.numpy(), expected)
    xt = torch.from_numpy(wide.copy())[1:4, :1000]
    apply_bitmask_(xt, torch.from_numpy(words[1:4]))
    assert np.array_equal(xt.numpy(), expected[1:4])


def test_build_is_cached_and_rebuilt(tmp_path):
    """The library is written once into the folder and loaded from there; a damaged file is
    built anew; an unwritable folder still gives this process a kernel."""
    if mask_kernel.compiler() is None:
        pytest.skip("no C compiler here")
    first = mask_kernel.load(tmp_path)
    assert first is not None and first.path.parent == tmp_path
    stamp = first.path.stat().st_mtime_ns
    again = mask_kernel.load(tmp_path)
    assert again is not None and again.path == first.path
    assert first.path.stat().st_mtime_ns == stamp  # loaded, not compiled again
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    path = damaged / first.path.name
    path.write_bytes(b"not a library")
    rebuilt = mask_kernel.load(damaged)
    assert rebuilt is not None and path.read_bytes() != b"not a library"
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a file where the folder should be: mkdir fails
    uncached = mask_kernel.load(blocked / "kernels")
    assert uncached is not None and not (blocked / "kernels").exists()
    x, w = random_rows(np.random.default_rng(0), 1, 100)
    expected = reference(x, w)
    uncached.row_f32(x.ctypes.data, w.ctypes.data, 100)
    assert np.array_equal(x, expected)


def test_no_compiler_or_a_failed_build_gives_none(tmp_path, monkeypatch, caplog):
    """No compiler on PATH, $CC naming nothing, a compiler that fails: no kernel, a debug
    line, nothing cached."""
    import logging

    caplog.set_level(logging.DEBUG, logger="lmprog.fsm.mask_kernel")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert mask_kernel.compiler() is None
    assert mask_kernel.load(tmp_path / "k") is None
    assert "no C compiler" in caplog.text
    monkeypatch.setenv("CC", "lmprog-no-such-compiler")
    assert mask_kernel.compiler() is None and mask_kernel.load(tmp_path / "k") is None
    failing = tmp_path / "bin" / "cc"
    failing.parent.mkdir()
    failing.write_text("#!/bin/sh\necho 'cc: cannot build' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    caplog.clear()
    assert mask_kernel.load(tmp_path / "k") is None
    assert "did not compile" in caplog.text and "cannot build" in caplog.text
    assert not (tmp_path / "k").exists() or not any((tmp_path / "k").iterdir())


def test_a_process_without_a_compiler_applies_with_numpy(tmp_path):
    """A fresh process with no compiler and an empty cache: apply_bitmask_ works (numpy's
    path), and no kernel is there."""
    script = (
        "import numpy as np\n"
        "from lmprog.fsm import mask_kernel\n"
        "from lmprog.fsm.mask import apply_bitmask_\n"
        "x = np.array([[1.0, 2.0, 3.0]], np.float32)\n"
        "apply_bitmask_(x, np.array([[5]], np.int32))\n"
        "assert x.tolist() == [[1.0, float('-inf'), 3.0]], x\n"
        "assert mask_kernel.kernel() is None\n"
        "print('ok')\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {
        "PATH": str(tmp_path / "empty"),
        "LMPROG_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": str(root),
        "HOME": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert not (tmp_path / "cache" / "kernels").exists()


def test_the_process_kernel_is_loaded_once(monkeypatch):
    """kernel() loads once per process, a failure included (not retried per call)."""
    calls = []
    monkeypatch.setattr(mask_kernel, "_KERNEL", mask_kernel._UNSET)
    monkeypatch.setattr(mask_kernel, "load", lambda: calls.append(1))
    assert mask_kernel.kernel() is None and mask_kernel.kernel() is None
    assert calls == [1]


def test_cache_key_follows_the_compiler(tmp_path, monkeypatch):
    """Another compiler (or flags in $CC) is another file."""
    if mask_kernel.compiler() is None:
        pytest.skip("no C compiler here")
    cc = mask_kernel.compiler()
    assert cc is not None
    a = mask_kernel._key(cc)
    assert a == mask_kernel._key(list(cc))
    assert a != mask_kernel._key([*cc, "-O2"])
    assert os.path.isabs(cc[0])


def wrapper_cc(tmp_path: Path, body: str) -> Path:
    """A C compiler command: a shell script around the real one."""
    real = mask_kernel.compiler()
    assert real is not None
    script = tmp_path / "bin" / "cc-wrapper"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f"#!/bin/sh\nREAL='{' '.join(real)}'\n{body}\n")
    script.chmod(0o755)
    return script


@needs_cc
def test_a_failed_clone_build_falls_back_to_plain_c(tmp_path, monkeypatch):
    """A compiler that refuses the AVX2 clone (no target_clones: musl, old compilers) still
    gives the plain kernel."""
    cc = wrapper_cc(
        tmp_path,
        'for a in "$@"; do [ "$a" = -DLMPROG_CLONES ] && { echo no ifunc >&2; exit 1; }; done\n'
        'exec $REAL "$@"',
    )
    monkeypatch.setenv("CC", str(cc))
    k = mask_kernel.load(tmp_path / "k")
    assert k is not None and k.path.parent == tmp_path / "k"
    x, w = random_rows(np.random.default_rng(1), 1, 1000)
    expected = reference(x, w)
    k.row_f32(x.ctypes.data, w.ctypes.data, 1000)
    assert np.array_equal(x, expected)


@needs_cc
def test_a_kernel_that_selects_wrong_is_not_used(tmp_path, monkeypatch, caplog):
    """A build whose select is wrong (here: the source changed on its way to the compiler)
    fails the load's check: no kernel, nothing cached."""
    import logging

    caplog.set_level(logging.DEBUG, logger="lmprog.fsm.mask_kernel")
    cc = wrapper_cc(
        tmp_path,
        'for a in "$@"; do case "$a" in *.c) sed -i "s/? p\\[j\\] : neg/? neg : p[j]/" "$a";; '
        "esac; done\n"
        'exec $REAL "$@"',
    )
    monkeypatch.setenv("CC", str(cc))
    assert mask_kernel.load(tmp_path / "k") is None
    assert "selects wrong" in caplog.text
    assert not (tmp_path / "k").exists()


@pytest.mark.parametrize("use_kernel", [True, False])
def test_read_only_and_empty_arrays(request, monkeypatch, use_kernel):
    """Read-only words are read; read-only logits are refused as numpy refuses them (never
    written through an address); empty batches and rows change nothing."""
    with_kernel(monkeypatch, request.getfixturevalue("kernel") if use_kernel else None)
    logits, words = random_rows(np.random.default_rng(3), 2, 100)
    expected = reference(logits, words)
    words.flags.writeable = False
    x = logits.copy()
    apply_bitmask_(x, words)
    assert np.array_equal(x, expected)
    frozen = logits.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        apply_bitmask_(frozen, words.copy())
    assert np.array_equal(frozen, logits)
    for shape in [(0, 100), (2, 0)]:
        empty = np.zeros(shape, np.float32)
        apply_bitmask_(empty, np.zeros((shape[0], num_words(shape[1])), np.int32))
        et = torch.zeros(shape)
        apply_bitmask_(et, torch.zeros((shape[0], num_words(shape[1])), dtype=torch.int32))
