"""Vision encoders (CLIP and SigLIP ViTs) and the image half of a vision-language model.

    tower = VisionTower(config.vision.encoder)
    states = tower(pixels, upto=k)        # [embeddings, after layer 1, ..., after layer k]

Parameter names are transformers' (CLIPVisionModel / SiglipVisionTransformer /
Idefics3VisionTransformer without the `vision_model.` prefix), so a checkpoint's tensors load
by name. Images are encoded whole (bidirectional attention over one image's patches, no KV
pool): torch's scaled_dot_product_attention, batched over images of one size.
Design: docs/design/vision.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .vision_config import VisionEncoderConfig, VisionLanguageConfig


class VisionLinear(nn.Linear):
    """The image modules' linear layers: an nn.Linear the load-time transforms of the decoder
    (int4, FP8, small-M matmul paths, which select `type(layer) is nn.Linear`) leave alone;
    they see [images, patches, features] inputs and a small share of the FLOPs."""


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    """transformers' ACT2FN for the activations vision models use."""
    if name == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    if name == "gelu_pytorch_tanh":
        return F.gelu(x, approximate="tanh")
    return F.gelu(x)


class VisionAttention(nn.Module):
    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        dim = config.hidden_size
        self.num_heads = config.num_heads
        self.q_proj = VisionLinear(dim, dim)
        self.k_proj = VisionLinear(dim, dim)
        self.v_proj = VisionLinear(dim, dim)
        self.out_proj = VisionLinear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """mask: bool [B, 1, 1, N], the keys each image's queries see (None: all)."""
        b, n, d = x.shape
        shape = (b, n, self.num_heads, d // self.num_heads)
        q, k, v = (
            p(x).view(shape).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # scale head_dim**-0.5
        return self.out_proj(o.transpose(1, 2).reshape(b, n, d))


class VisionMLP(nn.Module):
    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        self.act = config.hidden_act
        self.fc1 = VisionLinear(config.hidden_size, config.intermediate_size)
        self.fc2 = VisionLinear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(activation(self.act, self.fc1(x)))


class VisionLayer(nn.Module):
    """A pre-norm transformer block (CLIPEncoderLayer, SiglipEncoderLayer)."""

    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        eps = config.layer_norm_eps
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.self_attn = VisionAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.mlp = VisionMLP(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), mask)
        return x + self.mlp(self.layer_norm2(x))


class VisionEmbeddings(nn.Module):
    """Patches (a stride-patch convolution) plus learned positions; CLIP prepends a class
    token and has no patch bias."""

    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        clip = config.kind == "clip"
        dim = config.hidden_size
        self.config = config
        self.patch_embedding = nn.Conv2d(
            config.num_channels,
            dim,
            kernel_size=config.patch_size,
            stride=config.patch_size,
            bias=not clip,
        )
        positions = config.patches_per_side**2 + (1 if clip else 0)
        self.position_embedding = nn.Embedding(positions, dim)
        self.class_embedding = nn.Parameter(torch.empty(dim)) if clip else None

    def forward(self, pixels: torch.Tensor, patch_mask: torch.Tensor | None = None) -> torch.Tensor:
        """patch_mask: bool [B, side, side], the patches of each image that hold pixels (an
        image padded to the ViT's size, Idefics3): their positions are stretched over the
        grid as transformers' Idefics3VisionEmbeddings buckets them."""
        size = self.config.image_size
        if pixels.shape[-2:] != (size, size):
            raise ValueError(
                f"an image of {tuple(pixels.shape[-2:])} pixels for a ViT of {size}x{size}"
            )
        weight = self.patch_embedding.weight
        x = self.patch_embedding(pixels.to(weight.dtype)).flatten(2).transpose(1, 2)
        if self.class_embedding is not None:
            cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
            x = torch.cat([cls, x], dim=1)
        if patch_mask is None:
            return x + self.position_embedding.weight
        return x + self.position_embedding(bucketed_positions(patch_mask))


class VisionEncoder(nn.Module):
    """The layers (transformers' `encoder.layers.{i}`)."""

    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VisionLayer(config) for _ in range(config.num_layers))


class VisionTower(nn.Module):
    """A CLIP or SigLIP ViT. CLIP norms the embeddings first (pre_layrnorm, transformers'
    spelling); SigLIP norms the last layer's output (post_layernorm). Both keep the other
    norm's weights from the checkpoint where it has them (CLIP's post_layernorm norms only the
    pooled class token, which no VLM here reads)."""

    def __init__(self, config: VisionEncoderConfig) -> None:
        super().__init__()
        self.config = config
        dim, eps = config.hidden_size, config.layer_norm_eps
        self.embeddings = VisionEmbeddings(config)
        self.pre_layrnorm = nn.LayerNorm(dim, eps=eps) if config.kind == "clip" else None
        self.encoder = VisionEncoder(config)
        self.post_layernorm = nn.LayerNorm(dim, eps=eps)

    def forward(
        self, pixels: torch.Tensor, upto: int | None = None, patch_mask: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Hidden states [embeddings, after layer 1, ..., after layer `upto`] (default all
        layers) of pixels [B, C, H, W], each [B, patches (+1 CLS), hidden]. patch_mask (bool
        [B, side, side]): only those patches are attended to (all when None)."""
        x = self.embeddings(pixels, patch_mask)
        if self.pre_layrnorm is not None:
            x = self.pre_layrnorm(x)
        mask = None
        if patch_mask is not None and not bool(patch_mask.all()):
            mask = patch_mask.reshape(x.shape[0], 1, 1, -1)
        states = [x]
        layers = self.encoder.layers
        for layer in layers[: len(layers) if upto is None else upto]:
            x = layer(x, mask)
            states.append(x)
        return states


def bucketed_positions(patch_mask: torch.Tensor) -> torch.Tensor:
    """Position ids [B, side * side] of images whose valid patches are patch_mask (bool [B,
    side, side], a top-left rectangle each): each valid patch's fractional coordinates bucketed
    onto the side x side grid, 0 elsewhere; transformers' Idefics3VisionEmbeddings arithmetic,
    step for step (the bucket edges are float sums)."""
    b, side, _ = patch_mask.shape
    device = patch_mask.device
    boundaries = torch.arange(1 / side, 1.0, 1 / side, device=device)
    rows = patch_mask[:, :, 0].sum(dim=1)
    cols = patch_mask[:, 0, :].sum(dim=1)
    index = torch.arange(side, device=device, dtype=torch.float32)
    frac_h = torch.clamp(index[None, :] * (1.0 / rows)[:, None], max=1.0 - 1e-6)
    frac_w = torch.clamp(index[None, :] * (1.0 / cols)[:, None], max=1.0 - 1e-6)
    bucket_h = torch.bucketize(frac_h, boundaries, right=True)
    bucket_w = torch.bucketize(frac_w, boundaries, right=True)
    ids = (bucket_h[:, :, None] * side + bucket_w[:, None, :]).reshape(b, -1)
    return torch.where(patch_mask.reshape(b, -1), ids, torch.zeros_like(ids))


class LlavaProjector(nn.Module):
    """LLaVA's multi_modal_projector: linear_2(act(linear_1(features)))."""

    def __init__(self, vision: VisionLanguageConfig, text_hidden: int) -> None:
        super().__init__()
        features = vision.encoder.hidden_size * len(vision.feature_layers)
        self.act = vision.projector_hidden_act
        self.linear_1 = VisionLinear(features, text_hidden, bias=vision.projector_bias)
        self.linear_2 = VisionLinear(text_hidden, text_hidden, bias=vision.projector_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(activation(self.act, self.linear_1(x)))


class ModalityProjection(nn.Module):
    """Idefics3's `modality_projection.proj`: one linear map without bias."""

    def __init__(self, features: int, text_hidden: int) -> None:
        super().__init__()
        self.proj = VisionLinear(features, text_hidden, bias=False)


class Idefics3Connector(nn.Module):
    """Idefics3's connector: pixel shuffle (each scale x scale block of patches becomes one
    token of scale**2 times the features), then one linear map (modality_projection.proj)."""

    def __init__(self, vision: VisionLanguageConfig, text_hidden: int) -> None:
        super().__init__()
        self.scale = vision.scale_factor
        self.modality_projection = ModalityProjection(
            vision.encoder.hidden_size * self.scale**2, text_hidden
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.modality_projection.proj(pixel_shuffle(x, self.scale))


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """[B, side * side, D] -> [B, side * side / scale**2, D * scale**2], as transformers'
    Idefics3Connector.pixel_shuffle orders it."""
    b, seq, d = x.shape
    side = math.isqrt(seq)
    x = x.reshape(b, side, side // scale, d * scale).permute(0, 2, 1, 3)
    x = x.reshape(b, side // scale, side // scale, d * scale * scale).permute(0, 2, 1, 3)
    return x.reshape(b, seq // scale**2, d * scale * scale)


def anyres_grid(
    size: tuple[int, int], pinpoints: Sequence[tuple[int, int]], tile: int
) -> tuple[int, int]:
    """LLaVA-NeXT's grid of tiles (rows, columns) for an image of `size` (height, width): the
    pinpoint resolution transformers' select_best_resolution picks, in tiles of `tile`."""
    from transformers.image_processing_utils import select_best_resolution

    h, w = select_best_resolution(list(size), [list(p) for p in pinpoints])
    return h // tile, w // tile


def unpadded(size: tuple[int, int], height: int, width: int) -> tuple[tuple[int, int], ...]:
    """((top, bottom), (left, right)): the part of a height x width feature grid that holds
    an image of `size` (height, width) resized into it and centred (transformers'
    unpad_image, the same rounding)."""
    h, w = size
    if w / h > width / height:
        new = int(round(h * (width / w), 7))
        pad = (height - new) // 2
        return (pad, height - pad), (0, width)
    new = int(round(w * (height / h), 7))
    pad = (width - new) // 2
    return (0, height), (pad, width - pad)


def encode_batched(
    encode: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
    images: Sequence[PixelInput],
    device: torch.device,
) -> list[torch.Tensor]:
    """encode(cat(pixels), cat(masks)) split back per image: one encoder run for all images of
    one tile size (images[i].pixels: [n_i, C, H, W]); groups of other sizes run apart."""
    out: list[torch.Tensor | None] = [None] * len(images)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, image in enumerate(images):
        groups.setdefault(tuple(image.pixels.shape[1:]), []).append(i)
    for members in groups.values():
        pixels = torch.cat([images[i].pixels for i in members]).to(device, non_blocking=True)
        masks = [images[i].patch_mask for i in members]
        mask = None  # one model's processor gives every image a mask, or none
        if masks[0] is not None:
            mask = torch.cat([m for m in masks if m is not None]).to(device, non_blocking=True)
        result = encode(pixels, mask)
        for i, part in zip(members, result.split([images[i].pixels.shape[0] for i in members])):
            out[i] = part
    return [o for o in out if o is not None]


class PixelInput(Protocol):
    """One image as its model's processor prepared it (runtime/image_processing.py)."""

    @property
    def pixels(self) -> torch.Tensor: ...  # [tiles, C, H, W] float32

    @property
    def patch_mask(self) -> torch.Tensor | None: ...  # bool [tiles, H / patch, W / patch]
