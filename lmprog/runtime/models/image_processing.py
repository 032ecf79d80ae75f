"""A vision-language model's image preprocessing, and the tokens each image becomes.

    proc = ImageProcessor.for_model(config, folder, tokenizer)
    proc.image_token                        # "<image>": one per image in a prompt
    image = proc.prepare(ImageInput...)      # pixels [tiles, C, H, W], its prompt tokens
    ids, spans = proc.expand(prompt_ids, images)

The pixels come from transformers' own image processor of the checkpoint (its
preprocessor_config.json: CLIPImageProcessor for LLaVA-1.5, Idefics3ImageProcessor for
SmolVLM), not a re-implementation: the resize filters, crops, tiling and rounding are then
the model's by construction (transformers is a dependency already). What lmprog computes is
the part the engine needs: how many embedding rows an image gives and the tokens that frame
them (transformers' processors' prompt expansion, token for token).
Design: docs/design/vision.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lmprog.core.images import ImageInput

from .config import ModelConfig
from .vision_config import VisionLanguageConfig

if TYPE_CHECKING:
    from .loaders.mmproj import MmprojIndex

PREPROCESSOR_FILE = "preprocessor_config.json"


@dataclass(frozen=True, eq=False)
class PreparedImage:
    """One image as the model takes it: `pixels` [tiles, C, H, W] float32 (CPU), the patch
    mask of each tile (Idefics3; None: all patches), and the token ids that stand for it in
    the prompt (`rows` of them the image token, each taking one embedding row)."""

    digest: str
    pixels: torch.Tensor
    patch_mask: torch.Tensor | None
    token_ids: tuple[int, ...]
    rows: int
    size: tuple[int, int] | None = None  # (height, width) before preprocessing: LLaVA-NeXT


class ImageProcessor:
    """The image side of one VLM: its transformers image processor and its prompt tokens."""

    def __init__(self, vision: VisionLanguageConfig, processor: Any, tokenizer: Any) -> None:
        self.vision = vision
        self.processor = processor
        self.image_token_id = vision.image_token_id
        token = tokenizer.convert_ids_to_tokens(self.image_token_id)
        if not isinstance(token, str) or token not in _special_tokens(tokenizer):
            raise ValueError(
                f"the tokenizer has no special token for image_token_id {self.image_token_id} "
                f"(found {token!r}); a VLM's tokenizer carries its image token"
            )
        self.image_token = token
        self._tokenizer = tokenizer
        if vision.family == "idefics3":
            _check_idefics3_tokens(tokenizer)

    @classmethod
    def for_model(
        cls, config: ModelConfig, folder: str | os.PathLike[str], tokenizer: Any
    ) -> ImageProcessor:
        """The processor saved with the checkpoint in `folder` (preprocessor_config.json)."""
        if config.vision is None:
            raise ValueError(f"a {config.architecture} model takes no images")
        if tokenizer is None:
            raise ValueError("a vision-language model needs its tokenizer for its image tokens")
        path = Path(folder)
        if not (path / PREPROCESSOR_FILE).is_file():
            raise ValueError(
                f"no {PREPROCESSOR_FILE} in {folder}: a vision-language checkpoint's image "
                "preprocessing (size, crop, mean and std) is read from it"
            )
        from transformers import AutoImageProcessor

        return cls(config.vision, AutoImageProcessor.from_pretrained(str(path)), tokenizer)

    @classmethod
    def for_mmproj(
        cls, config: ModelConfig, mmproj: str | os.PathLike[str], tokenizer: Any
    ) -> ImageProcessor:
        """The processor of a VLM loaded from GGUF + mmproj: transformers' image processor
        built from the projector's metadata (no preprocessor_config.json beside it)."""
        from .loaders.mmproj import read_mmproj

        if config.vision is None:
            raise ValueError(f"a {config.architecture} model takes no images")
        if tokenizer is None:
            raise ValueError("a vision-language model needs its tokenizer for its image tokens")
        return cls(config.vision, processor_from_mmproj(read_mmproj(mmproj)), tokenizer)

    def prepare(self, image: ImageInput) -> PreparedImage:
        """Decode and preprocess one image (ValueError for one that is no image)."""
        pil = image.load()
        if self.vision.family == "idefics3":
            out = self.processor(images=[pil], return_tensors="pt", return_row_col_info=True)
            pixels = out["pixel_values"][0].float()
            mask = out.get("pixel_attention_mask")
            patch = self.vision.encoder.patch_size
            full = torch.ones(pixels.shape[0], *pixels.shape[-2:], dtype=torch.bool)
            pixel_mask = full if mask is None else mask[0].bool()
            patch_mask = (
                pixel_mask.unfold(1, patch, patch).unfold(2, patch, patch).sum(dim=(-1, -2)) > 0
            )
            ids = self._idefics3_ids(int(out["rows"][0][0]), int(out["cols"][0][0]))
            rows = pixels.shape[0] * self.vision.tokens_per_image
            return PreparedImage(image.digest, pixels, patch_mask, ids, rows)
        if self.vision.family == "llava_next":
            return self._llava_next(image, pil)
        out = self.processor(images=[pil], return_tensors="pt")
        pixels = out["pixel_values"].float()
        size = self.vision.encoder.image_size
        if pixels.dim() != 4 or tuple(pixels.shape[-2:]) != (size, size):
            raise ValueError(
                f"the image processor gave pixels of shape {tuple(pixels.shape)}; the ViT takes "
                f"[1, C, {size}, {size}] (LLaVA-NeXT's any-resolution tiles are not supported)"
            )
        rows = self.vision.tokens_per_image
        return PreparedImage(image.digest, pixels, None, (self.image_token_id,) * rows, rows)

    def _llava_next(self, image: ImageInput, pil: Any) -> PreparedImage:
        """The whole image and its any-resolution grid of tiles; rows as the model packs them
        (models/llava.py LlavaNextForConditionalGeneration: the same grid and unpadding)."""
        from .vision import anyres_grid, unpadded

        out = self.processor(images=[pil], return_tensors="pt")
        pixels = out["pixel_values"][0].float()
        size = (int(out["image_sizes"][0][0]), int(out["image_sizes"][0][1]))
        enc = self.vision.encoder
        side = enc.patches_per_side
        rows = side * side
        if pixels.shape[0] == 1:
            rows += 1  # the image_newline after the whole image's features
        else:
            gh, gw = anyres_grid(size, self.vision.grid_pinpoints, enc.image_size)
            if pixels.shape[0] != gh * gw + 1:
                raise ValueError(
                    f"the image processor gave {pixels.shape[0]} tiles for a {gh}x{gw} grid "
                    "(+1): do its image_grid_pinpoints match the model's?"
                )
            (top, bottom), (left, right) = unpadded(size, gh * side, gw * side)
            rows += (bottom - top) * (right - left + 1)
        ids = (self.image_token_id,) * rows
        return PreparedImage(image.digest, pixels, None, ids, rows, size)

    def expand(
        self, ids: list[int], images: list[PreparedImage]
    ) -> tuple[list[int], list[np.ndarray]]:
        """The prompt's ids with its k-th image token replaced by the k-th image's tokens,
        and each image's embedding positions in the result. ValueError unless the prompt
        holds one image token per image."""
        marks = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(marks) != len(images):
            raise ValueError(
                f"the prompt has {len(marks)} image token(s) {self.image_token!r} but "
                f"{len(images)} image(s) came with it; one image token stands for each image"
            )
        out: list[int] = []
        spans: list[np.ndarray] = []
        prev = 0
        for mark, image in zip(marks, images):
            out.extend(ids[prev:mark])
            base = len(out)
            tokens = np.asarray(image.token_ids, dtype=np.int64)
            positions = base + np.flatnonzero(tokens == self.image_token_id)
            if len(positions) != image.rows:
                raise ValueError(
                    f"image {image.digest[:12]}: {len(positions)} image tokens for "
                    f"{image.rows} embedding rows"
                )
            spans.append(positions)
            out.extend(image.token_ids)
            prev = mark + 1
        out.extend(ids[prev:])
        return out, spans

    def _idefics3_ids(self, rows: int, cols: int) -> tuple[int, ...]:
        """Idefics3Processor.replace_image_token's text, tokenized: each tile framed by
        <fake_token_around_image><row_r_col_c>, a newline after each row of tiles, then the
        downscaled whole image after <fake_token_around_image><global-img>, and a closing
        <fake_token_around_image> (the text starts and ends with a special token, so it
        tokenizes alone as it does inside the prompt)."""
        fake, image = "<fake_token_around_image>", self.image_token * self.vision.tokens_per_image
        text = ""
        if rows or cols:
            for r in range(rows):
                for c in range(cols):
                    text += f"{fake}<row_{r + 1}_col_{c + 1}>{image}"
                text += "\n"
            text += "\n"
        text += f"{fake}<global-img>{image}{fake}"
        return tuple(self._tokenizer.encode(text, add_special_tokens=False))


def processor_from_mmproj(mmproj: MmprojIndex) -> Any:
    """transformers' image processor as the checkpoint's preprocessor_config.json sets it
    up, from the metadata llama.cpp's converter keeps (image size, mean, std): LLaVA-1.5's
    CLIPImageProcessor (resize the shortest edge to the ViT's size, bicubic, centre crop,
    normalise), SigLIP's (resize to the square), Idefics3's (resize the longest edge to
    clip.vision.preproc_image_size, tiles of the ViT's size)."""
    import transformers

    size = mmproj.encoder.image_size
    common = {
        "image_mean": list(mmproj.image_mean),
        "image_std": list(mmproj.image_std),
        "do_convert_rgb": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_resize": True,
        "rescale_factor": 1 / 255,
    }
    if mmproj.family == "idefics3":
        name = "Idefics3ImageProcessor"
        longest = mmproj.preproc_image_size or size
        config = {
            "size": {"longest_edge": int(longest)},
            "max_image_size": {"longest_edge": size},
            "do_image_splitting": True,
            "do_pad": True,
            "resample": 1,  # LANCZOS, as SmolVLM's
        }
    elif mmproj.encoder.kind == "clip":
        name = "CLIPImageProcessor"
        config = {
            "size": {"shortest_edge": size},
            "crop_size": {"height": size, "width": size},
            "do_center_crop": True,
            "resample": 3,  # BICUBIC
        }
    else:
        name = "SiglipImageProcessor"
        config = {"size": {"height": size, "width": size}, "resample": 3}
    return getattr(transformers, name).from_dict({**common, **config})


def _special_tokens(tokenizer: Any) -> set[str]:
    strings = set(getattr(tokenizer, "all_special_tokens", None) or ())
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    strings |= {getattr(t, "content", None) for t in decoder.values()} - {None}
    return strings


def _check_idefics3_tokens(tokenizer: Any) -> None:
    vocab = tokenizer.get_vocab()
    for token in ("<fake_token_around_image>", "<global-img>"):
        if token not in vocab:
            raise ValueError(f"an Idefics3 tokenizer has the token {token!r}; this one does not")
