"""Thin wrappers over llama.cpp's C API (through llama-cpp-python's ctypes bindings).

Only what the backend needs: load a GGUF once (`NativeModel`), and per context
(`NativeContext`) evaluate tokens of sequence 0, read their logits, drop a tail of the KV
cache, and save/restore the sequence's state. A context tracks exactly which tokens its KV
cache holds (`tokens`); every method keeps that in sync or clears both on failure.

Nothing here is thread-safe: the pool lends a context to one request at a time.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmprog.core.errors import BackendError

logger = logging.getLogger("lmprog.backends.llamacpp")

_init_lock = threading.Lock()
_initialised: list[Any] = []  # [llama_cpp module, log callback] once initialised
_last_errors: list[str] = []  # llama.cpp's latest error log lines (to explain a failed load)


def _llama_cpp() -> Any:
    """Import llama_cpp, initialise its backend once and route its logs to `logging`."""
    with _init_lock:
        if _initialised:
            return _initialised[0]
        try:
            import llama_cpp
        except ImportError as exc:
            raise BackendError(
                "the llama.cpp backend needs llama-cpp-python: pip install 'llama-cpp-python>=0.3.2'"
            ) from exc

        @llama_cpp.llama_log_callback
        def _log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
            # ggml levels: 1 debug, 2 info, 3 warn, 4 error, 5 continuation.
            if level in (3, 4):
                if level == 4:
                    _last_errors.append(text.decode("utf-8", "replace").strip())
                    del _last_errors[:-4]
                logger.log(
                    logging.WARNING if level == 3 else logging.ERROR,
                    text.decode("utf-8", "replace").rstrip(),
                )

        llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _initialised.extend([llama_cpp, _log])  # keep the callback alive
        return llama_cpp


def supports_gpu_offload() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU (CUDA, Metal, Vulkan, ...)."""
    return bool(_llama_cpp().llama_supports_gpu_offload())


class NativeModel:
    """A loaded GGUF model; its weights are shared by every context made from it."""

    def __init__(self, path: Path, *, n_gpu_layers: int = 0, main_gpu: int | None = None):
        self.lib = lib = _llama_cpp()
        params = lib.llama_model_default_params()
        # -1 offloads every layer (llama-cpp-python's convention); main_gpu puts the whole
        # model on that one device.
        params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers == -1 else n_gpu_layers
        if main_gpu is not None:
            params.split_mode = lib.LLAMA_SPLIT_MODE_NONE
            params.main_gpu = main_gpu
        with _init_lock:
            del _last_errors[:]
            self.ptr = lib.llama_model_load_from_file(str(path).encode(), params)
            why = "; ".join(_last_errors)
        if not self.ptr:
            raise BackendError(
                f"llama.cpp could not load {path}"
                + (f": {why}" if why else " (not a valid GGUF model?)")
                + ". llama.cpp loads GGUF files of the architectures it supports; check the file "
                "is a complete GGUF (re-download or re-convert it with llama.cpp's "
                "convert_hf_to_gguf.py) or upgrade llama-cpp-python for a newer architecture"
            )
        self.path = path
        self.vocab = lib.llama_model_get_vocab(self.ptr)
        self.n_vocab: int = lib.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train: int = lib.llama_model_n_ctx_train(self.ptr)
        self.bos_token_id: int = lib.llama_vocab_bos(self.vocab)
        self.add_bos: bool = bool(lib.llama_vocab_get_add_bos(self.vocab))
        self.eog_token_ids = frozenset(
            t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(self.vocab, t)
        )

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """llama.cpp's own tokenization (used to check that the HF tokenizer agrees)."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (self.lib.llama_token * cap)()
        n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, cap, False, special)
        if n < 0:
            raise BackendError(f"llama_tokenize failed ({n})")
        return list(buf[:n])

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_model_free(self.ptr)
            self.ptr = None


class NativeContext:
    """One llama_context evaluating sequence 0; `tokens` are the tokens its KV cache holds."""

    def __init__(
        self,
        model: NativeModel,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
        n_threads_batch: int | None = None,
    ):
        lib = self.lib = model.lib
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, n_batch
        params.n_seq_max = 1
        params.n_threads = n_threads
        params.n_threads_batch = n_threads if n_threads_batch is None else n_threads_batch
        params.no_perf = True
        self.ptr = lib.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise BackendError(f"llama.cpp could not create a context of {n_ctx} tokens")
        self.model = model
        self.n_ctx: int = lib.llama_n_ctx(self.ptr)
        self.n_batch: int = lib.llama_n_batch(self.ptr)  # llama.cpp caps it at n_ctx
        self.n_vocab = model.n_vocab
        self._memory = lib.llama_get_memory(self.ptr)
        self._batch = lib.llama_batch_init(n_batch, 0, 1)
        self.tokens: list[int] = []

    # ---- evaluation ------------------------------------------------------------------------
    def eval(self, tokens: Sequence[int], logits_from: int | None = None) -> np.ndarray | None:
        """Append `tokens` to the KV cache; return the logits of tokens[logits_from:] ([n, V])."""
        assert len(self.tokens) + len(tokens) <= self.n_ctx, "caller checks the context length"
        out: list[np.ndarray] = []
        try:
            for start in range(0, len(tokens), self.n_batch):
                chunk = tokens[start : start + self.n_batch]
                first = None if logits_from is None else max(logits_from - start, 0)
                rows = self._decode(chunk, first)
                if rows is not None:
                    out.append(rows)
        except BaseException:
            self.clear()  # a failed decode may leave a partial batch behind: start clean
            raise
        return np.concatenate(out) if len(out) > 1 else (out[0] if out else None)

    def _decode(self, chunk: Sequence[int], logits_from: int | None) -> np.ndarray | None:
        b, n, pos0 = self._batch, len(chunk), len(self.tokens)
        want = logits_from is not None and logits_from < n
        b.n_tokens = n
        for i, t in enumerate(chunk):
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = want and i >= logits_from
        rc = self.lib.llama_decode(self.ptr, b)
        if rc != 0:
            raise BackendError(
                f"llama_decode failed with code {rc} at position {pos0} (context {self.n_ctx})"
            )
        self.tokens.extend(chunk)
        if not want:
            return None
        n_rows = n - logits_from
        ptr = self.lib.llama_get_logits(self.ptr)
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab)).copy()

    # ---- KV cache management ----------------------------------------------------------------
    def truncate(self, n: int) -> None:
        """Keep only the first n tokens in the KV cache."""
        if n >= len(self.tokens):
            return
        if n <= 0 or not self.lib.llama_memory_seq_rm(self._memory, 0, n, -1):
            self.clear()
            return
        del self.tokens[n:]

    def clear(self) -> None:
        self.lib.llama_memory_clear(self._memory, True)
        self.tokens = []

    def save_state(self) -> bytes:
        """The KV state of sequence 0 (it holds `self.tokens`)."""
        size = self.lib.llama_state_seq_get_size(self.ptr, 0)
        buf = (ctypes.c_uint8 * size)()
        n = self.lib.llama_state_seq_get_data(self.ptr, buf, size, 0)
        if n == 0 or n > size:
            raise BackendError("llama.cpp could not save the sequence state")
        return bytes(memoryview(buf)[:n])

    def load_state(self, blob: bytes, tokens: Sequence[int]) -> None:
        """Replace the KV cache with a saved state that holds `tokens`."""
        self.clear()
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        if self.lib.llama_state_seq_set_data(self.ptr, buf, len(blob), 0) == 0:
            self.clear()
            raise BackendError("llama.cpp could not restore a saved sequence state")
        self.tokens = list(tokens)

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_batch_free(self._batch)
            self.lib.llama_free(self.ptr)
            self.ptr = None
