"""Images on llama.cpp: a model's vision projector (an mmproj GGUF) through libmtmd, the
multimodal library llama-cpp-python's chat handlers (MTMDChatHandler, Llava15ChatHandler...)
drive, here driven by lmprog's engine instead.

    vision = NativeVision(mmproj_path, model, n_threads=4, use_gpu=False)
    run = vision.image_run(image)   # the image's tokens: its model's text wrappers + the image
    vision.evaluate(ctx, seq, run)  # encode it and append its embeddings to sequence `seq`

An image stands in a sequence's token list (`NativeContext.tokens`) as a run of negative
ids derived from its digest, one per position it fills, so the engine's prefix reuse
(slots, saved states) works over images as over text: the same image in the same place
is the same run. Design: docs/design/llamacpp-backend.md#images.
"""

from __future__ import annotations

import ctypes
import logging
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmprog.backends.llamacpp_native import (
    NativeContext,
    NativeModel,
    log_callback,
    take_errors,
)
from lmprog.core.errors import BackendError
from lmprog.core.images import ImageInput

logger = logging.getLogger("lmprog.backends.llamacpp")

_ID_SPAN = 1 << 14  # ids per image: a run longer than this could share ids with another image


def image_ids(digest: str, n: int) -> tuple[int, ...]:
    """The placeholder ids of an image of `n` positions: negative (no vocabulary id is),
    the same for the same image bytes."""
    base = (int(digest[:12], 16) * _ID_SPAN) + 1
    return tuple(-(base + k) for k in range(n))


def is_image_id(token: int) -> bool:
    return token < 0


@dataclass
class ImageRun:
    """One image's part of a prompt: text tokens the model wraps it in (`before`, `after`,
    e.g. Gemma 3's <start_of_image>) and its image chunk of `n` positions (`ids`)."""

    before: list[int]
    ids: tuple[int, ...]
    after: list[int]
    chunk: Any  # an owned mtmd_input_chunk, freed with this object


def _mtmd() -> Any:
    try:
        import llama_cpp.mtmd_cpp as mtmd
    except ImportError as exc:  # an older llama-cpp-python without libmtmd
        raise BackendError(
            "images on llama.cpp need llama-cpp-python with libmtmd (llama_cpp.mtmd_cpp, "
            "0.3.10 or later): pip install -U llama-cpp-python"
        ) from exc
    return mtmd


class NativeVision:
    """An mmproj GGUF loaded for `model` (libmtmd's context). Engine thread only, but for
    `image_run`, which any thread may call (it touches no llama context)."""

    def __init__(self, path: Path, model: NativeModel, *, n_threads: int, use_gpu: bool):
        self.mtmd = mtmd = _mtmd()
        mtmd.mtmd_log_set(log_callback(), ctypes.c_void_p(0))  # its lines to `logging`
        mtmd.mtmd_helper_log_set(log_callback(), ctypes.c_void_p(0))
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.print_timings = False
        params.n_threads = n_threads
        take_errors()  # earlier ones: only this load's explain its failure
        self.ptr = mtmd.mtmd_init_from_file(str(path).encode(), model.ptr, params)
        if not self.ptr:
            why = "; ".join(take_errors()[-2:])
            raise BackendError(
                f"llama.cpp could not load the projector {path} for {model.path}"
                + (f" ({why})" if why else "")
                + ": an mmproj GGUF must come from the same model (llama.cpp's "
                "convert_hf_to_gguf.py --mmproj writes it beside the model's GGUF)"
            )
        if not mtmd.mtmd_support_vision(self.ptr):
            self.close()
            raise BackendError(f"{path} has no vision encoder (an audio-only projector?)")
        self.path = path
        self.marker: str = mtmd.mtmd_default_marker().decode()
        # M-RoPE models (Qwen2-VL family) place an image on a 2-D grid of positions: its
        # positions are not one per token, which the engine's token lists assume
        self.mrope = bool(mtmd.mtmd_decode_use_mrope(self.ptr))

    def image_run(self, image: ImageInput) -> ImageRun:
        """Decode and preprocess `image` (llama.cpp's own image loader and the projector's
        resizing); ValueError for bytes it cannot decode."""
        mtmd = self.mtmd
        buf = (ctypes.c_uint8 * len(image.data)).from_buffer_copy(image.data)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ptr, buf, len(image.data), False)
        if not bitmap:
            raise ValueError(f"image {image.digest[:12]} cannot be decoded by llama.cpp")
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            mtmd.mtmd_bitmap_set_id(bitmap, image.digest.encode())
            part = mtmd.mtmd_input_part()
            part.text = None
            part.bitmap = bitmap
            parts = (ctypes.POINTER(mtmd.mtmd_input_part) * 1)(ctypes.pointer(part))
            rc = mtmd.mtmd_tokenize_from_parts(self.ptr, chunks, parts, 1, False)
            if rc != 0:
                raise ValueError(f"llama.cpp could not preprocess image {image.digest[:12]} ({rc})")
            return self._run(chunks, image)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)

    def _run(self, chunks: Any, image: ImageInput) -> ImageRun:
        mtmd = self.mtmd
        before: list[int] = []
        after: list[int] = []
        run: ImageRun | None = None
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                (after if run is not None else before).extend(ptr[k] for k in range(n.value))
                continue
            if kind != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE or run is not None:
                raise ValueError(f"llama.cpp made an unexpected chunk of image {image.digest[:12]}")
            n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            if self.mrope or mtmd.mtmd_input_chunk_get_n_pos(chunk) != n_tokens:
                raise BackendError(
                    f"{self.path.name}'s model places images on a grid of positions (M-RoPE, "
                    "the Qwen2-VL family), which lmprog's llama.cpp engine does not track; "
                    "use lp.Runtime for this model"
                )
            owned = mtmd.mtmd_input_chunk_copy(chunk)
            run = ImageRun([], image_ids(image.digest, n_tokens), after, owned)
            weakref.finalize(run, mtmd.mtmd_input_chunk_free, owned)
        if run is None:
            raise ValueError(f"llama.cpp made no image chunk of image {image.digest[:12]}")
        run.before = before
        return run

    def evaluate(self, ctx: NativeContext, seq: int, run: ImageRun) -> None:
        """Encode the image and append its embeddings to sequence `seq` (which must end
        where the image starts); BackendError when llama.cpp fails (nothing is kept)."""
        n_past = len(ctx.tokens[seq])
        if n_past + len(run.ids) > ctx.n_ctx:
            raise BackendError(f"an image of {len(run.ids)} positions does not fit the context")
        import llama_cpp

        new_n_past = llama_cpp.llama_pos(0)
        rc = self.mtmd.mtmd_helper_eval_chunk_single(
            self.ptr,
            ctx.ptr,
            run.chunk,
            n_past,
            seq,
            ctx.n_batch,
            False,
            ctypes.byref(new_n_past),
        )
        if rc != 0 or new_n_past.value != n_past + len(run.ids):
            ctx.forget_tail(seq, n_past)
            raise BackendError(f"llama.cpp could not evaluate an image (code {rc})")
        ctx.appended(seq, run.ids)

    def close(self) -> None:
        if self.ptr:
            self.mtmd.mtmd_free(self.ptr)
            self.ptr = None
