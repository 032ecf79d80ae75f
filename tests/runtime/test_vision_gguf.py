"""Vision-language models from GGUF + mmproj (issue 32): a tiny LLaVA-1.5 and a tiny Idefics3
(SmolVLM) saved by transformers, their decoders written as convert_hf_to_gguf.py writes a text
GGUF and their ViT + projector as llama.cpp's converters write an mmproj file (names,
metadata, shapes, F16 matrices), then loaded by lmprog both ways.

The safetensors checkpoint holds the same F16-rounded values the GGUFs store, so the two
loads compute the same function: logits within fp32 tolerance, greedy tokens equal through
lp.Runtime, the image processor built from the mmproj metadata giving transformers' pixels.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from vision_testing import (
    IMAGE,
    paged_logits,
    random_png,
    save_tiny_idefics3,
    save_tiny_llava,
    write_idefics3_mmproj,
    write_llava_mmproj,
    write_text_gguf,
)

import lmprog as lp
from lmprog.core.images import ImageInput
from lmprog.core.prompt import encode_prompt
from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams
from lmprog.runtime.images import ImageRun
from lmprog.runtime.models import load_model
from lmprog.runtime.models.image_processing import ImageProcessor

torch.set_num_threads(1)
ATOL = 2e-4
PROMPT = f"USER: {IMAGE}\nWhat is in the picture? ASSISTANT:"


def _round_to_f16(hf, folder) -> None:
    """The checkpoint re-saved with the values the GGUFs hold (matrices rounded to F16)."""
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() >= 2:
                p.copy_(p.half().float())
    hf.save_pretrained(folder)


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-llava-gguf")
    hf, tok = save_tiny_llava(root / "hf")
    _round_to_f16(hf, root / "hf")
    write_text_gguf(hf.model.language_model, hf.lm_head, tok, root / "llava.gguf")
    write_llava_mmproj(hf, root / "mmproj-llava-f16.gguf")
    return root, hf, tok


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LMPROG_CACHE_DIR", str(tmp_path / "cache"))


def _expanded(model, proc, tok, prompt, pngs):
    prepared = [proc.prepare(ImageInput.from_bytes(p)) for p in pngs]
    ids, positions = proc.expand(encode_prompt(tok, prompt), prepared)
    return ids, [ImageRun(p, pos) for p, pos in zip(prepared, positions)]


def test_llava_gguf_and_mmproj_load_as_the_safetensors_checkpoint(llava, tmp_path):
    root, _, tok = llava
    ref = load_model(root / "hf")
    ours = load_model(root / "llava.gguf", mmproj=root / "mmproj-llava-f16.gguf")
    # the legacy converter dropped the ViT's last block: feature layer -2 of 3 is its last
    assert ours.config.architecture == "llava" and ours.config.vision.encoder.num_layers == 2
    assert ours.config.vision.hidden_state_indices() == ref.config.vision.hidden_state_indices()
    assert ours.config.vision.tokens_per_image == 16
    want_proc = ImageProcessor.for_model(ref.config, root / "hf", tok)
    proc = ImageProcessor.for_mmproj(ours.config, root / "mmproj-llava-f16.gguf", tok)
    for size in ((40, 32), (23, 61)):  # resized by the shortest edge, centre-cropped
        png = random_png(11, size)
        ids, runs = _expanded(ours, proc, tok, PROMPT, [png])
        want_ids, want_runs = _expanded(ref, want_proc, tok, PROMPT, [png])
        assert ids == want_ids
        torch.testing.assert_close(runs[0].image.pixels, want_runs[0].image.pixels, atol=0, rtol=0)
        want = paged_logits(ref, want_ids, want_runs)
        got = paged_logits(ours, ids, runs, cuts=(runs[0].start + 6,))
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    # the converter run on a config naming vision_feature_layer writes it (non-negative)
    named = tmp_path / "mmproj-named.gguf"
    _rewrite(root / "mmproj-llava-f16.gguf", named, feature_layers=[2])
    again = load_model(root / "llava.gguf", mmproj=named)
    assert again.config.vision.feature_layers == (2,)
    cuts = (runs[0].start + 6,)
    torch.testing.assert_close(paged_logits(again, ids, runs, cuts), got, atol=0, rtol=0)
    _rewrite(root / "mmproj-llava-f16.gguf", named, feature_layers=[1])  # an earlier layer
    earlier = load_model(root / "llava.gguf", mmproj=named)
    assert (paged_logits(earlier, ids, runs) - got).abs().max() > 1e-2


def test_runtime_over_gguf_and_mmproj_generates_as_over_safetensors(llava):
    root, _, _ = llava
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    png = random_png(12)
    request = GenerateRequest(PROMPT, params, images=(ImageInput.from_bytes(png),))
    with lp.Runtime(str(root / "hf"), device="cpu", max_total_tokens=512) as rt:
        want = rt.generate(request)
    with lp.Runtime(
        model=str(root / "llava.gguf"),
        mmproj=str(root / "mmproj-llava-f16.gguf"),
        device="cpu",
        max_total_tokens=512,
        max_running_requests=4,
        max_num_batched_tokens=8,  # the image run prefilled over chunks
    ) as rt:
        assert rt.image_token == IMAGE
        got = rt.generate(request)
        assert got.token_ids == want.token_ids and got.prompt_tokens == want.prompt_tokens
        again = rt.generate(request)  # the same image: its KV is reused
        assert again.cached_tokens == want.prompt_tokens - 1 and again.token_ids == got.token_ids


def test_idefics3_gguf_and_mmproj_load_as_the_safetensors_checkpoint(tmp_path):
    hf, tok = save_tiny_idefics3(tmp_path / "hf")
    _round_to_f16(hf, tmp_path / "hf")
    write_text_gguf(hf.model.text_model, hf.lm_head, tok, tmp_path / "smolvlm.gguf")
    write_idefics3_mmproj(hf, tmp_path / "mmproj-smolvlm.gguf")
    ref = load_model(tmp_path / "hf")
    ours = load_model(tmp_path / "smolvlm.gguf", mmproj=tmp_path / "mmproj-smolvlm.gguf")
    assert ours.config.vision == ref.config.vision
    want_proc = ImageProcessor.for_model(ref.config, tmp_path / "hf", tok)
    proc = ImageProcessor.for_mmproj(ours.config, tmp_path / "mmproj-smolvlm.gguf", tok)
    prompt = f"User:{IMAGE} and {IMAGE}?<end_of_utterance>\nAssistant:"
    pngs = [random_png(2, (50, 20)), random_png(3, (20, 20))]  # tiled: 2x3 and 1x1
    ids, runs = _expanded(ours, proc, tok, prompt, pngs)
    want_ids, want_runs = _expanded(ref, want_proc, tok, prompt, pngs)
    assert ids == want_ids
    for run, want_run in zip(runs, want_runs):
        torch.testing.assert_close(run.image.pixels, want_run.image.pixels, atol=0, rtol=0)
    want = paged_logits(ref, want_ids, want_runs)
    torch.testing.assert_close(paged_logits(ours, ids, runs), want, atol=ATOL, rtol=0)
    if importlib.util.find_spec("llama_cpp") is None:
        return
    # llama.cpp's own loader takes the files (its tiling is its own: not compared)
    from lmprog.backends.llamacpp_native import NativeModel
    from lmprog.backends.llamacpp_vision import NativeVision

    vision = NativeVision(
        tmp_path / "mmproj-smolvlm.gguf",
        NativeModel(tmp_path / "smolvlm.gguf"),
        n_threads=1,
        use_gpu=False,
    )
    vision.close()


def _rewrite(src, dst, *, drop=(), projector=None, feature_layers=None) -> None:
    """A copy of the GGUF `src` without the tensors `drop`, its projector type changed, the
    feature layers named (clip.vision.feature_layer)."""
    import gguf

    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), "clip")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key == "clip.projector_type" and projector is not None:
            value = projector
        sub = field.types[1] if len(field.types) > 1 else None
        w.add_key_value(key, value, field.types[0], sub)
    if feature_layers is not None:
        w.add_array("clip.vision.feature_layer", list(feature_layers))
    for t in reader.tensors:
        if t.name not in drop:
            w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_wrong_mmproj_is_refused_naming_the_file(llava, tmp_path):
    root, _, _ = llava
    text, mm = root / "llava.gguf", root / "mmproj-llava-f16.gguf"
    with pytest.raises(ValueError, match=r"llava\.gguf is not an mmproj file: a 'llama' GGUF"):
        load_model(text, mmproj=text)
    with pytest.raises(ValueError, match=r"mmproj-llava-f16\.gguf.*vision projector.*mmproj="):
        load_model(mm)  # the projector given as the model
    with pytest.raises(ValueError, match="goes with the GGUF of a vision-language model"):
        load_model(root / "hf", mmproj=mm)
    broken = tmp_path / "mmproj-broken.gguf"
    _rewrite(mm, broken, drop=("v.blk.1.attn_q.weight", "mm.2.weight"))
    with pytest.raises(ValueError, match=r"mmproj-broken\.gguf lacks 2 tensor.*v\.blk\.1\.attn_q"):
        load_model(text, mmproj=broken)
    other = tmp_path / "mmproj-ldp.gguf"
    _rewrite(mm, other, projector="ldp")
    with pytest.raises(ValueError, match=r"mmproj-ldp\.gguf: projector type 'ldp' is not supp"):
        load_model(text, mmproj=other)
    with pytest.raises(ValueError, match="does not exist"):
        load_model(text, mmproj=tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match=r"not a GGUF file"):
        (tmp_path / "junk.gguf").write_bytes(b"junk" * 10)
        load_model(text, mmproj=tmp_path / "junk.gguf")


def test_a_gguf_vlm_is_refused_under_tensor_parallelism_before_any_rank_starts(llava):
    root, _, _ = llava
    with pytest.raises(ValueError, match=r"tensor parallelism yet: use tp_size=1"):
        lp.Runtime(str(root / "llava.gguf"), mmproj=str(root / "mmproj-llava-f16.gguf"), tp_size=2)


def _llama_cpp_embeddings(text, mmproj, png):
    """llama.cpp's (libmtmd's) embeddings of one image: [image tokens, hidden]."""
    import numpy as np

    from lmprog.backends.llamacpp_native import NativeModel
    from lmprog.backends.llamacpp_vision import NativeVision

    model = NativeModel(text)
    vision = NativeVision(mmproj, model, n_threads=1, use_gpu=False)
    try:
        run = vision.image_run(ImageInput.from_bytes(png))
        assert vision.mtmd.mtmd_encode_chunk(vision.ptr, run.chunk) == 0
        hidden = model.lib.llama_model_n_embd(model.ptr)
        out = vision.mtmd.mtmd_get_output_embd(vision.ptr)
        return np.ctypeslib.as_array(out, shape=(len(run.ids) * hidden,)).reshape(-1, hidden).copy()
    finally:
        vision.close()


def test_llama_cpp_reads_the_test_files_as_the_runtime_does_but_for_its_class_token(
    llava, tmp_path, monkeypatch
):
    """The files these tests write are llama.cpp's layout: libmtmd loads them (finding the
    legacy swapped ffn names) and its image embeddings equal the runtime's up to F16
    rounding, once the runtime places CLIP's class token as clip.cpp does (after the
    patches, the patch rows then read from position 1: the first patch dropped, the class
    token kept). The runtime keeps transformers' order, which the model was trained with.
    Without clip.vision.feature_layer clip.cpp also runs one block fewer than the file holds
    (the converter already dropped one): the runtime runs them all (feature layer -2)."""
    pytest.importorskip("llama_cpp.mtmd_cpp")
    root, _, tok = llava
    text, mm = root / "llava.gguf", root / "mmproj-llava-f16.gguf"
    named = tmp_path / "mmproj-named.gguf"
    _rewrite(mm, named, feature_layers=[2])  # explicit: both run the file's two blocks
    png = random_png(12, (28, 28))  # the ViT's size: no resampling on either side
    theirs = torch.from_numpy(_llama_cpp_embeddings(text, named, png))
    ours = load_model(text, mmproj=named)
    image = ImageProcessor.for_mmproj(ours.config, named, tok).prepare(ImageInput.from_bytes(png))
    own_order = ours.encode_images([image])[0]
    embeddings = ours.vision_tower.embeddings

    def class_token_last(pixels, patch_mask=None):
        x = embeddings.patch_embedding(pixels).flatten(2).transpose(1, 2)
        x = torch.cat([x, embeddings.class_embedding.expand(x.shape[0], 1, -1)], dim=1)
        return x + embeddings.position_embedding.weight

    monkeypatch.setattr(embeddings, "forward", class_token_last)
    as_clip_cpp = ours.encode_images([image])[0]
    torch.testing.assert_close(as_clip_cpp, theirs, atol=0.05, rtol=0.01)
    assert (own_order - theirs).abs().max() > 1.0  # the class token's place matters
    # no feature_layer key: clip.cpp runs n_layer - 1 blocks, i.e. feature layer 1 here
    earlier = tmp_path / "mmproj-first.gguf"
    _rewrite(mm, earlier, feature_layers=[1])
    torch.testing.assert_close(
        torch.from_numpy(_llama_cpp_embeddings(text, mm, png)),
        torch.from_numpy(_llama_cpp_embeddings(text, earlier, png)),
        atol=0,
        rtol=0,
    )
