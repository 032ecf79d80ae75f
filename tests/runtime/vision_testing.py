"""Tiny vision-language checkpoints saved by transformers' own classes (LLaVA: CLIP ViT + MLP
projector + Llama; Idefics3: SigLIP + pixel shuffle + Llama), with their tokenizer (the
default model's, plus the image tokens) and image processor, as a user's download holds them;
and random images."""

from __future__ import annotations

import io

import numpy as np

IMAGE = "<image>"
IDEFICS3_TOKENS = ["<fake_token_around_image>", IMAGE, "<end_of_utterance>", "<global-img>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)
]


def vlm_tokenizer(extra: list[str]):
    """The default model's HF tokenizer with `extra` special tokens (skips without it)."""
    from hf_tiny import default_hf_tokenizer

    tok = default_hf_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": extra})
    return tok


def _randomize(model, seed: int = 0):
    """Random weights large enough that attention and the projector are far from uniform;
    layer norms near 1 (the ViT's residual stream stays well scaled)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layer_norm" in name or "layrnorm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.2 if p.dim() > 1 else 0.3))
    return model.eval()


def _text_config(tok):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )


def save_tiny_llava(folder, tok=None, **overrides):
    """A LlavaForConditionalGeneration of a 28x28-pixel CLIP ViT (patch 7: 16 image tokens),
    written to folder with its tokenizer and CLIPImageProcessor; returns (hf model, tokenizer)."""
    import torch
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    tok = tok or vlm_tokenizer([IMAGE])
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=28,
        patch_size=7,
        projection_dim=16,
    )
    kw = dict(
        vision_config=vision,
        text_config=_text_config(tok),
        image_token_index=tok.convert_tokens_to_ids(IMAGE),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_seq_length=16,
    )
    kw.update(overrides)
    torch.manual_seed(0)
    hf = _randomize(LlavaForConditionalGeneration(LlavaConfig(**kw)))
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    _write_json(folder / "preprocessor_config.json", _LLAVA_PREPROCESSOR)
    return hf, tok


def save_tiny_llava_siglip_qwen2(folder, tok=None):
    """LlavaForConditionalGeneration as llava-interleave-qwen-0.5b-hf builds it: a SigLIP ViT
    (no class token: select_strategy "full", its last layer) and a Qwen2 decoder."""
    import torch
    from transformers import (
        LlavaConfig,
        LlavaForConditionalGeneration,
        Qwen2Config,
        SiglipVisionConfig,
    )

    tok = tok or vlm_tokenizer([IMAGE])
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=28,
        patch_size=7,
        vision_use_head=False,
    )
    text = Qwen2Config(
        **{
            k: v
            for k, v in _text_config(tok).to_dict().items()
            if k
            in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "max_position_embeddings",
                "eos_token_id",
                "bos_token_id",
            )
        }
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids(IMAGE),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        image_seq_length=16,
    )
    torch.manual_seed(0)
    hf = _randomize(LlavaForConditionalGeneration(config))
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    pre = {k: v for k, v in _LLAVA_PREPROCESSOR.items() if k not in ("crop_size", "do_center_crop")}
    pre.update(
        image_processor_type="SiglipImageProcessor",
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        size={"height": 28, "width": 28},
    )
    _write_json(folder / "preprocessor_config.json", pre)
    return hf, tok


GRID = [[28, 56], [56, 28], [56, 56]]  # LLaVA-NeXT's pinpoints at this test's tile size


def save_tiny_llava_next(folder, tok=None):
    """A LlavaNextForConditionalGeneration of the same CLIP ViT (16 tokens a tile), grids of up
    to 2x2 tiles; written with its tokenizer and LlavaNextImageProcessor config."""
    import torch
    from transformers import CLIPVisionConfig, LlavaNextConfig, LlavaNextForConditionalGeneration

    tok = tok or vlm_tokenizer([IMAGE])
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=28,
        patch_size=7,
        projection_dim=16,
    )
    config = LlavaNextConfig(
        vision_config=vision,
        text_config=_text_config(tok),
        image_token_index=tok.convert_tokens_to_ids(IMAGE),
        image_grid_pinpoints=GRID,
        vision_feature_layer=-2,
    )
    torch.manual_seed(0)
    hf = _randomize(LlavaNextForConditionalGeneration(config))
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    pre = dict(_LLAVA_PREPROCESSOR, image_processor_type="LlavaNextImageProcessor")
    pre.update(image_grid_pinpoints=GRID, do_pad=True)
    _write_json(folder / "preprocessor_config.json", pre)
    return hf, tok


def save_tiny_idefics3(folder, tok=None):
    """An Idefics3ForConditionalGeneration (SmolVLM's layout) of a 28x28 SigLIP ViT (patch 7,
    scale factor 2: 4 tokens per tile), images split into tiles of 28 up to 84 pixels a side;
    returns (hf model, tokenizer)."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    tok = tok or vlm_tokenizer(IDEFICS3_TOKENS)
    config = Idefics3Config(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=28,
            patch_size=7,
        ),
        text_config=_text_config(tok).to_dict(),
        image_token_id=tok.convert_tokens_to_ids(IMAGE),
        scale_factor=2,
    )
    torch.manual_seed(0)
    hf = _randomize(Idefics3ForConditionalGeneration(config))
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    _write_json(folder / "preprocessor_config.json", _IDEFICS3_PREPROCESSOR)
    return hf, tok


# preprocessor_config.json as llava-hf/llava-1.5-7b-hf and HuggingFaceTB/SmolVLM-256M-Instruct
# ship it, at this test's sizes (transformers picks its PIL or torchvision backend)
_LLAVA_PREPROCESSOR = {
    "crop_size": {"height": 28, "width": 28},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "CLIPImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 28},
}
_IDEFICS3_PREPROCESSOR = {
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Idefics3ImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 28},
    "resample": 1,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 84},
}


def _write_json(path, obj) -> None:
    import json

    path.write_text(json.dumps(obj, indent=2))


def random_png(seed: int, size: tuple[int, int] = (40, 32)) -> bytes:
    """A PNG of random pixels (width, height)."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()
