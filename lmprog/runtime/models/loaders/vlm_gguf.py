"""A vision-language model from two GGUFs, as llama.cpp runs it: the decoder's text GGUF and
the projector's mmproj GGUF (loaders/mmproj.py).

    config = vision_language_config(read_gguf(model), read_mmproj(mmproj))
    net.load_weights(vision_language_weights(index, projector, torch.float32))

The decoder keeps the text GGUF's config (a Llama or Qwen2 decoder); `vision` comes from
the projector, the image token from the text GGUF's vocabulary ("<image>", which llava-hf's
and SmolVLM's tokenizers carry and llama.cpp's converter keeps). Tensors are named as the
VLM's transformers checkpoint names them, so the model's own renaming takes both files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from itertools import chain

import torch

from ..config import ModelConfig
from .gguf import GGUFIndex, open_gguf
from .mmproj import MmprojIndex, mmproj_weights
from .weight_cache import cached_gguf_weights

IMAGE_TOKEN = "<image>"
_DECODERS = ("llama", "qwen2")  # the decoders models/llava.py and idefics3.py build


def vision_language_config(index: GGUFIndex, projector: MmprojIndex) -> ModelConfig:
    """The VLM's config: the text GGUF's decoder with the projector's `vision`; ValueError
    naming both files when they do not belong together."""
    text = index.config
    if text.architecture not in _DECODERS:
        raise ValueError(
            f"{index.path}: a {text.architecture!r} decoder with a projector is not supported "
            f"(LLaVA and Idefics3 decoders: {', '.join(_DECODERS)})"
        )
    if projector.text_hidden_size != text.hidden_size:
        raise ValueError(
            f"{projector.path} projects images to width {projector.text_hidden_size}, the "
            f"decoder {index.path} is {text.hidden_size} wide: the mmproj file belongs to "
            "another model"
        )
    vision = projector.vision_config(_image_token_id(index))
    return replace(text, architecture=projector.family, vision=vision)


def vision_language_weights(
    index: GGUFIndex, projector: MmprojIndex, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """Both files' tensors under the VLM checkpoint's names (the decoder's from the weight
    cache, in `dtype`)."""
    family = projector.family
    text = ((_checkpoint_name(family, n), t) for n, t in cached_gguf_weights(index, dtype))
    return chain(text, mmproj_weights(projector))


def _checkpoint_name(family: str, name: str) -> str:
    """A decoder tensor's name in the VLM's transformers checkpoint (the layout that
    LlavaForConditionalGeneration / Idefics3ForConditionalGeneration save)."""
    if family == "idefics3":
        return "model.text_model." + name[len("model.") :] if name.startswith("model.") else name
    return "language_model." + name


def _image_token_id(index: GGUFIndex) -> int:
    reader = open_gguf(index.path)
    field = reader.fields.get("tokenizer.ggml.tokens")
    tokens = [] if field is None else field.contents()
    if IMAGE_TOKEN not in tokens:
        raise ValueError(
            f"{index.path} has no {IMAGE_TOKEN!r} token in its vocabulary: the runtime marks "
            "an image's positions with it (GGUFs converted from llava-hf's or SmolVLM's "
            "checkpoints carry it); run this model with lp.LlamaCpp(mmproj=) instead"
        )
    return tokens.index(IMAGE_TOKEN)
