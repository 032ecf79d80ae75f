"""Images on the llama.cpp backend: the mmproj projector's set-up and errors, and the
engine's handling of image runs (placeholders in the token lists, evaluated whole, reused
as a prefix) with a stand-in for libmtmd, since no vision GGUF installs here.

The stand-in evaluates a fixed text's tokens at an image's positions, so a prompt with an
image must generate exactly what the same prompt with that text does.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import pytest

pytest.importorskip("llama_cpp")

from greedy_agreement import assert_greedy_agrees, top2_logprobs

import lmprog as lp
from lmprog.backends import LlamaCpp
from lmprog.backends.config import LlamaCppConfig
from lmprog.backends.llamacpp import _split
from lmprog.backends.llamacpp_vision import ImageRun, image_ids
from lmprog.core.images import ImageInput
from lmprog.core.models import resolve_model
from lmprog.core.prompt import Prompt, encode_prompt
from lmprog.core.protocol import GenerateRequest, ScoreRequest
from lmprog.core.sampling import SamplingParams as SP

pytestmark = pytest.mark.e2e

MARK = "<__media__>"
RED = ImageInput.from_bytes(b"\x89PNG red stand-in")
BLUE = ImageInput.from_bytes(b"\x89PNG blue stand-in")


class StandIn:
    """libmtmd's part, played by text: an image is `ids`' embeddings at its positions."""

    marker = MARK

    def __init__(self, ids: list[int]):
        self.ids = ids
        self.evaluated = 0

    def image_run(self, image: ImageInput) -> ImageRun:
        return ImageRun([], image_ids(image.digest, len(self.ids)), [], None)

    def evaluate(self, ctx, seq, run) -> None:
        assert ctx.tokens[seq][-1:] != [] and all(t >= 0 for t in ctx.tokens[seq][-1:])
        ctx.decode([(seq, self.ids, None)], prompt=True)
        ctx.tokens[seq][-len(self.ids) :] = run.ids
        self.evaluated += 1

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def be():
    backend = LlamaCpp(n_ctx=512, n_parallel=2, n_threads=1, n_threads_batch=1)
    yield backend
    backend.shutdown()


@contextmanager
def stand_in(be, text: str):
    vision = StandIn(encode_prompt(be.tokenizer, text))
    be._vision, be._engine._evaluate_media = vision, partial(vision.evaluate, be._pool.ctx)
    try:
        yield vision
    finally:
        be._vision, be._engine._evaluate_media = None, None


NEAR_TIE = 0.5  # as test_llamacpp_e2e: other batch shapes move a top-2 gap by up to ~0.2


def greedy(be, prompt, images=(), n=8):
    params = SP(temperature=0.0, max_tokens=n, return_logprob=True, top_logprobs_num=2)
    return be.generate(GenerateRequest(prompt, params, images=images))


def agree(got, ref) -> None:
    assert_greedy_agrees(got.token_ids, ref.token_ids, top2_logprobs(ref.logprobs), NEAR_TIE)


def test_without_a_projector_images_are_refused(be):
    assert be.image_token is None
    with pytest.raises(lp.BackendError, match="takes no images"):
        greedy(be, f"{MARK} hi", (RED,))

    @lp.function
    def prog(s):
        s += lp.image(RED.data) + "What is it?" + lp.gen("a", max_tokens=2)

    with pytest.raises(lp.BackendError, match="no vision support"):
        prog.run(backend=be).sync()


def test_an_image_generates_as_its_tokens_would_and_is_reused(be):
    head, tail = "The picture shows", " and it is"
    with stand_in(be, " a red apple on a table") as vision:
        assert be.image_token == MARK
        with_image = greedy(be, head + MARK + tail, (RED,))
        assert vision.evaluated == 1
        again = greedy(be, head + MARK + tail, (RED,))
        agree(again, with_image)
        assert vision.evaluated == 1  # the image's KV came from the prefix cache
        n_head = len(be._tokenize(head))
        assert again.cached_tokens >= n_head + len(vision.ids)
        two = greedy(be, f"{head}{MARK} then{MARK}{tail}", (RED, BLUE))
        assert vision.evaluated == 2  # RED's run reused, BLUE's evaluated after " then"
        then = len(encode_prompt(be.tokenizer, " then"))
        assert two.prompt_tokens == with_image.prompt_tokens + then + len(vision.ids)
        ids = be._tokenize(head) + vision.ids + encode_prompt(be.tokenizer, tail)
        as_text = greedy(be, tuple(ids))
        agree(with_image, as_text)  # the same numbers, in other batch shapes
        assert with_image.prompt_tokens == len(ids)


def test_image_prompts_that_cannot_run(be):
    with stand_in(be, " x"):
        with pytest.raises(ValueError, match="text after its last image"):
            greedy(be, f"Look: {MARK}", (RED,))
        with pytest.raises(ValueError, match="once per image"):
            greedy(be, f"{MARK} and {MARK}?", (RED,))
        with pytest.raises(lp.BackendError, match="select"):
            be.score(ScoreRequest(f"{MARK} is", ("red",), images=(RED,)))
    assert greedy(be, "The capital of France is", n=3).text  # the backend serves on


def test_split_keeps_control_spans():
    prompt = Prompt("<a>x<M>y<b>", [(0, 3), (8, 11)])
    first, second = _split(prompt, "<M>")
    assert (str(first), first.control) == ("<a>x", ((0, 3),))
    assert (str(second), second.control) == ("y<b>", ((1, 4),))
    assert _split("plain<M>", "<M>") == ["plain", ""]


def test_mmproj_is_checked_before_and_at_load(tmp_path):
    with pytest.raises(TypeError, match="mmproj"):
        LlamaCppConfig(mmproj=3)
    with pytest.raises(ValueError, match="does not exist"):
        LlamaCpp(mmproj=str(tmp_path / "mmproj.gguf"))
    bad = tmp_path / "mmproj.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match="GGUF"):
        LlamaCpp(mmproj=str(bad))
    # a GGUF that is no projector: libmtmd refuses it, and the backend says which file
    text_model = str(resolve_model(None).path)
    with pytest.raises(lp.BackendError, match="could not load the projector"):
        LlamaCpp(mmproj=text_model, n_ctx=256)
