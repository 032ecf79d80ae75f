"""Vision-language models in the runtime (issue 32): tiny LLaVA and Idefics3 (SmolVLM)
checkpoints saved by transformers, loaded by lmprog.

Against transformers: the prompt's expansion and pixels equal its processor's; logits over the
paged pool (prefill, and chunked prefill split inside the image run) within tolerance; greedy
outputs equal in fp32 through lp.Runtime. Through the engine: a second question about the same
image reuses the KV of the image run, a different image never does, a batch mixing image and
text requests equals each alone, a text-only model refuses images.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vision_testing import (
    IMAGE,
    paged_logits,
    random_png,
    save_tiny_idefics3,
    save_tiny_llava,
    save_tiny_llava_next,
    save_tiny_llava_siglip_qwen2,
)

import lmprog as lp
from lmprog.core.images import ImageInput
from lmprog.core.prompt import encode_prompt
from lmprog.core.protocol import GenerateRequest, ScoreRequest
from lmprog.core.sampling import SamplingParams
from lmprog.runtime.images import IMAGE_KEY_BASE, ImageRun, image_keys, keyed_ids, step_images
from lmprog.runtime.models import load_model
from lmprog.runtime.models.image_processing import ImageProcessor

torch.set_num_threads(1)
ATOL = 2e-4  # fp32, tiny random models: logits of magnitude ~1-10
PROMPT = f"USER: {IMAGE}\nWhat is in the picture? ASSISTANT:"


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llava")
    hf, tok = save_tiny_llava(folder)
    return folder, hf, tok


@pytest.fixture(scope="module")
def idefics3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-idefics3")
    hf, tok = save_tiny_idefics3(folder)
    return folder, hf, tok


def _ours(model, folder, tok, prompt, pngs):
    """Our expansion of `prompt` with its images: (ids, runs)."""
    proc = ImageProcessor.for_model(model.config, folder, tok)
    prepared = [proc.prepare(ImageInput.from_bytes(p)) for p in pngs]
    ids, positions = proc.expand(encode_prompt(tok, prompt), prepared)
    return ids, [ImageRun(p, pos) for p, pos in zip(prepared, positions)]


def test_image_keys_lie_between_the_vocabulary_and_the_lora_key_space():
    digest = ImageInput.from_bytes(random_png(0)).digest
    keys = image_keys(digest, 600)
    assert keys.min() >= IMAGE_KEY_BASE and keys.max() < 1 << 40
    assert len(set(keys.tolist())) == 600  # each position its own 39 bits
    assert (image_keys(digest, 600) == keys).all() and (image_keys(digest, 7) == keys[:7]).all()
    other = image_keys(ImageInput.from_bytes(random_png(1)).digest, 600)
    assert not (other == keys).any()


class _Prepared:
    """An image as the processor prepares it, of `rows` rows (pixels: its id, to trace)."""

    def __init__(self, digest: str, rows: int) -> None:
        self.digest, self.rows = digest, rows
        self.pixels, self.patch_mask = torch.full((1, 1), float(rows)), None


class _CountingModel:
    """encode_images that records each call's images and gives row r of an image of
    digest d the value 1000 * int(d[0]) + r."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def encode_images(self, images):
        self.calls.append([im.digest for im in images])
        return [
            (1000 * int(im.digest[0]) + torch.arange(im.rows, dtype=torch.float32))[:, None]
            for im in images
        ]


def test_step_images_encodes_each_image_once_in_one_batch_and_frees_it_after_prefill():
    from lmprog.runtime.request import Req
    from lmprog.runtime.scheduler.batch import ScheduledBatch, ScheduledEntry

    def req(rid, runs, n=20):
        ids = keyed_ids(list(range(1, n + 1)), runs)
        return Req(rid, ids, SamplingParams(max_tokens=1), images=runs)

    a1 = ImageRun(_Prepared("1" * 64, 4), [3, 4, 5, 6])
    a2 = ImageRun(_Prepared("1" * 64, 4), [10, 11, 12, 13])  # the same image, another request
    b = ImageRun(_Prepared("2" * 64, 3), [2, 5, 9])  # rows apart (Idefics3's framing)
    r1, r2, r3 = req(0, [a1]), req(1, [a2, b]), req(2, [])
    # r1 feeds [0, 5): two rows of a1; r2 feeds [8, 12): b's last row and two of a2; r3 text
    entries = (
        ScheduledEntry(r1, 0, 0, 5, 0, None, False, False),
        ScheduledEntry(r2, 1, 8, 4, 5, None, False, False),
        ScheduledEntry(r3, 2, 0, 3, 9, None, False, False),
    )
    batch = ScheduledBatch(entries, np.zeros(12, np.int32), np.zeros(12, np.int64))
    model = _CountingModel()
    rows, embeds = step_images(batch, model)
    assert model.calls == [["1" * 64, "2" * 64]]  # one batch, the shared image once
    # batch row -> embedding row: r1's tokens 3, 4 (a1's rows 0, 1); r2's 9 (b's row 2), 10,
    # 11 (a2's rows 0, 1) at offset 5
    got = dict(zip(rows.tolist(), embeds[:, 0].tolist()))
    assert got == {3: 1000, 4: 1001, 6: 2002, 7: 1000, 8: 1001}
    assert a1.embeds is not None and a2.embeds is not None  # more of both is to come
    assert b.embeds is None  # r2 fed b's last position
    # the next chunk: a2's last rows, from the embeddings kept (no encoder run)
    nxt = (ScheduledEntry(r2, 1, 12, 4, 0, None, False, False),)
    rows, embeds = step_images(ScheduledBatch(nxt, np.zeros(4, np.int32), np.zeros(4)), model)
    assert (
        len(model.calls) == 1 and rows.tolist() == [0, 1] and embeds[:, 0].tolist() == [1002, 1003]
    )
    assert a2.embeds is None
    # a step that feeds no image position
    none = (ScheduledEntry(r2, 1, 16, 2, 0, None, False, False),)
    assert step_images(ScheduledBatch(none, np.zeros(2, np.int32), np.zeros(2)), model) is None
    keyed = keyed_ids([7] * 12, [b])
    assert [keyed[p] for p in (2, 5, 9)] == b.keys.tolist() and keyed[3] == 7


def _step_cost(s, model):
    """One scheduler step driven as the engine drives it (the encoder run by step_images):
    (tokens fed, image rows encoded)."""
    from sched_testing import process

    batch = s.schedule()
    calls = len(model.calls)
    step_images(batch, model)
    rows = sum(model.rows[d] for d in model.calls[-1]) if len(model.calls) > calls else 0
    toks = [[7] if e.sample else [] for e in batch.entries]
    process(s, batch, toks)
    s.check_integrity()
    return batch.num_tokens, rows


class _RowCountingModel(_CountingModel):
    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, int] = {}

    def encode_images(self, images):
        self.rows.update((im.digest, im.rows) for im in images)
        return super().encode_images(images)


@pytest.mark.parametrize("rows", [16, 100])
def test_a_step_counts_the_vision_encoder_in_its_token_budget(rows):
    """Each image the step encodes costs its image-token count: fed tokens plus encoded
    rows stay within max_num_batched_tokens; an image larger than the budget still runs
    (alone among the step's images); every request finishes."""
    from lmprog.runtime.config import CacheConfig, SchedulerConfig
    from lmprog.runtime.request import Req
    from lmprog.runtime.scheduler import Scheduler

    budget = 64
    s = Scheduler(
        2048,
        512,
        SchedulerConfig(max_num_batched_tokens=budget, max_running_requests=8),
        CacheConfig(),
    )
    model = _RowCountingModel()
    reqs = []
    for i in range(6):  # requests 4 and 5 show image 0 and 1 again
        run = ImageRun(_Prepared(str(i % 4 + 1) * 64, rows), list(range(4, 4 + rows)))
        ids = keyed_ids([10 + i] * 4 + [0] * rows + [20 + i] * 4, [run])
        reqs.append(s.submit(Req(i, ids, SamplingParams(max_tokens=3), images=[run])))
    steps = []
    while s.has_work:
        steps.append(_step_cost(s, model))
        assert len(steps) < 200
    assert all(r.output_len == 3 for r in reqs)
    for fed, encoded in steps:
        if encoded <= budget:
            assert fed + encoded <= budget, steps
        else:  # an image larger than the budget: the only one its step encodes
            assert rows > budget and encoded == rows
    if rows < budget:  # and the budget is used: two images fit one step beside their text
        assert any(encoded == 2 * rows for _, encoded in steps), steps


def test_tiny_llava_matches_transformers_processor_and_logits(llava):
    from transformers import LlavaProcessor

    folder, hf, tok = llava
    ours = load_model(folder)
    v = ours.config.vision
    assert ours.config.architecture == "llava" and v.tokens_per_image == 16
    assert v.hidden_state_indices() == (2,)  # -2 of [embeddings, layer 1, 2, 3]
    png = random_png(0)
    ids, runs = _ours(ours, folder, tok, PROMPT, [png])
    proc = LlavaProcessor(
        image_processor=hf_processor(folder),
        tokenizer=tok,
        patch_size=7,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    pil = ImageInput.from_bytes(png).load()
    inputs = proc(text=PROMPT, images=[pil], return_tensors="pt")
    assert ids == inputs["input_ids"][0].tolist()
    torch.testing.assert_close(runs[0].image.pixels, inputs["pixel_values"], atol=0, rtol=0)
    with torch.inference_mode():
        want = hf(**inputs).logits[0]
    start, end = runs[0].start, runs[0].end
    torch.testing.assert_close(paged_logits(ours, ids, runs), want, atol=ATOL, rtol=0)
    # chunked prefill: chunks that start and end inside the image run
    cuts = (start + 5, start + 11, end + 2)
    torch.testing.assert_close(paged_logits(ours, ids, runs, cuts), want, atol=ATOL, rtol=0)
    # the image matters: another image changes the logits after it
    other_ids, other_runs = _ours(ours, folder, tok, PROMPT, [random_png(1)])
    assert (paged_logits(ours, other_ids, other_runs)[end:] - want[end:]).abs().max() > 1e-2


def test_tiny_llava_over_siglip_and_qwen2_matches_transformers(tmp_path):
    """llava-interleave-qwen's layout: SigLIP (no CLS, its last layer, "full") + Qwen2."""
    from transformers import LlavaProcessor

    hf, tok = save_tiny_llava_siglip_qwen2(tmp_path)
    ours = load_model(tmp_path)
    v = ours.config.vision
    assert (v.encoder.kind, v.select_strategy, v.tokens_per_image) == ("siglip", "full", 16)
    assert ours.config.attention_bias  # Qwen2's q/k/v biases
    proc = LlavaProcessor(
        image_processor=hf_processor(tmp_path),
        tokenizer=tok,
        patch_size=7,
        vision_feature_select_strategy="full",
        num_additional_image_tokens=0,
    )
    png = random_png(10, (30, 50))
    ids, runs = _ours(ours, tmp_path, tok, PROMPT, [png])
    inputs = proc(text=PROMPT, images=[ImageInput.from_bytes(png).load()], return_tensors="pt")
    assert ids == inputs["input_ids"][0].tolist()
    with torch.inference_mode():
        want = hf(**inputs).logits[0]
    cuts = (runs[0].start + 9,)
    torch.testing.assert_close(paged_logits(ours, ids, runs, cuts), want, atol=ATOL, rtol=0)


def hf_processor(folder):
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(folder))


def test_tiny_idefics3_matches_transformers_processor_and_logits(idefics3):
    from transformers import Idefics3Processor

    folder, hf, tok = idefics3
    ours = load_model(folder)
    assert ours.config.architecture == "idefics3" and ours.config.vision.tokens_per_image == 4
    proc = Idefics3Processor(image_processor=hf_processor(folder), tokenizer=tok, image_seq_len=4)
    pngs = [random_png(2, (50, 20)), random_png(3, (20, 20))]  # 2x3 and 3x3 tiles
    prompt = f"User:{IMAGE} and {IMAGE}, alike?<end_of_utterance>\nAssistant:"
    ids, runs = _ours(ours, folder, tok, prompt, pngs)
    pils = [ImageInput.from_bytes(p).load() for p in pngs]
    inputs = proc(text=prompt, images=[pils], return_tensors="pt")
    assert ids == inputs["input_ids"][0].tolist()
    tiles = torch.cat([r.image.pixels for r in runs])
    assert [r.image.pixels.shape[0] for r in runs] == [7, 10]  # tiles + the whole image
    want_pixels = inputs["pixel_values"][0]
    want_pixels = want_pixels[want_pixels.flatten(1).abs().sum(1) > 0]  # the batch's padding
    torch.testing.assert_close(tiles, want_pixels, atol=0, rtol=0)
    with torch.inference_mode():
        want = hf(**inputs).logits[0]
    torch.testing.assert_close(paged_logits(ours, ids, runs), want, atol=ATOL, rtol=0)
    cuts = (runs[0].start + 3, runs[1].start + 1)
    torch.testing.assert_close(paged_logits(ours, ids, runs, cuts), want, atol=ATOL, rtol=0)


def test_tiny_llava_next_matches_transformers_processor_and_logits(tmp_path):
    from transformers import LlavaNextProcessor

    hf, tok = save_tiny_llava_next(tmp_path)
    ours = load_model(tmp_path)
    assert ours.config.architecture == "llava_next"
    proc = LlavaNextProcessor(
        image_processor=hf_processor(tmp_path),
        tokenizer=tok,
        patch_size=7,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    # wide (a 1x2 grid, unpadded in height), tall (2x1, unpadded in width), square (2x2)
    for size in ((60, 25), (21, 50), (40, 40)):
        png = random_png(8, size)
        ids, runs = _ours(ours, tmp_path, tok, PROMPT, [png])
        inputs = proc(text=PROMPT, images=[ImageInput.from_bytes(png).load()], return_tensors="pt")
        assert ids == inputs["input_ids"][0].tolist(), size
        torch.testing.assert_close(runs[0].image.pixels, inputs["pixel_values"][0], atol=0, rtol=0)
        with torch.inference_mode():
            want = hf(**inputs).logits[0]
        cuts = (runs[0].start + 7, runs[0].end - 3)
        got = paged_logits(ours, ids, runs, cuts)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=lambda m, s=size: f"{s}: {m}")


@pytest.fixture(scope="module")
def llava_runtime(llava):
    folder, _, _ = llava
    # small steps: an image run of 16 tokens is prefilled over several chunks
    rt = lp.Runtime(str(folder), device="cpu", max_running_requests=4, max_num_batched_tokens=8)
    yield rt
    rt.shutdown()


def _request(prompt, pngs=(), max_tokens=6):
    images = tuple(ImageInput.from_bytes(p) for p in pngs)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return GenerateRequest(prompt, params, images=images)


def test_greedy_generation_equals_transformers_and_the_cache_is_keyed_by_image(
    llava, llava_runtime
):
    from transformers import LlavaProcessor

    folder, hf, tok = llava
    rt = llava_runtime
    assert rt.image_token == IMAGE
    png, other = random_png(4), random_png(5)
    proc = LlavaProcessor(
        image_processor=hf_processor(folder),
        tokenizer=tok,
        patch_size=7,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    inputs = proc(text=PROMPT, images=[ImageInput.from_bytes(png).load()], return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    with torch.inference_mode():
        want = hf.generate(**inputs, max_new_tokens=6, do_sample=False)[0, n:].tolist()
    rt.flush_cache()
    first = rt.generate(_request(PROMPT, [png]))
    assert list(first.token_ids) == want and first.prompt_tokens == n
    image_end = PROMPT.index(IMAGE)  # the image run follows the text before it
    run_end = len(encode_prompt(tok, PROMPT[:image_end])) + 16
    # the same image, another question: the KV through the image run is reused
    second = rt.generate(_request(PROMPT + " Tell me more.", [png]))
    assert second.cached_tokens >= run_end
    # another image after the same text: nothing of the image run is reused
    third = rt.generate(_request(PROMPT, [other]))
    assert third.cached_tokens <= run_end - 16
    assert third.token_ids != first.token_ids


def test_a_batch_mixing_image_and_text_requests_equals_each_alone(llava_runtime):
    rt = llava_runtime
    requests = [
        _request(PROMPT, [random_png(6)], max_tokens=4),
        _request("A plain question without a picture:", max_tokens=4),
        _request(f"Two: {IMAGE} and {IMAGE}.", [random_png(7), random_png(6)], max_tokens=4),
        _request(PROMPT, [random_png(7)], max_tokens=4),
    ]
    alone = []
    for r in requests:
        rt.flush_cache()
        alone.append(rt.generate(r).token_ids)
    rt.flush_cache()
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(requests)) as pool:
        together = [f.result() for f in [pool.submit(rt.generate, r) for r in requests]]
    assert [r.token_ids for r in together] == alone
    rt.engine.check_integrity()


def test_bad_image_requests_fail_at_the_call_and_the_engine_serves_on(llava_runtime):
    rt = llava_runtime
    with pytest.raises(ValueError, match="image token"):
        rt.generate(_request(PROMPT, [random_png(0), random_png(1)]))
    with pytest.raises(ValueError, match="1 image token"):  # an image token, no image
        rt.generate(_request(PROMPT))
    with pytest.raises(ValueError, match="cannot be decoded"):
        rt.generate(GenerateRequest(PROMPT, images=(ImageInput.from_bytes(b"not a png"),)))
    # a select after an image: refused, not scored as if the image were not there
    score = ScoreRequest(PROMPT, ("yes", "no"), images=(ImageInput.from_bytes(random_png(0)),))
    with pytest.raises(lp.BackendError, match="after an image"):
        rt.score(score)
    assert rt.generate(_request(PROMPT, [random_png(0)], max_tokens=2)).text


def test_a_text_only_model_refuses_images(tmp_path):
    from hf_tiny import default_hf_tokenizer, save_tiny_llama

    folder = save_tiny_llama(tmp_path, default_hf_tokenizer())
    with lp.Runtime(str(folder), device="cpu", max_total_tokens=512) as rt:
        assert rt.image_token is None
        with pytest.raises(ValueError, match="takes no images"):
            rt.generate(_request(f"look: {IMAGE}", [random_png(0)]))


def test_idefics3_greedy_generation_through_the_runtime_equals_transformers(idefics3):
    """Tiles whose image rows are framed by row/column tokens, prefilled in chunks of 16."""
    from transformers import Idefics3Processor

    folder, hf, tok = idefics3
    png = random_png(9, (50, 20))
    prompt = f"User:{IMAGE} What is it?<end_of_utterance>\nAssistant:"
    proc = Idefics3Processor(image_processor=hf_processor(folder), tokenizer=tok, image_seq_len=4)
    inputs = proc(text=prompt, images=[[ImageInput.from_bytes(png).load()]], return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    with torch.inference_mode():
        want = hf.generate(**inputs, max_new_tokens=6, do_sample=False)[0, n:].tolist()
    with lp.Runtime(
        str(folder), device="cpu", max_running_requests=4, max_num_batched_tokens=16
    ) as rt:
        assert rt.image_token == IMAGE
        got = rt.generate(_request(prompt, [png]))
        assert list(got.token_ids) == want and got.prompt_tokens == n
        again = rt.generate(_request(prompt, [png]))
        assert again.cached_tokens >= n - 1 and again.token_ids == got.token_ids


def test_a_vlm_is_refused_under_tensor_parallelism_before_any_rank_starts(llava):
    folder, _, _ = llava
    with pytest.raises(ValueError, match=r"tensor parallelism yet: use tp_size=1 \(dp_size"):
        lp.Runtime(str(folder), device="cpu", tp_size=2)


def test_a_dsl_program_with_lp_image_runs_on_the_runtime_and_reuses_the_image(llava_runtime):
    """The two halves of issue 32 meet: lp.image in a program, the runtime's VLM under it."""
    rt = llava_runtime
    rt.flush_cache()

    @lp.function
    def describe(s, png):
        s += "Look: " + lp.image(png) + " What is it?"
        s += lp.gen("a", max_tokens=3, temperature=0, ignore_eos=True)

    @lp.function
    def two_questions(s, png):
        s += "Look: " + lp.image(png) + " What is it?"
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f" Q{i}:" + lp.gen("x", max_tokens=3, temperature=0, ignore_eos=True)
        s += forks[0]["x"] + forks[1]["x"]

    png = random_png(8)
    first = describe.run(png=png, backend=rt)
    again = describe.run(png=png, backend=rt)
    prompt_tokens = first.get_meta_info("a")["prompt_tokens"]
    assert again["a"] == first["a"]
    assert again.get_meta_info("a")["cached_tokens"] == prompt_tokens - 1  # all but the last
    other = describe.run(png=random_png(9), backend=rt)
    assert other.get_meta_info("a")["cached_tokens"] < 16  # text before the image at most
    forked = [two_questions.run(png=png, backend=rt).text() for _ in range(2)]
    assert forked[0] == forked[1] and forked[0].count(rt.image_token) == 1
