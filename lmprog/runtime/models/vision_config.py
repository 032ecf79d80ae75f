"""The vision half of a vision-language model's config: its ViT and how images join the text.

    ModelConfig.vision: VisionLanguageConfig | None     None: a text-only model

A VLM's ModelConfig describes its language model (the decoder the KV pool is shaped for);
`vision` adds the image encoder (CLIP or SigLIP ViT), the projector and the image token.
Read from transformers' config.json (LlavaForConditionalGeneration,
Idefics3ForConditionalGeneration); their sub-configs are completed with transformers' own
defaults, as a checkpoint's config.json often lists only what differs from them (LLaVA-1.5's
text_config names no hidden size). Imports nothing heavy until a config is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

VisionFamily = Literal["llava", "llava_next", "idefics3"]
_ACTIVATIONS = ("quick_gelu", "gelu", "gelu_pytorch_tanh")


@dataclass(frozen=True)
class VisionEncoderConfig:
    """A ViT: CLIP's (class token, pre-norm, no patch bias) or SigLIP's (no class token,
    patch bias, post-norm)."""

    kind: Literal["clip", "siglip"]
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"vision hidden_size {self.hidden_size} is not a multiple of its "
                f"{self.num_heads} heads"
            )
        if self.image_size % self.patch_size:
            raise ValueError(
                f"vision image_size {self.image_size} is not a multiple of patch_size "
                f"{self.patch_size}"
            )
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"unsupported vision hidden_act {self.hidden_act!r}; {_ACTIVATIONS}")

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size


@dataclass(frozen=True)
class VisionLanguageConfig:
    """How images enter the language model.

    llava:    features of ViT layer(s) `feature_layers` (hidden-state indices as transformers
              counts them: 0 the embeddings, i after layer i, negative from the end), CLS
              dropped for select_strategy "default", through a 2-layer MLP projector;
              `tokens_per_image` image tokens per image.
    llava_next: LLaVA's features of every tile of an any-resolution image (the grid that
              best fits it among grid_pinpoints, (height, width) in pixels) and of the whole
              image downscaled; the grid's features unpadded to the image's aspect ratio, a
              learned image_newline after each row.
    idefics3: the ViT's post-normed output of each tile, pixel-shuffled by scale_factor,
              through one linear projection.
    """

    family: VisionFamily
    encoder: VisionEncoderConfig
    image_token_id: int
    feature_layers: tuple[int, ...] = (-2,)
    select_strategy: Literal["default", "full"] = "default"
    projector_hidden_act: str = "gelu"
    projector_bias: bool = True
    scale_factor: int = 1
    grid_pinpoints: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.projector_hidden_act not in _ACTIVATIONS:
            raise ValueError(f"unsupported projector_hidden_act {self.projector_hidden_act!r}")
        if self.select_strategy not in ("default", "full"):
            raise ValueError(f"unknown vision_feature_select_strategy {self.select_strategy!r}")
        n = self.encoder.num_layers
        for layer in self.feature_layers:
            if not -n - 1 <= layer <= n:
                raise ValueError(f"vision_feature_layer {layer} outside a ViT of {n} layers")
        if self.family == "llava_next" and self.select_strategy != "default":
            raise ValueError("LLaVA-NeXT packs its grid of features without CLS: 'default' only")
        if self.family == "llava_next" and (
            not self.grid_pinpoints
            or any(
                h % self.encoder.image_size or w % self.encoder.image_size
                for h, w in self.grid_pinpoints
            )
        ):
            raise ValueError(
                f"LLaVA-NeXT's image_grid_pinpoints {self.grid_pinpoints} must be multiples of the "
                f"ViT's image size {self.encoder.image_size}"
            )
        side = self.encoder.patches_per_side
        if self.family == "idefics3" and (self.scale_factor < 1 or side % self.scale_factor):
            raise ValueError(f"scale_factor {self.scale_factor} does not divide {side} patches")

    @property
    def tokens_per_image(self) -> int:
        """Image tokens (rows of embeddings) per image (LLaVA) or per tile (Idefics3)."""
        patches = self.encoder.patches_per_side**2
        if self.family == "idefics3":
            return patches // self.scale_factor**2
        cls = self.select_strategy == "full" and self.encoder.kind == "clip"  # SigLIP has none
        return patches + (1 if cls else 0)

    def hidden_state_indices(self) -> tuple[int, ...]:
        """feature_layers as non-negative indices into [embeddings, layer 1, ..., layer n]."""
        n = self.encoder.num_layers + 1
        return tuple(i % n for i in self.feature_layers)


def full_sub_config(sub: dict[str, Any], default_type: str) -> dict[str, Any]:
    """A sub-config dict with transformers' defaults for the keys it leaves out."""
    from transformers import CONFIG_MAPPING

    model_type = sub.get("model_type") or default_type
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"unknown sub-config model_type {model_type!r}")
    known = {k: v for k, v in sub.items() if k != "model_type"}
    full: dict[str, Any] = CONFIG_MAPPING[model_type](**known).to_dict()
    full["model_type"] = model_type
    return full


def encoder_from_hf(vision: dict[str, Any], kind: Literal["clip", "siglip"]) -> VisionEncoderConfig:
    def size(key: str) -> int:
        value = vision[key]
        if isinstance(value, (list, tuple)):  # (h, w): only square images here
            if len(set(value)) != 1:
                raise ValueError(f"vision {key} {value} is not square")
            value = value[0]
        return int(value)

    return VisionEncoderConfig(
        kind=kind,
        hidden_size=vision["hidden_size"],
        intermediate_size=vision["intermediate_size"],
        num_layers=vision["num_hidden_layers"],
        num_heads=vision["num_attention_heads"],
        image_size=size("image_size"),
        patch_size=size("patch_size"),
        num_channels=vision.get("num_channels", 3),
        layer_norm_eps=float(vision.get("layer_norm_eps", 1e-5)),
        hidden_act=vision.get("hidden_act", "quick_gelu"),
    )


def llava_from_hf(cfg: dict[str, Any]) -> tuple[dict[str, Any], VisionLanguageConfig]:
    """(the full text config, the vision config) of a LlavaForConditionalGeneration or
    LlavaNextForConditionalGeneration config."""
    vision = full_sub_config(cfg.get("vision_config") or {}, "clip_vision_model")
    text = full_sub_config(cfg.get("text_config") or {}, "llama")
    kind: Literal["clip", "siglip"]
    if vision["model_type"] == "clip_vision_model":
        kind = "clip"
    elif vision["model_type"] == "siglip_vision_model":
        kind = "siglip"
    else:
        raise ValueError(
            f"LLaVA with a {vision['model_type']!r} vision tower is not supported "
            "(clip_vision_model, siglip_vision_model)"
        )
    layer = cfg.get("vision_feature_layer", -2)
    if kind == "siglip" and cfg.get("vision_feature_select_strategy", "default") == "default":
        raise ValueError("LLaVA over SigLIP drops no CLS token: select_strategy 'full' only")
    next_ = cfg.get("model_type") == "llava_next"
    pinpoints = cfg.get("image_grid_pinpoints") or (
        [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]] if next_ else []
    )
    config = VisionLanguageConfig(
        family="llava_next" if next_ else "llava",
        grid_pinpoints=tuple((int(h), int(w)) for h, w in pinpoints) if next_ else (),
        encoder=encoder_from_hf(vision, kind),
        image_token_id=int(cfg.get("image_token_id", cfg.get("image_token_index", 32000))),
        feature_layers=tuple(layer) if isinstance(layer, (list, tuple)) else (int(layer),),
        select_strategy=cfg.get("vision_feature_select_strategy", "default"),
        projector_hidden_act=cfg.get("projector_hidden_act", "gelu"),
        projector_bias=bool(cfg.get("multimodal_projector_bias", True)),
    )
    # as LlavaConfig: tied when the top config or the text config says so
    text["tie_word_embeddings"] = bool(
        cfg.get("tie_word_embeddings") or text["tie_word_embeddings"]
    )
    return text, config


def idefics3_from_hf(cfg: dict[str, Any]) -> tuple[dict[str, Any], VisionLanguageConfig]:
    """(the full text config, the vision config) of an Idefics3ForConditionalGeneration
    config (SmolVLM, Idefics3)."""
    from transformers import Idefics3VisionConfig

    known = {k: v for k, v in (cfg.get("vision_config") or {}).items() if k != "model_type"}
    vision = Idefics3VisionConfig(**known).to_dict()
    text = full_sub_config(cfg.get("text_config") or {"rms_norm_eps": 1e-5}, "llama")
    config = VisionLanguageConfig(
        family="idefics3",
        encoder=encoder_from_hf(vision, "siglip"),
        image_token_id=int(cfg.get("image_token_id", 128257)),
        projector_bias=False,
        scale_factor=int(cfg.get("scale_factor", 2)),
    )
    text["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))  # the top's only
    return text, config
