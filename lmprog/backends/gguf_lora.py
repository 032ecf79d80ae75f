"""PEFT LoRA adapters written as llama.cpp GGUF LoRA files, for the llama.cpp backend.

    write_gguf_lora(peft_folder, model_gguf, out_path, name="sql")   # checked, then written

The adapter is read and checked against the GGUF model's config by the runtime's reader
(lmprog.runtime.lora.read_adapter: PEFT's layout, the seven Llama projections, shapes), then
written as llama.cpp's convert_lora_to_gguf.py writes one: general.type "adapter",
adapter.type "lora", tensors `blk.{i}.{attn_q,...}.weight.lora_a` [r, in] and `.lora_b`
[out, r], q/k rows of B permuted as convert_hf_to_gguf.py permutes the base weights of a
llama GGUF. One difference: B is stored already scaled (PEFT's alpha / r, alpha / sqrt(r)
with rsLoRA, per-module rank_pattern / alpha_pattern) and adapter.lora.alpha is 0, which
llama.cpp reads as "scale 1" (llama-adapter.h: scale = alpha ? s * alpha / rank : s), so
every module keeps its own PEFT scale. Needs torch (the reader) and gguf.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from lmprog.core.errors import LoraError

# HF projection -> llama.cpp's tensor kind (lmprog.runtime.models.loaders.gguf reads back)
GGUF_KIND = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
}
_PERMUTED = ("llama", "mixtral")  # architectures whose GGUFs hold q/k rows interleaved


def write_gguf_lora(
    folder: str | os.PathLike[str],
    model_gguf: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    name: str | None = None,
) -> Path:
    """Convert the PEFT adapter `folder` for the GGUF model `model_gguf` into a GGUF LoRA
    file at `out_path`; returns the path. LoraError (naming the adapter) when the folder is
    malformed or was trained for another model."""
    import gguf

    from lmprog.runtime.lora.adapter import read_adapter
    from lmprog.runtime.models.loaders.gguf import read_gguf

    try:
        config = read_gguf(model_gguf).config
    except ValueError as exc:
        raise LoraError(f"cannot read the base model {model_gguf}: {exc}", adapter=name) from exc
    adapter = read_adapter(folder, config, name=name)
    arch = _architecture(model_gguf)
    writer = gguf.GGUFWriter(os.fspath(out_path), arch)
    try:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 0.0)  # B holds the scale
        writer.add_name(name or os.path.basename(os.fspath(folder)))
        for (layer, module), (a, b) in sorted(adapter.weights.items()):
            b_rows = b.numpy()
            if arch in _PERMUTED and module == "q_proj":
                b_rows = permute_rows(b_rows, config.num_heads)
            elif arch in _PERMUTED and module == "k_proj":
                b_rows = permute_rows(b_rows, config.num_kv_heads)
            base = f"blk.{layer}.{GGUF_KIND[module]}.weight"
            writer.add_tensor(f"{base}.lora_a", np.ascontiguousarray(a.numpy(), np.float32))
            writer.add_tensor(f"{base}.lora_b", np.ascontiguousarray(b_rows, np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return Path(out_path)


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows from rotate-half order
    (first half, second half) to interleaved pairs; the inverse of the GGUF loader's
    _unpermute."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _architecture(model_gguf: Any) -> str:
    """The model's general.architecture, read from the header's first key-values (converters
    write it first); GGUFReader, which parses every tensor and the vocabulary (seconds),
    only where it is not among them."""
    with open(model_gguf, "rb") as f:
        _, _, _, n_kv = struct.unpack("<4sIQQ", f.read(24))
        for _ in range(min(n_kv, 64)):
            key = f.read(struct.unpack("<Q", f.read(8))[0])
            (kind,) = struct.unpack("<I", f.read(4))
            if kind == 8:  # a string
                value = f.read(struct.unpack("<Q", f.read(8))[0])
                if key == b"general.architecture":
                    return value.decode()
            elif kind in _SCALAR_BYTES:
                f.read(_SCALAR_BYTES[kind])
            else:  # an array: stop here
                break
    import gguf

    field = gguf.GGUFReader(os.fspath(model_gguf)).fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


# GGUF value types of fixed size: u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
