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


def paged_logits(model, ids, runs, cuts=()):
    """Every position's logits, the prompt fed in chunks split at `cuts` through the paged
    pool (slots scattered), each chunk's image rows embedded as the engine does."""
    from dataclasses import replace

    import torch

    from lmprog.runtime.executor.forward_batch import ForwardBatch
    from lmprog.runtime.executor.kv_pool import KVPool
    from lmprog.runtime.images import keyed_ids

    kv = KVPool.for_model(model.config, 400, torch.float32, torch.device("cpu"))
    table = torch.zeros(1, 256, dtype=torch.int32)
    slots = (torch.randperm(400, generator=torch.Generator().manual_seed(0)) + 1)[: len(ids)]
    table[0, : len(ids)] = slots.to(torch.int32)
    keyed = keyed_ids(ids, runs)
    embeds = model.encode_images([r.image for r in runs])
    out = []
    bounds = [0, *cuts, len(ids)]
    for a, b in zip(bounds, bounds[1:]):
        batch = ForwardBatch.build(
            input_ids=keyed[a:b],
            out_cache_loc=slots[a:b].tolist(),
            req_pool_indices=[0],
            seq_lens=[b],
            extend_lens=[b - a],
            req_to_token=table,
            logits_indices=range(b - a),
        )
        rows, parts = [], []
        for run, emb in zip(runs, embeds):
            inside = [(i, p) for i, p in enumerate(run.positions.tolist()) if a <= p < b]
            rows += [p - a for _, p in inside]
            parts += [emb[i] for i, _ in inside]
        if rows:
            batch = replace(batch, image_rows=torch.tensor(rows), image_embeds=torch.stack(parts))
        with torch.inference_mode():
            out.append(model(batch, kv))
    return torch.cat(out)


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


# ---------------------------------------------------------------- GGUF + mmproj, as llama.cpp


def _f16_or_f32(array, name: str):
    """--outtype f16 as llama.cpp's converters write it: 2-D weights (and the 4-D patch
    convolution) in F16, the rest (norms, biases, the class embedding) in F32."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    if array.ndim == 4 or (array.ndim == 2 and name.endswith(".weight")):
        return array.astype(np.float16)
    return array


def write_text_gguf(decoder, lm_head, tok, path) -> None:
    """A VLM's decoder (transformers' LlamaModel inside it, and its lm_head) as
    convert_hf_to_gguf.py writes it: llama arch, F16, Q/K rows permuted for llama.cpp's
    RoPE, and the tokenizer: the default model's GGUF vocabulary and merges plus the added
    special tokens (CONTROL, as the converter types them)."""
    import gguf

    from lmprog.core.models import resolve_model

    cfg = decoder.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    base = gguf.GGUFReader(resolve_model().path)
    tokens = base.fields["tokenizer.ggml.tokens"].contents()
    types = base.fields["tokenizer.ggml.token_type"].contents()
    added = [t for t in tok.convert_ids_to_tokens(range(len(tokens), len(tok)))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(base.fields["tokenizer.ggml.pre"].contents())
    w.add_token_list(tokens + added)
    w.add_token_types(types + [gguf.TokenType.CONTROL] * len(added))
    w.add_token_merges(base.fields["tokenizer.ggml.merges"].contents())
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_add_bos_token(False)
    block = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    top = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight"}
    heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
    for name, p in {**decoder.state_dict(), "lm_head.weight": lm_head.weight.detach()}.items():
        array = p.float().numpy()
        if name == "lm_head.weight":
            out = "output.weight"
        elif name.startswith("layers."):
            _, layer, *rest = name.split(".")
            out = f"blk.{layer}.{block['.'.join(rest[:-1])]}.{rest[-1]}"
            kind = out.split(".")[2]
            if kind in heads:  # convert_hf_to_gguf's LlamaModel.permute
                n = heads[kind]
                array = array.reshape(n, 2, array.shape[0] // n // 2, -1)
                array = array.swapaxes(1, 2).reshape(p.shape)
        else:
            out = top[name]
        w.add_tensor(out, _f16_or_f32(array, out))
    _finish(w)


def write_llava_mmproj(hf, path) -> None:
    """A LLaVA-1.5 projector as llama.cpp's legacy convert_image_encoder_to_gguf.py
    --llava-projector writes it from the CLIP ViT's folder (no vision_feature_layer there):
    the ViT's last block dropped (block_count n - 1), mlp.fc1 named ffn_down and fc2 ffn_up,
    CLIP's post-norm left out, the projector as mm.0 / mm.2; F16 matrices."""
    import gguf

    vcfg = hf.config.vision_config
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_llava_projector", True)
    w.add_file_type(1)
    w.add_name("tiny-llava")
    w.add_description("image encoder for LLaVA")
    w.add_string("clip.projector_type", "mlp")
    w.add_uint32("clip.vision.image_size", vcfg.image_size)
    w.add_uint32("clip.vision.patch_size", vcfg.patch_size)
    w.add_uint32("clip.vision.embedding_length", vcfg.hidden_size)
    w.add_uint32("clip.vision.feed_forward_length", vcfg.intermediate_size)
    w.add_uint32("clip.vision.projection_dim", vcfg.projection_dim)
    w.add_uint32("clip.vision.attention.head_count", vcfg.num_attention_heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", vcfg.layer_norm_eps)
    w.add_uint32("clip.vision.block_count", vcfg.num_hidden_layers - 1)
    w.add_array("clip.vision.image_mean", _LLAVA_PREPROCESSOR["image_mean"])
    w.add_array("clip.vision.image_std", _LLAVA_PREPROCESSOR["image_std"])
    w.add_bool("clip.use_gelu", vcfg.hidden_act == "gelu")
    projector = hf.model.multi_modal_projector.state_dict()
    for name, p in projector.items():
        out = "mm." + name.replace("linear_1", "0").replace("linear_2", "2")
        w.add_tensor(out, _f16_or_f32(p.float().numpy(), out))
    last = vcfg.num_hidden_layers - 1
    for name, p in hf.model.vision_tower.state_dict().items():
        name = name.removeprefix("vision_model.")
        if name.startswith("post_layernorm") or name.startswith(f"encoder.layers.{last}."):
            continue
        out = "v." + (
            name.replace("encoder.layers", "blk")
            .replace("embeddings.", "")
            .replace("_proj", "")
            .replace("self_attn.", "attn_")
            .replace("layer_norm", "ln")
            .replace("mlp.fc1", "ffn_down")  # (sic: the legacy converter's names)
            .replace("mlp.fc2", "ffn_up")
            .replace("embedding", "embd")
            .replace("pre_layrnorm", "pre_ln")
        )
        w.add_tensor(out, _f16_or_f32(p.float().numpy(), out))
    _finish(w)


def write_idefics3_mmproj(hf, path) -> None:
    """A SmolVLM / Idefics3 projector as convert_hf_to_gguf.py --mmproj writes it
    (SmolVLMModel: projector_type idefics3, gguf-py's tensor names, embeddings in F32)."""
    import gguf

    vcfg = hf.config.vision_config
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_clip_has_vision_encoder(True)
    w.add_vision_projection_dim(hf.config.text_config.hidden_size)
    w.add_vision_image_size(vcfg.image_size)
    w.add_vision_patch_size(vcfg.patch_size)
    w.add_vision_embedding_length(vcfg.hidden_size)
    w.add_vision_feed_forward_length(vcfg.intermediate_size)
    w.add_vision_block_count(vcfg.num_hidden_layers)
    w.add_vision_head_count(vcfg.num_attention_heads)
    w.add_vision_image_mean(_IDEFICS3_PREPROCESSOR["image_mean"])
    w.add_vision_image_std(_IDEFICS3_PREPROCESSOR["image_std"])
    w.add_clip_projector_type(gguf.VisionProjectorType.IDEFICS3)
    w.add_vision_attention_layernorm_eps(vcfg.layer_norm_eps)
    w.add_vision_projector_scale_factor(hf.config.scale_factor)
    w.add_vision_use_gelu(True)
    w.add_vision_preproc_image_size(_IDEFICS3_PREPROCESSOR["size"]["longest_edge"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, vcfg.num_hidden_layers)
    for prefix, module in (
        ("model.vision_model.", hf.model.vision_model),
        ("model.connector.", hf.model.connector),
    ):
        for name, p in module.state_dict().items():
            out = names.get_name(prefix + name, try_suffixes=(".weight", ".bias"))
            assert out is not None, prefix + name
            array = p.float().numpy()
            if ".embeddings." in name:  # SmolVLMModel.tensor_force_quant
                w.add_tensor(out, np.ascontiguousarray(array))
            else:
                w.add_tensor(out, _f16_or_f32(array, out))
    _finish(w)


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
