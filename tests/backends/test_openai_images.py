"""lp.OpenAI and lp.RuntimeEndpoint with images: lp.image() becomes an image_url part (a data
URL) of its user message, or SGLang's image_data; end to end through lmprog serve over a
fake vision backend, which records the images it was given."""

from __future__ import annotations

import io

import pytest
from fakes import FakeBackend
from PIL import Image

import lmprog as lp
from lmprog.backends.openai import OpenAI
from lmprog.backends.openai_messages import IMAGE_MARK, marker_template, split_messages
from lmprog.core.image_urls import data_url, image_type
from lmprog.core.images import ImageInput
from lmprog.serve import Server


def png(color) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (3, 2), color).save(buf, format="PNG")
    return buf.getvalue()


RED, BLUE = ImageInput.from_bytes(png((255, 0, 0))), ImageInput.from_bytes(png((0, 0, 255)))


def test_image_marks_become_content_parts_in_order():
    t = marker_template()
    prompt = (
        t.role_prefix("user", first=True)
        + "Compare "
        + IMAGE_MARK
        + " with "
        + IMAGE_MARK
        + t.role_suffix("user")
        + t.role_prefix("assistant")
    )
    (message,) = split_messages(prompt, (RED, BLUE)).for_generation()
    assert message["role"] == "user"
    assert message["content"] == [
        {"type": "text", "text": "Compare "},
        {"type": "image_url", "image_url": {"url": data_url(RED)}},
        {"type": "text", "text": " with "},
        {"type": "image_url", "image_url": {"url": data_url(BLUE)}},
    ]
    assert data_url(RED).startswith("data:image/png;base64,iVBOR")
    assert image_type(b"\xff\xd8\xff\xe0rest") == "image/jpeg"
    assert image_type(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    with pytest.raises(lp.BackendError, match="outside any role"):
        split_messages(IMAGE_MARK + t.role_prefix("user", first=True), (RED,))


@pytest.fixture(scope="module")
def served():
    backend = FakeBackend(image_token="<image>")
    with Server(backend, model_name="vlm").start() as srv:
        yield backend, srv.url


def test_a_program_with_images_on_an_openai_endpoint(served):
    backend, url = served

    @lp.function
    def prog(s):
        s += lp.user("What is" + lp.image(RED.data) + "?")
        s += lp.assistant(lp.gen("a", max_tokens=3))
        s += lp.user(lp.image(BLUE.data) + "and this?")
        s += lp.assistant(lp.gen("b", max_tokens=3))

    with OpenAI("vlm", base_url=url, api_key="x") as endpoint:
        assert endpoint.image_token == IMAGE_MARK
        state = prog.run(backend=endpoint)
        assert state["b"]
    first, second = backend.generations()[-2:]
    assert [i.digest for i in first.images] == [RED.digest]
    assert [i.digest for i in second.images] == [RED.digest, BLUE.digest]
    assert str(second.prompt).count("<image>") == 2


def test_completion_mode_and_select_refuse_images(served):
    _, url = served

    @lp.function
    def prog(s):
        s += lp.user(lp.image(RED.data) + "Colour?")
        s += lp.assistant(lp.select("c", ["red", "blue"]))

    with OpenAI("vlm", base_url=url, chat=False, chat_template="chatml") as endpoint:
        assert endpoint.image_token is None
        with pytest.raises(lp.BackendError, match="no vision support"):
            prog.run(backend=endpoint).sync()
    with OpenAI("vlm", base_url=url) as endpoint:
        with pytest.raises(lp.BackendError, match="select"):
            prog.run(backend=endpoint).sync()


def test_runtime_endpoint_sends_image_data(served):
    backend, url = served
    endpoint = lp.RuntimeEndpoint(url)
    assert endpoint.image_token == "<image>"  # reported by lmprog serve

    @lp.function
    def prog(s):
        s += "Look: " + lp.image(BLUE.data) + " It is"
        s += lp.gen("a", max_tokens=3)

    prog.run(backend=endpoint).sync()
    request = backend.generations()[-1]
    assert [i.digest for i in request.images] == [BLUE.digest]
    assert str(request.prompt).startswith("Look: <image> It is")
