"""Thin wrappers over llama.cpp's C API (through llama-cpp-python's ctypes bindings).

Only what the backend needs: load a GGUF once (`NativeModel`), and per context
(`NativeContext`) evaluate a batch of tokens of several sequences in one call, read their
logits, drop a sequence's tail, share a prefix between sequences, and save/restore one
sequence's state. A context tracks exactly which tokens its KV cache holds per sequence
(`tokens`); every method keeps that in sync or clears both on failure.

Nothing here is thread-safe: one engine thread (`llamacpp_engine.py`) drives the context.
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

# One row of a batch: (sequence id, tokens appended to it, first of them whose logits are
# wanted or None).
Row = tuple[int, Sequence[int], int | None]

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


def log_callback() -> Any:
    """The llama.cpp log callback that routes its lines to `logging` (warnings and errors
    only), for libraries beside llama.cpp that log the same way (libmtmd)."""
    _llama_cpp()
    return _initialised[1]


def take_errors() -> list[str]:
    """llama.cpp's latest error lines (to explain a failed load), forgotten here."""
    with _init_lock:
        out = list(_last_errors)
        del _last_errors[:]
    return out


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

    def load_adapter(self, path: Path) -> Any:
        """A GGUF LoRA adapter for this model (llama_adapter_lora_init); BackendError with
        llama.cpp's reason when it cannot be loaded (another architecture, a tensor of
        another shape, not a LoRA GGUF). Freed with the model or by `free_adapter`."""
        with _init_lock:
            del _last_errors[:]
            ptr = self.lib.llama_adapter_lora_init(self.ptr, str(path).encode())
            why = "; ".join(_last_errors)
        if not ptr:
            raise BackendError(
                f"llama.cpp could not load the LoRA adapter {path}"
                + (f": {why}" if why else " (not a GGUF LoRA file?)")
            )
        return ptr

    def free_adapter(self, adapter: Any) -> None:
        """Free an adapter of this model; no context may have it set."""
        with _init_lock:  # llama.cpp keeps the model's adapters in a set
            self.lib.llama_adapter_lora_free(adapter)

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_model_free(self.ptr)
            self.ptr = None


class KVFull(BackendError):
    """llama_decode found no room in the KV cells for the batch (nothing was evaluated)."""


class NativeContext:
    """One llama_context running `n_seq` sequences over one shared pool of KV cells.

    `tokens[s]` are the tokens the KV cache holds for sequence s, at positions 0..len-1;
    every method keeps them in sync, or clears everything on a failure it cannot undo.
    The KV cells are unified: a cell serves every sequence that holds it (`copy_prefix`
    shares a prefix without copying), and one sequence may use all `n_ctx` of them.
    """

    def __init__(
        self,
        model: NativeModel,
        *,
        n_ctx: int,
        n_batch: int,
        n_seq: int,
        n_threads: int,
        n_threads_batch: int | None = None,
    ):
        lib = self.lib = model.lib
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, n_batch
        params.n_seq_max = n_seq
        params.kv_unified = True
        params.n_threads = n_threads
        params.n_threads_batch = n_threads if n_threads_batch is None else n_threads_batch
        params.no_perf = True
        self.ptr = lib.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise BackendError(
                f"llama.cpp could not create a context of {n_ctx} tokens and {n_seq} sequences"
            )
        self.model = model
        self.n_ctx: int = lib.llama_n_ctx(self.ptr)
        self.n_batch: int = lib.llama_n_batch(self.ptr)  # llama.cpp caps it at n_ctx
        self.n_seq: int = lib.llama_n_seq_max(self.ptr)
        self.n_vocab = model.n_vocab
        self._threads = (params.n_threads, params.n_threads_batch)
        self._batch_threads = params.n_threads_batch
        self._memory = lib.llama_get_memory(self.ptr)
        self._batch = lib.llama_batch_init(self.n_batch, 0, 1)
        self.tokens: list[list[int]] = [[] for _ in range(self.n_seq)]
        self.adapter: Any = None  # the LoRA adapter every decode applies now (None: none)

    def set_adapter(self, adapter: Any) -> None:
        """Apply LoRA `adapter` (a NativeModel.load_adapter result) to the next decodes, or
        none. llama.cpp keeps one adapter set per context, for every sequence alike, so a
        batch runs under one adapter; a switch copies no weights."""
        if adapter is self.adapter:
            return
        lib = self.lib
        if adapter is None:
            rc = lib.llama_set_adapters_lora(self.ptr, None, 0, None)
        else:
            ptrs = (lib.llama_adapter_lora_p_ctypes * 1)(adapter)
            scales = (ctypes.c_float * 1)(1.0)  # the file's own scale (gguf_lora writes it)
            rc = lib.llama_set_adapters_lora(self.ptr, ptrs, 1, scales)
        if rc != 0:
            raise BackendError(f"llama.cpp could not set the LoRA adapter (code {rc})")
        self.adapter = adapter

    # ---- evaluation ------------------------------------------------------------------------
    def decode(self, rows: Sequence[Row], *, prompt: bool) -> np.ndarray | None:
        """Evaluate every row's tokens, appended to its sequence, in one llama_decode.

        Returns the logits [n, V] of the flagged positions (row by row, in order), or None
        if none is flagged. `prompt`: the batch evaluates prompt text (n_threads_batch
        threads) rather than one new token per sequence (n_threads). Raises KVFull, with
        nothing evaluated, when the KV cells cannot hold the batch.
        """
        b, n = self._batch, 0
        for seq, chunk, logits_from in rows:
            pos0 = len(self.tokens[seq])
            assert pos0 + len(chunk) <= self.n_ctx, "the caller checks the context length"
            for i, t in enumerate(chunk):
                b.token[n] = t
                b.pos[n] = pos0 + i
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = seq
                b.logits[n] = logits_from is not None and i >= logits_from
                n += 1
        assert 0 < n <= self.n_batch, "the caller fills at most n_batch tokens"
        b.n_tokens = n
        self._set_batch_threads(self._threads[1] if prompt else self._threads[0])
        rc = self.lib.llama_decode(self.ptr, b)
        if rc == 1:
            raise KVFull(f"the KV cache ({self.n_ctx} cells) has no room for {n} more tokens")
        if rc != 0:
            self.clear()  # a failed decode may leave part of the batch behind: start clean
            raise BackendError(f"llama_decode failed with code {rc} (context {self.n_ctx})")
        for seq, chunk, _ in rows:
            self.tokens[seq].extend(chunk)
        n_out = sum(int(b.logits[i]) for i in range(n))
        if not n_out:
            return None
        ptr = self.lib.llama_get_logits(self.ptr)
        return np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab)).copy()

    def _set_batch_threads(self, n: int) -> None:
        # llama.cpp runs a batch of more than one token on n_threads_batch threads: a batch
        # of decodes is generation, so it gets n_threads.
        if n != self._batch_threads:
            self.lib.llama_set_n_threads(self.ptr, self._threads[0], n)
            self._batch_threads = n

    def appended(self, seq: int, ids: Sequence[int]) -> None:
        """Sequence `seq` now also holds `ids` (evaluated outside `decode`: an image's
        embeddings, see llamacpp_vision.py)."""
        self.tokens[seq].extend(ids)

    def forget_tail(self, seq: int, n: int) -> None:
        """Drop whatever sequence `seq` holds from position n on, also past its tokens (a
        failed evaluation outside `decode` may leave part of its cells behind)."""
        self.lib.llama_memory_seq_rm(self._memory, seq, max(n, 0), -1)
        del self.tokens[seq][max(n, 0) :]

    # ---- KV cache management ----------------------------------------------------------------
    def truncate(self, seq: int, n: int) -> None:
        """Keep only the first n tokens of sequence `seq`."""
        if n >= len(self.tokens[seq]):
            return
        if not self.lib.llama_memory_seq_rm(self._memory, seq, max(n, 0), -1):
            raise BackendError("llama.cpp could not drop the tail of a sequence")
        del self.tokens[seq][max(n, 0) :]

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Make sequence `dst` hold the first n tokens of `src` (sharing their KV cells)."""
        assert src != dst and n <= len(self.tokens[src])
        self.truncate(dst, 0)
        self.lib.llama_memory_seq_cp(self._memory, src, dst, 0, n)
        self.tokens[dst] = self.tokens[src][:n]

    def clear(self) -> None:
        self.lib.llama_memory_clear(self._memory, True)
        self.tokens = [[] for _ in range(self.n_seq)]

    def save_state(self, seq: int) -> bytes:
        """The KV state of sequence `seq` (it holds `self.tokens[seq]`)."""
        size = self.lib.llama_state_seq_get_size(self.ptr, seq)
        buf = (ctypes.c_uint8 * size)()
        n = self.lib.llama_state_seq_get_data(self.ptr, buf, size, seq)
        if n == 0 or n > size:
            raise BackendError("llama.cpp could not save the sequence state")
        return bytes(memoryview(buf)[:n])

    def load_state(self, seq: int, blob: bytes, tokens: Sequence[int]) -> bool:
        """Replace sequence `seq` with a saved state that holds `tokens`; False (the sequence
        left empty) when the KV cells have no room for it."""
        self.truncate(seq, 0)
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        if self.lib.llama_state_seq_set_data(self.ptr, buf, len(blob), seq) == 0:
            self.lib.llama_memory_seq_rm(self._memory, seq, -1, -1)
            return False
        self.tokens[seq] = list(tokens)
        return True

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_batch_free(self._batch)
            self.lib.llama_free(self.ptr)
            self.ptr = None
