"""Vision-language models over the paged KV pool: LLaVA-1.5 (CLIP ViT + MLP projector + a
Llama / Mistral / Qwen2 decoder), LLaVA-NeXT (the same over an any-resolution grid of tiles)
and the base every VLM here shares (Idefics3 in idefics3.py).

    embeds = model.encode_images([pixels, ...])     # per image [rows, hidden]
    model(batch, kv)     # batch.image_rows take batch.image_embeds in place of a token

The language model is the Llama family's (llama.py) built from the text config, so the KV
pool, attention backends, CUDA graphs and LoRA see a plain decoder; only the embedding of a
step that feeds image positions differs. Design: docs/design/vision.md.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..executor.forward_batch import ForwardBatch
from ..executor.kv_pool import KVPool
from ..layers.attention import AttentionBackend
from .config import ModelConfig
from .llama import LlamaForCausalLM, _Step
from .vision import LlavaProjector, PixelInput, VisionTower, anyres_grid, encode_batched, unpadded
from .vision_config import VisionLanguageConfig


class VisionLanguageModel(LlamaForCausalLM, abc.ABC):
    """A Llama-family decoder that takes image embeddings at image positions. Subclasses
    add the image modules (`_VISION_PREFIXES`, loaded by name as they are), `_encode` and
    the checkpoint's names (`_rename`)."""

    vision: VisionLanguageConfig
    _VISION_PREFIXES: tuple[str, ...] = ()

    def __init__(self, config: ModelConfig, attention: AttentionBackend) -> None:
        if config.vision is None:
            raise ValueError(f"a {config.architecture} model needs a config with `vision`")
        super().__init__(config, attention)
        self.vision = config.vision

    @property
    def image_token_id(self) -> int:
        return self.vision.image_token_id

    def encode_images(self, images: Sequence[PixelInput]) -> list[torch.Tensor]:
        """The embeddings of each image, [rows, hidden] in the model's dtype, from its
        preprocessed pixels [n, C, H, W] (n tiles, 1 for LLaVA-1.5): one encoder run for all
        images of one tile size."""
        with torch.inference_mode():
            encoded = encode_batched(self._encode, images, self.device)
            return [self._assemble(e, image) for e, image in zip(encoded, images)]

    def _assemble(self, encoded: torch.Tensor, image: PixelInput) -> torch.Tensor:
        """One image's rows from its tiles' [n, rows per tile, hidden]: in tile order."""
        return encoded.flatten(0, 1)

    @abc.abstractmethod
    def _encode(self, pixels: torch.Tensor, patch_mask: torch.Tensor | None) -> torch.Tensor:
        """[n, C, H, W] (and its patch mask) -> [n, rows per tile, hidden]."""

    def embed(self, batch: ForwardBatch, kv: KVPool, plan: Any) -> tuple[torch.Tensor, _Step]:
        rows = batch.image_rows
        if rows is None or batch.image_embeds is None:
            return super().embed(batch, kv, plan)
        # image positions carry their image's cache key (beyond the vocabulary) as input id
        ids = batch.input_ids.clamp(max=self.config.vocab_size - 1)
        h, step = super().embed(replace(batch, input_ids=ids), kv, plan)
        return h.index_copy(0, rows, batch.image_embeds.to(h.dtype)), step

    # -- weights -----------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Checkpoint tensors by transformers' names (either layout: v5's `model.`-rooted or
        the older one real checkpoints are saved in)."""
        renamed = ((self._rename(name), tensor) for name, tensor in weights)
        super().load_weights((n, t) for n, t in renamed if n is not None)

    @abc.abstractmethod
    def _rename(self, name: str) -> str | None:
        """Our parameter name for a checkpoint tensor's (None: a tensor we do not keep)."""

    def _pieces(self, name: str, tensor: torch.Tensor) -> Iterable[tuple[str, Any, torch.Tensor]]:
        if name.startswith(self._VISION_PREFIXES):  # unfused: the image modules' own names
            return ((name, 0, tensor),)
        return super()._pieces(name, tensor)

    def _shard_keys(self, name: str, param: torch.Tensor) -> Iterable[Any]:
        if name.startswith(self._VISION_PREFIXES):
            return range(1)
        return super()._shard_keys(name, param)


class LlavaForConditionalGeneration(VisionLanguageModel):
    """LLaVA-1.5 (llava-hf/llava-1.5-*-hf and others of transformers' LlavaForConditionalGeneration):
    the hidden states of ViT layer(s) vision_feature_layer, the class token dropped
    ("default"), through the projector: tokens_per_image rows per image."""

    _VISION_PREFIXES: tuple[str, ...] = ("vision_tower.", "multi_modal_projector.")

    def __init__(self, config: ModelConfig, attention: AttentionBackend) -> None:
        super().__init__(config, attention)
        self.vision_tower = VisionTower(self.vision.encoder)
        self.multi_modal_projector = LlavaProjector(self.vision, config.hidden_size)
        self._feature_states = self.vision.hidden_state_indices()

    def _encode(self, pixels: torch.Tensor, patch_mask: torch.Tensor | None) -> torch.Tensor:
        states = self.vision_tower(pixels, upto=max(self._feature_states))
        features = torch.cat([states[i] for i in self._feature_states], dim=-1)
        if self.vision.select_strategy == "default":
            features = features[:, 1:]  # the class token
        return self.multi_modal_projector(features)

    def _rename(self, name: str) -> str | None:
        if name.endswith("position_ids"):  # a buffer older checkpoints saved
            return None
        if name.startswith("model."):  # transformers v5: model.{language_model,vision_tower,..}
            name = name[len("model.") :]
        if name.startswith("language_model.lm_head."):
            return name[len("language_model.") :]
        if name.startswith("language_model.model."):
            return "model." + name[len("language_model.model.") :]
        if name.startswith("language_model."):
            return "model." + name[len("language_model.") :]
        if name.startswith("vision_tower.vision_model."):
            name = "vision_tower." + name[len("vision_tower.vision_model.") :]
        if name.startswith("vision_tower.head."):  # SigLIP's pooling head: LLaVA reads none
            return None
        return name


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    """LLaVA-NeXT (LLaVA-1.6, transformers' LlavaNextForConditionalGeneration): LLaVA's
    features of the downscaled whole image, then of the grid of tiles that best fits the
    image (image_grid_pinpoints), unpadded back to the image's aspect ratio, image_newline
    after each row of features (transformers' pack_image_features, "spatial_unpad")."""

    _VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "image_newline")

    def __init__(self, config: ModelConfig, attention: AttentionBackend) -> None:
        super().__init__(config, attention)
        self.image_newline = nn.Parameter(torch.empty(config.hidden_size))

    def _assemble(self, encoded: torch.Tensor, image: PixelInput) -> torch.Tensor:
        newline = self.image_newline.to(encoded.dtype)
        if encoded.shape[0] == 1:  # no grid: the whole image only
            return torch.cat([encoded[0], newline[None]])
        size = getattr(image, "size", None)
        assert size is not None, "a LLaVA-NeXT image carries its original size"
        side = self.vision.encoder.patches_per_side
        gh, gw = anyres_grid(size, self.vision.grid_pinpoints, self.vision.encoder.image_size)
        d = encoded.shape[-1]
        x = encoded[1:].reshape(gh, gw, side, side, d).permute(4, 0, 2, 1, 3)
        x = x.reshape(d, gh * side, gw * side)
        (top, bottom), (left, right) = unpadded(size, gh * side, gw * side)
        x = x[:, top:bottom, left:right]
        x = torch.cat([x, newline[:, None, None].expand(d, x.shape[1], 1)], dim=-1)
        return torch.cat([encoded[0], x.flatten(1, 2).transpose(0, 1)])
