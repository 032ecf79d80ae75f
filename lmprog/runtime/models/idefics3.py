"""Idefics3 / SmolVLM (transformers' Idefics3ForConditionalGeneration) over the paged KV pool:
a SigLIP ViT over each tile of an image (and the image itself, downscaled), pixel shuffle and
one linear map into a Llama-family decoder (SmolLM2 in SmolVLM-256M/500M, Llama 3 in
Idefics3-8B). Each tile gives tokens_per_image rows; the processor's prompt text frames them
with <fake_token_around_image>, <row_r_col_c> and <global-img> tokens.
Design: docs/design/vision.md.
"""

from __future__ import annotations

import torch

from ..layers.attention import AttentionBackend
from .config import ModelConfig
from .llava import VisionLanguageModel
from .vision import Idefics3Connector, VisionTower


class Idefics3ForConditionalGeneration(VisionLanguageModel):
    _VISION_PREFIXES = ("vision_model.", "connector.")

    def __init__(self, config: ModelConfig, attention: AttentionBackend) -> None:
        super().__init__(config, attention)
        self.vision_model = VisionTower(self.vision.encoder)
        self.connector = Idefics3Connector(self.vision, config.hidden_size)

    def _encode(self, pixels: torch.Tensor, patch_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.vision_model(pixels, patch_mask=patch_mask)[-1]
        return self.connector(self.vision_model.post_layernorm(x))

    def _rename(self, name: str) -> str | None:
        if name.startswith("model."):
            name = name[len("model.") :]
        if name.startswith("text_model."):
            return "model." + name[len("text_model.") :]
        return name
