"""Image question answering throughput (issue 32): lp.Runtime on a LLaVA-1.5-7B shape (CLIP
ViT-L/14 at 336 px: 576 image tokens; a Llama-2-7B decoder), random weights in bf16, beside
transformers' `generate` on the same inputs.

    python3 bench/bench_vision.py              # GPU: LLaVA-1.5-7B shape
    python3 bench/bench_vision.py --smoke      # every path on the CPU, a toy model (timings
                                               # meaningless)
    python3 bench/bench_vision.py --images 16 --questions 8 --max-tokens 32

Workload: --images distinct random 640x480 images, --questions questions about each (the
prompt "USER: <image>\\n{question} ASSISTANT:", greedy, ignore_eos, --max-tokens out), in
image-major order. Rows, each on the same workload:

    lmprog, batch 1, cache on/off     one request at a time (radix_cache True / False)
    lmprog, batch 64, cache on/off    64 requests in flight (threads over lp.Runtime)
    transformers generate, batch 1    LlavaForConditionalGeneration.generate, the first
                                      --hf-requests requests (sdpa attention)
    encoder alone                     model.encode_images over 64 images (one batch)

Each row prints images/s (questions answered: one image each), output tokens/s and the mean
cached tokens per request; the encoder row the vision encoder's images/s and its share of a
batch-1 request's time. The model folder (config.json, the default model's tokenizer with
<image> added, preprocessor_config.json) is written to a temporary folder; lp.Runtime loads it
with load_format="dummy".
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QUESTIONS = [
    "What is in the picture?",
    "Describe the colours.",
    "How many objects are there?",
    "Is it indoors or outdoors?",
    "What stands out the most?",
    "Write a caption.",
    "What time of day is it?",
    "What would you title it?",
]
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def log(*args) -> None:
    print(*args, flush=True)


def write_folder(folder: Path, smoke: bool):
    """config.json of a LLaVA-1.5-7B shape (toy with --smoke), the tokenizer, the processor."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    from lmprog.core.models import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model())
    tok = tok.hf_tokenizer() if hasattr(tok, "hf_tokenizer") else tok
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    if smoke:
        vision = CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=3,
            num_attention_heads=4,
            image_size=28,
            patch_size=7,
        )
        text = dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    else:
        vision = CLIPVisionConfig(
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            image_size=336,
            patch_size=14,
            projection_dim=768,
        )
        text = dict(
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
        )
    config = LlavaConfig(
        vision_config=vision,
        text_config=LlamaConfig(
            vocab_size=len(tok), max_position_embeddings=4096, eos_token_id=tok.eos_token_id, **text
        ),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        image_seq_length=(vision.image_size // vision.patch_size) ** 2,
    )
    config.save_pretrained(folder)
    tok.save_pretrained(folder)
    size = vision.image_size
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "crop_size": {"height": size, "width": size},
                "do_center_crop": True,
                "do_convert_rgb": True,
                "do_normalize": True,
                "do_rescale": True,
                "do_resize": True,
                "image_mean": CLIP_MEAN,
                "image_processor_type": "CLIPImageProcessor",
                "image_std": CLIP_STD,
                "resample": 3,
                "rescale_factor": 1 / 255,
                "size": {"shortest_edge": size},
            }
        )
    )
    return config, tok


def random_png(seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def workload(args):
    from lmprog.core.images import ImageInput

    images = [ImageInput.from_bytes(random_png(i)) for i in range(args.images)]
    return [
        (f"USER: <image>\n{QUESTIONS[q % len(QUESTIONS)]} ASSISTANT:", image)
        for image in images
        for q in range(args.questions)
    ]


def run_lmprog(rt, work, concurrency: int, max_tokens: int) -> dict:
    from lmprog.core.protocol import GenerateRequest
    from lmprog.core.sampling import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    def one(item):
        prompt, image = item
        return rt.generate(GenerateRequest(prompt, params, images=(image,)))

    rt.flush_cache()
    start = time.perf_counter()
    if concurrency == 1:
        results = [one(item) for item in work]
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(one, work))
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "images_per_s": len(work) / seconds,
        "tokens_per_s": sum(r.completion_tokens for r in results) / seconds,
        "cached": statistics.mean(r.cached_tokens for r in results),
        "prompt": statistics.mean(r.prompt_tokens for r in results),
    }


def run_transformers(folder: Path, config, tok, work, max_tokens: int, device, dtype) -> dict:
    from transformers import AutoImageProcessor, LlavaForConditionalGeneration, LlavaProcessor

    with torch.device(device):
        hf = LlavaForConditionalGeneration(config).to(dtype).eval()
    proc = LlavaProcessor(
        image_processor=AutoImageProcessor.from_pretrained(str(folder)),
        tokenizer=tok,
        patch_size=config.vision_config.patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    tokens = 0
    start = time.perf_counter()
    for prompt, image in work:
        inputs = proc(text=prompt, images=[image.load()], return_tensors="pt").to(device)
        inputs["pixel_values"] = inputs["pixel_values"].to(dtype)
        with torch.inference_mode():
            out = hf.generate(
                **inputs, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False
            )
        tokens += out.shape[1] - inputs["input_ids"].shape[1]
    _sync(device)
    seconds = time.perf_counter() - start
    del hf
    return {
        "seconds": seconds,
        "images_per_s": len(work) / seconds,
        "tokens_per_s": tokens / seconds,
    }


def encoder_alone(rt, work, n: int = 64) -> float:
    """Images/s of the runtime model's vision encoder over n preprocessed images at once."""
    model = rt.engine.runner.model
    prepared = [rt._images.prepare(image) for _, image in (work * n)[:n]]
    model.encode_images(prepared[:2])  # warm-up
    _sync(rt.device)
    start = time.perf_counter()
    model.encode_images(prepared)
    _sync(rt.device)
    return n / (time.perf_counter() - start)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a toy model on the CPU")
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--hf-requests", type=int, default=16)
    args = ap.parse_args()
    if args.smoke:
        args.images, args.questions, args.max_tokens, args.hf_requests = 3, 2, 4, 2
    import lmprog as lp

    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config, tok = write_folder(folder, args.smoke)
        work = workload(args)
        log(
            f"{len(work)} requests: {args.images} images x {args.questions} questions, "
            f"{args.max_tokens} tokens out; device {device}"
        )
        rows = []
        for radix in (True, False):
            with lp.Runtime(
                str(folder), device=device, load_format="dummy", radix_cache=radix
            ) as rt:
                run_lmprog(rt, work[:1], 1, 2)  # warm-up: first-step allocations, kernels
                for concurrency in (1, 64):
                    r = run_lmprog(rt, work, concurrency, args.max_tokens)
                    rows.append(
                        (f"lmprog, batch {concurrency}, cache {'on' if radix else 'off'}", r)
                    )
                    log(
                        f"{rows[-1][0]:34s} {r['images_per_s']:8.2f} images/s "
                        f"{r['tokens_per_s']:9.1f} tok/s  prompt {r['prompt']:.0f}, "
                        f"cached {r['cached']:.0f}"
                    )
                if radix:
                    enc = encoder_alone(rt, work)
                    share = (1 / enc) / (rows[0][1]["seconds"] / len(work))
                    log(
                        f"{'encoder alone (64 images)':34s} {enc:8.2f} images/s; "
                        f"{100 * share:.1f}% of a batch-1 request's time"
                    )
        r = run_transformers(
            folder, config, tok, work[: args.hf_requests], args.max_tokens, device, dtype
        )
        log(
            f"{'transformers generate, batch 1':34s} {r['images_per_s']:8.2f} images/s "
            f"{r['tokens_per_s']:9.1f} tok/s  ({args.hf_requests} requests)"
        )


if __name__ == "__main__":
    main()
