"""Images through the server (issue 32): OpenAI image_url parts, Anthropic image blocks,
SGLang's image_data, on a fake vision backend that records what it was asked; every kind of
bad image is a 400 naming its field and the next request still works; a text-only model
(the bundled one, end to end) refuses images with a 400."""

from __future__ import annotations

import base64
import http.server
import io
import os
import threading

import pytest
from fakes import FakeBackend
from PIL import Image
from serve_http import assert_error, post_json

from lmprog.core.images import ImageInput
from lmprog.serve import Server

MODEL = "vlm"
TOKEN = "<image>"


def png(color=(255, 0, 0), size=(6, 4), mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


RED, BLUE = png((255, 0, 0)), png((0, 0, 255))


def chat(*parts, **extra):
    content = [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 3,
        **extra,
    }


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    (root / "red.png").write_bytes(RED)
    outside = tmp_path_factory.mktemp("private")
    (outside / "secret.png").write_bytes(BLUE)
    os.symlink(outside / "secret.png", root / "link.png")  # resolves outside the folder
    return root


@pytest.fixture(scope="module")
def vision():
    return FakeBackend(image_token=TOKEN)


@pytest.fixture(scope="module")
def url(vision, folder):
    with Server(
        vision,
        model_name=MODEL,
        max_images=8,
        max_image_bytes=200_000,
        max_image_pixels=2_000_000,
        allowed_image_folders=(str(folder),),
    ).start() as srv:
        yield srv.url


def last_images(backend: FakeBackend) -> list[str]:
    return [i.digest for i in backend.generations()[-1].images]


def digest(data: bytes) -> str:
    return ImageInput.from_bytes(data).digest


def still_serves(url: str, backend: FakeBackend) -> None:
    status, body = post_json(
        url, "/v1/chat/completions", chat("What is it?", image_part(data_url(RED)))
    )
    assert status == 200, body
    assert last_images(backend) == [digest(RED)]


def test_image_url_parts_reach_the_model_in_order(url, vision):
    payload = chat("First", image_part(data_url(RED)), "then", image_part(data_url(BLUE)), "?")
    status, body = post_json(url, "/v1/chat/completions", payload)
    assert status == 200, body
    request = vision.generations()[-1]
    assert [i.digest for i in request.images] == [digest(RED), digest(BLUE)]
    prompt = str(request.prompt)
    assert prompt.count(TOKEN) == 2
    assert prompt.index("First") < prompt.index(TOKEN) < prompt.index("then") < prompt.rindex(TOKEN)


def test_a_template_with_image_items_places_its_own_token():
    backend = FakeBackend(template="gemma-3", image_token="<start_of_image>")
    with Server(backend, model_name=MODEL).start() as srv:
        status, body = post_json(
            srv.url, "/v1/chat/completions", chat(image_part(data_url(RED)), "Describe.")
        )
    assert status == 200, body
    prompt = str(backend.generations()[-1].prompt)
    assert prompt.startswith("<start_of_turn>user\n<start_of_image>Describe.")


def test_anthropic_image_blocks(url, vision):
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(BLUE).decode()}
    payload = {
        "model": MODEL,
        "max_tokens": 3,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "source": source}, {"type": "text", "text": "?"}],
            }
        ],
    }
    status, body = post_json(url, "/v1/messages", payload)
    assert status == 200, body
    assert last_images(vision) == [digest(BLUE)]
    payload["messages"][0]["content"][0] = {
        "type": "image",
        "source": {"type": "url", "url": "https://example.com/x.png"},
    }
    status, body = post_json(url, "/v1/messages", payload)
    assert status == 400 and body["type"] == "error", body
    assert "allow-image-urls" in body["error"]["message"]


def test_native_image_data(url, vision):
    b64 = base64.b64encode(RED).decode()
    status, body = post_json(url, "/generate", {"text": f"{TOKEN} colour:", "image_data": b64})
    assert status == 200, body
    assert last_images(vision) == [digest(RED)]
    payload = {"text": f"{TOKEN}{TOKEN} two", "image_data": [data_url(RED), data_url(BLUE)]}
    status, body = post_json(url, "/generate", payload)
    assert status == 200, body
    assert last_images(vision) == [digest(RED), digest(BLUE)]
    payload = {"text": [f"{TOKEN} a", "b"], "image_data": [data_url(BLUE), None]}
    status, body = post_json(url, "/generate", payload)
    assert status == 200, body
    status, body = post_json(url, "/generate", {"text": "no token", "image_data": b64})
    assert_error(status, body, 400, param="image_data")
    status, info = _get(url, "/get_model_info")
    assert info["has_image_understanding"] is True and info["image_token"] == TOKEN


def _get(url, path):
    from serve_http import request

    return request(url, "GET", path)


def truncated_png() -> bytes:
    buf = io.BytesIO()
    Image.effect_noise((64, 64), 50).convert("RGB").save(buf, format="PNG")
    return buf.getvalue()[: len(buf.getvalue()) // 2]


def huge_png() -> bytes:  # 100 megapixels in a few kB (a 1-bit image compresses to nothing)
    buf = io.BytesIO()
    Image.new("1", (10_000, 10_000)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize(
    ("source", "code"),
    [
        (data_url(b"this is not an image"), "invalid_image"),
        (data_url(truncated_png()), "invalid_image"),
        (data_url(huge_png()), "invalid_image"),
        ("data:image/png;base64,@@@@", "invalid_image"),
        ("data:text/plain;base64,aGk=", "invalid_image"),
        ("file:///etc/passwd", "local_file_refused"),
        ("/etc/passwd", "invalid_image"),
        ("https://example.com/cat.png", "image_url_refused"),
        ("ftp://example.com/cat.png", "invalid_image"),
    ],
)
def test_bad_images_are_400s_and_the_server_serves_on(url, vision, source, code):
    before = len(vision.generations())
    status, body = post_json(url, "/v1/chat/completions", chat("see", image_part(source)))
    assert_error(status, body, 400, param="messages[0].content[1]", code=code)
    assert len(vision.generations()) == before
    still_serves(url, vision)


def test_limits_per_request(url, vision):
    before = len(vision.generations())
    many = [image_part(data_url(RED))] * 1000
    status, body = post_json(url, "/v1/chat/completions", chat("all of them", *many))
    assert_error(status, body, 400, param="messages[0].content[9]", code="too_many_images")
    big = png(size=(1000, 1000))  # 1 MP each: two fit 2 MP, three do not
    status, body = post_json(url, "/v1/chat/completions", chat(*[image_part(data_url(big))] * 3))
    err = assert_error(status, body, 400, param="messages[0].content[2]", code="invalid_image")
    assert "max_image_pixels" in err["message"]
    noisy = io.BytesIO()  # random pixels do not compress: ~120 kB
    Image.frombytes("RGB", (200, 200), os.urandom(120_000)).save(noisy, format="PNG")
    parts = [image_part(data_url(noisy.getvalue()))] * 2
    status, body = post_json(url, "/v1/chat/completions", chat(*parts))
    assert_error(status, body, 400, param="messages[0].content[1]", code="image_too_large")
    assert len(vision.generations()) == before
    still_serves(url, vision)


def test_local_files_only_inside_the_allowed_folders(url, vision, folder):
    status, body = post_json(
        url, "/v1/chat/completions", chat("?", image_part((folder / "red.png").as_uri()))
    )
    assert status == 200, body
    assert last_images(vision) == [digest(RED)]
    for name in ("link.png", "../private/secret.png", "missing.png"):
        status, body = post_json(
            url, "/v1/chat/completions", chat("?", image_part(f"file://{folder}/{name}"))
        )
        assert_error(status, body, 400, param="messages[0].content[1]")
    status, body = post_json(
        url, "/generate", {"text": f"{TOKEN}?", "image_data": str(folder / "red.png")}
    )
    assert status == 200, body


def test_images_in_other_roles_or_shapes_are_400s(url):
    bad = {"type": "image_url", "image_url": {"detail": "high"}}
    status, body = post_json(url, "/v1/chat/completions", chat("x", bad))
    assert_error(status, body, 400, param="messages[0].content[1].image_url")
    payload = {
        "model": MODEL,
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": [image_part(data_url(RED))]},
            {"role": "user", "content": "hi"},
        ],
    }
    status, body = post_json(url, "/v1/chat/completions", payload)
    assert_error(status, body, 400, param="messages[0].content[0]", code="unsupported_content")


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = {"/red.png": RED, "/big.png": b"\x89PNG" + b"0" * 300_000}.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_image_urls_are_fetched_only_when_allowed_within_the_limits():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    backend = FakeBackend(image_token=TOKEN)
    try:
        with Server(
            backend, model_name=MODEL, allow_image_urls=True, max_image_bytes=100_000
        ).start() as srv:
            status, body = post_json(
                srv.url, "/v1/chat/completions", chat(image_part(base + "/red.png"))
            )
            assert status == 200, body
            assert last_images(backend) == [digest(RED)]
            for path, code in (
                ("/big.png", "image_too_large"),
                ("/nope.png", "image_fetch_failed"),
            ):
                status, body = post_json(
                    srv.url, "/v1/chat/completions", chat(image_part(base + path))
                )
                assert_error(status, body, 400, param="messages[0].content[0]", code=code)
    finally:
        httpd.shutdown()


def test_a_text_only_model_refuses_images_end_to_end(server, client):
    """The bundled text model: an image_url part, an Anthropic image block and image_data
    are 400s naming the field; the next request is served."""
    payload = {**chat("hi", image_part(data_url(RED))), "model": server.model_name}
    status, body = post_json(server.url, "/v1/chat/completions", payload)
    err = assert_error(
        status, body, 400, param="messages[0].content[1]", code="unsupported_content"
    )
    assert "takes no images" in err["message"]
    status, body = post_json(server.url, "/generate", {"text": "hi", "image_data": data_url(RED)})
    assert_error(status, body, 400, param="image_data")
    reply = client.chat.completions.create(
        model=server.model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert reply.choices[0].message.content is not None


def test_responses_input_image(url, vision):
    payload = {
        "model": MODEL,
        "max_output_tokens": 3,
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is it?"},
                    {"type": "input_image", "image_url": data_url(BLUE)},
                ],
            }
        ],
    }
    status, body = post_json(url, "/v1/responses", payload)
    assert status == 200, body
    assert last_images(vision) == [digest(BLUE)]
