"""A vision-language model's image half from llama.cpp's projector GGUF (an "mmproj" file,
clip.cpp's layout), beside its decoder's text GGUF.

    mm = read_mmproj("mmproj-model-f16.gguf")      # ViT + projector config, tensor table
    vision = mm.vision_config(image_token_id)       # -> ModelConfig.vision
    for name, tensor in mmproj_weights(mm): ...     # under the VLM's parameter names

Two projectors are read: "mlp" (LLaVA-1.5: a CLIP or SigLIP ViT, the hidden state of
`clip.vision.feature_layer` or of its last block, CLS dropped, a 2-layer MLP `mm.0`/`mm.2`;
llama.cpp's legacy converter drops the ViT blocks after the feature layer) and "idefics3"
(SmolVLM / Idefics3: a SigLIP ViT, post-norm, pixel shuffle, `mm.model.fc`). Key and tensor
names are gguf-py's (`gguf.Keys.ClipVision`, `gguf.TENSOR_NAMES`), which clip.cpp reads.
Design: docs/design/vision.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from gguf import MODEL_TENSOR, TENSOR_NAMES, Keys

from ..vision_config import VisionEncoderConfig, VisionLanguageConfig
from .gguf import GGUFTensor, open_gguf, tensor_array, tensor_table

Projector = Literal["mlp", "idefics3"]
PROJECTORS: tuple[str, ...] = ("mlp", "idefics3")
_FEATURE_LAYER = "clip.vision.feature_layer"  # clip.cpp's KEY_FEATURE_LAYER (legacy converter)
_GRID_PINPOINTS = "clip.vision.image_grid_pinpoints"


def _name(tensor: MODEL_TENSOR, bid: int | None = None) -> str:
    return TENSOR_NAMES[tensor].format(bid=bid)


# clip.cpp's tensor -> transformers' name inside the ViT (VisionTower) and per block
_TOWER = {
    _name(MODEL_TENSOR.V_ENC_EMBD_PATCH): "embeddings.patch_embedding",
    _name(MODEL_TENSOR.V_ENC_EMBD_POS): "embeddings.position_embedding",
    _name(MODEL_TENSOR.V_PRE_NORM): "pre_layrnorm",
    _name(MODEL_TENSOR.V_POST_NORM): "post_layernorm",
}
_CLASS = _name(MODEL_TENSOR.V_ENC_EMBD_CLS)  # a bare tensor: no .weight
_BLOCK = {
    MODEL_TENSOR.V_ENC_ATTN_Q: "self_attn.q_proj",
    MODEL_TENSOR.V_ENC_ATTN_K: "self_attn.k_proj",
    MODEL_TENSOR.V_ENC_ATTN_V: "self_attn.v_proj",
    MODEL_TENSOR.V_ENC_ATTN_O: "self_attn.out_proj",
    MODEL_TENSOR.V_ENC_INPUT_NORM: "layer_norm1",
    MODEL_TENSOR.V_ENC_POST_ATTN_NORM: "layer_norm2",
    MODEL_TENSOR.V_ENC_FFN_UP: "mlp.fc1",
    MODEL_TENSOR.V_ENC_FFN_DOWN: "mlp.fc2",
}
_BLOCK_SUFFIX = {_name(t, 0).split(".")[-1]: hf for t, hf in _BLOCK.items()}  # "attn_q": ...
_BLOCK_RE = re.compile(r"^v\.blk\.(\d+)\.([a-z_0-9]+)\.(weight|bias)$")
_LLAVA_MLP = (_name(MODEL_TENSOR.V_MMPROJ, 0), _name(MODEL_TENSOR.V_MMPROJ, 2))  # mm.0, mm.2
_IDEFICS3_FC = _name(MODEL_TENSOR.V_MMPROJ_FC)  # mm.model.fc
# the VLM classes' module names (models/llava.py, models/idefics3.py)
_PREFIXES = {
    "mlp": ("vision_tower.", "multi_modal_projector."),
    "idefics3": ("vision_model.", "connector.modality_projection.proj."),
}


@dataclass(frozen=True)
class MmprojIndex:
    """An mmproj file's ViT, projector and preprocessing, and where its tensors lie."""

    path: Path
    projector: Projector
    encoder: VisionEncoderConfig
    feature_layers: tuple[int, ...]  # hidden-state indices (0: the embeddings)
    scale_factor: int
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    preproc_image_size: int | None  # idefics3: the longest edge an image is resized to
    tensors: tuple[GGUFTensor, ...]

    @property
    def family(self) -> Literal["llava", "idefics3"]:
        return "idefics3" if self.projector == "idefics3" else "llava"

    @property
    def text_hidden_size(self) -> int:
        """The decoder's width the projector maps into (its last matrix's rows)."""
        last = _IDEFICS3_FC if self.projector == "idefics3" else _LLAVA_MLP[1]
        return self.tensor(last + ".weight").shape[0]

    def vision_config(self, image_token_id: int) -> VisionLanguageConfig:
        """ModelConfig.vision of the VLM this projector belongs to."""
        if self.projector == "idefics3":
            return VisionLanguageConfig(
                family="idefics3",
                encoder=self.encoder,
                image_token_id=image_token_id,
                projector_bias=False,
                scale_factor=self.scale_factor,
            )
        return VisionLanguageConfig(
            family="llava",
            encoder=self.encoder,
            image_token_id=image_token_id,
            feature_layers=self.feature_layers,
            # clip.cpp drops the class token of a CLIP ViT; SigLIP has none
            select_strategy="default" if self.encoder.kind == "clip" else "full",
            projector_hidden_act="gelu",
            projector_bias=self._has(_LLAVA_MLP[0] + ".bias"),
        )

    def _has(self, name: str) -> bool:
        return any(t.name == name for t in self.tensors)

    def tensor(self, name: str) -> GGUFTensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise ValueError(f"{self.path} lacks the tensor {name!r}")


def read_mmproj(path: str | os.PathLike[str]) -> MmprojIndex:
    """The projector file's index; ValueError naming the file for one that is no mmproj (a
    text model's GGUF), lacks a key or tensor clip.cpp reads, or has another projector."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ValueError(
            f"mmproj file {path} does not exist: give the projector GGUF of the model "
            "(llama.cpp's mmproj-*.gguf)"
        )
    reader = open_gguf(path)
    meta = {key: _value(field) for key, field in reader.fields.items()}
    arch = meta.get(Keys.General.ARCHITECTURE)
    if arch != "clip":
        raise ValueError(
            f"{path} is not an mmproj file: a {arch!r} GGUF (a projector's general.architecture "
            "is 'clip'); give the model's GGUF as model= and its mmproj-*.gguf as mmproj="
        )
    if not meta.get(Keys.Clip.HAS_VISION_ENCODER, True):
        raise ValueError(f"{path} holds no vision encoder (clip.has_vision_encoder is false)")
    projector = meta.get(Keys.Clip.PROJECTOR_TYPE) or meta.get(Keys.ClipVision.PROJECTOR_TYPE)
    if projector not in PROJECTORS:
        raise ValueError(
            f"{path}: projector type {projector!r} is not supported by the runtime; it reads "
            "'mlp' (LLaVA-1.5) and 'idefics3' (SmolVLM, Idefics3) (lp.LlamaCpp(mmproj=) runs "
            "what llama.cpp supports)"
        )
    if meta.get(_GRID_PINPOINTS) is not None:
        raise ValueError(
            f"{path} is a LLaVA-NeXT projector (image_grid_pinpoints): load LLaVA-NeXT from "
            "its Hugging Face folder, or run it with lp.LlamaCpp(mmproj=)"
        )
    tensors = tensor_table(reader)
    return _index(path, meta, projector, tensors)


def _index(
    path: Path, meta: dict[str, Any], projector: Projector, tensors: tuple[GGUFTensor, ...]
) -> MmprojIndex:
    def need(key: str) -> Any:
        if meta.get(key) is None:
            raise ValueError(
                f"{path} lacks the mmproj metadata {key!r} (an incomplete conversion): "
                "convert the projector again with llama.cpp's converter"
            )
        return meta[key]

    names = {t.name for t in tensors}
    kind: Literal["clip", "siglip"] = "clip" if _CLASS in names else "siglip"
    if meta.get(Keys.ClipVision.USE_SILU):
        raise ValueError(f"{path}: a ViT with SiLU activations is not supported")
    gelu = "gelu" if kind == "clip" else "gelu_pytorch_tanh"  # clip.cpp: tanh-approximate
    layers = int(need(Keys.ClipVision.BLOCK_COUNT))
    encoder = VisionEncoderConfig(
        kind=kind,
        hidden_size=int(need(Keys.ClipVision.EMBEDDING_LENGTH)),
        intermediate_size=int(need(Keys.ClipVision.FEED_FORWARD_LENGTH)),
        num_layers=layers,
        num_heads=int(need(Keys.ClipVision.Attention.HEAD_COUNT)),
        image_size=int(need(Keys.ClipVision.IMAGE_SIZE)),
        patch_size=int(need(Keys.ClipVision.PATCH_SIZE)),
        layer_norm_eps=_f32(meta.get(Keys.ClipVision.Attention.LAYERNORM_EPS) or 1e-5),
        hidden_act=gelu if meta.get(Keys.ClipVision.USE_GELU) else "quick_gelu",
    )
    feature = meta.get(_FEATURE_LAYER)
    index = MmprojIndex(
        path=path,
        projector=projector,
        encoder=encoder,
        # without the key: the last block's output (the converter kept the blocks needed)
        feature_layers=tuple(int(x) for x in feature) if feature else (layers,),
        scale_factor=int(meta.get(Keys.ClipVision.Projector.SCALE_FACTOR) or 1),
        image_mean=tuple(_f32(x) for x in need(Keys.ClipVision.IMAGE_MEAN)),
        image_std=tuple(_f32(x) for x in need(Keys.ClipVision.IMAGE_STD)),
        preproc_image_size=meta.get(Keys.ClipVision.PREPROC_IMAGE_SIZE),
        tensors=tensors,
    )
    missing = sorted(_required(index) - names)
    if missing:
        raise ValueError(
            f"{path} lacks {len(missing)} tensor(s) a {projector!r} projector reads, e.g. "
            f"{missing[:4]}: a damaged or incomplete mmproj file"
        )
    return index


def _required(index: MmprojIndex) -> set[str]:
    """The tensors the model reads (v.post_ln: only where it is used, idefics3)."""
    enc = index.encoder
    need = {
        _name(MODEL_TENSOR.V_ENC_EMBD_PATCH) + ".weight",
        _name(MODEL_TENSOR.V_ENC_EMBD_POS) + ".weight",
    }
    if enc.kind == "clip":
        need |= {_CLASS} | {_name(MODEL_TENSOR.V_PRE_NORM) + s for s in (".weight", ".bias")}
    else:
        need.add(_name(MODEL_TENSOR.V_ENC_EMBD_PATCH) + ".bias")
    for bid in range(enc.num_layers):
        need |= {_name(t, bid) + s for t in _BLOCK for s in (".weight", ".bias")}
    if index.projector == "idefics3":
        need |= {_name(MODEL_TENSOR.V_POST_NORM) + s for s in (".weight", ".bias")}
        need.add(_IDEFICS3_FC + ".weight")
    else:
        need |= {p + ".weight" for p in _LLAVA_MLP}
    return need


def mmproj_weights(index: MmprojIndex) -> Iterator[tuple[str, torch.Tensor]]:
    """(parameter name in the VLM, fp32 tensor) for every tensor of the projector file.

    LLaVA's legacy converter names a block's fc1 `ffn_down` and fc2 `ffn_up`; as clip.cpp
    does, a block whose ffn_down takes the ViT's width is read swapped."""
    tower, projector = _PREFIXES[index.projector]
    hidden = index.encoder.hidden_size
    swapped = {
        bid
        for bid in range(index.encoder.num_layers)
        if index.tensor(_name(MODEL_TENSOR.V_ENC_FFN_DOWN, bid) + ".weight").shape[1] == hidden
    }
    post_norm = _name(MODEL_TENSOR.V_POST_NORM) + ".weight"
    with open(index.path, "rb") as f:
        mapped = np.memmap(f, dtype=np.uint8, mode="r")
        for t in index.tensors:
            name = _our_name(t.name, tower, projector, swapped, index.projector)
            yield (
                name,
                torch.from_numpy(np.require(tensor_array(mapped, t), np.float32, ["C", "W"])),
            )
    if index.projector == "mlp" and not index._has(post_norm):
        # the legacy converter drops CLIP's post-norm (it norms the pooled class token,
        # which LLaVA never reads): the tower's parameter gets the identity
        yield tower + "post_layernorm.weight", torch.ones(hidden)
        yield tower + "post_layernorm.bias", torch.zeros(hidden)


def _our_name(name: str, tower: str, projector: str, swapped: set[int], projector_type: str) -> str:
    """clip.cpp's tensor name -> the VLM's (tower / projector: its modules' prefixes)."""
    if name == _CLASS:
        return tower + "embeddings.class_embedding"
    base, _, suffix = name.rpartition(".")
    if base in _TOWER:
        return f"{tower}{_TOWER[base]}.{suffix}"
    block = _BLOCK_RE.match(name)
    if block and block.group(2) in _BLOCK_SUFFIX:
        bid, part, suffix = int(block.group(1)), _BLOCK_SUFFIX[block.group(2)], block.group(3)
        if bid in swapped and part in ("mlp.fc1", "mlp.fc2"):
            part = "mlp.fc2" if part == "mlp.fc1" else "mlp.fc1"
        return f"{tower}encoder.layers.{bid}.{part}.{suffix}"
    if projector_type == "mlp" and base in _LLAVA_MLP:
        return f"{projector}linear_{_LLAVA_MLP.index(base) + 1}.{suffix}"
    if projector_type == "idefics3" and base == _IDEFICS3_FC:
        return projector + suffix
    raise ValueError(f"unexpected tensor {name!r} in a {projector_type!r} mmproj file")


def _f32(value: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-06, not
    9.99999997e-07): the shortest one that reads back as the same float32."""
    return float(str(np.float32(value)))


def _value(field: Any) -> Any:
    try:
        return field.contents()
    except Exception:  # noqa: BLE001 - exotic field types are metadata we never read
        return None
