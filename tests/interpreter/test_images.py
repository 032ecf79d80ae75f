"""lp.image() in programs: the image token in the text, the images on every later request.

A fake vision backend (image_token set) records the requests; it checks the protocol's
rule (one image per token in the prompt, in order) as a real backend does.
"""

from __future__ import annotations

import base64
import io

import pytest
from fakes import FakeBackend
from PIL import Image

import lmprog as lp
from lmprog.core.images import ImageInput
from lmprog.core.protocol import GenerateRequest, ScoreRequest

TOKEN = "<image>"


def png(color: tuple[int, int, int], size: tuple[int, int] = (4, 3)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


RED, BLUE, GREEN = png((255, 0, 0)), png((0, 0, 255)), png((0, 255, 0))


def digest(data: bytes) -> str:
    return ImageInput.from_bytes(data).digest


def gens(backend: FakeBackend) -> list[GenerateRequest]:
    return [r for r in backend.requests if isinstance(r, GenerateRequest)]


def test_the_image_token_goes_in_place_and_later_requests_carry_the_images():
    @lp.function
    def describe(s):
        s += lp.system("Be terse.")
        s += lp.user(lp.image(RED) + "What colour is this?")
        s += lp.assistant(lp.gen("first", max_tokens=4))
        s += lp.user("And this one?" + lp.image(BLUE))
        s += lp.assistant(lp.gen("second", max_tokens=4))

    backend = FakeBackend(image_token=TOKEN)
    state = describe.run(backend=backend)
    state.sync()
    text = state.text()
    assert text.count(TOKEN) == 2
    assert (
        text.index(TOKEN) < text.index("What colour") < text.index("And this") < text.rindex(TOKEN)
    )
    first, second = gens(backend)
    assert [i.digest for i in first.images] == [digest(RED)]
    assert [i.digest for i in second.images] == [digest(RED), digest(BLUE)]
    assert str(second.prompt).count(TOKEN) == 2
    # the token the program placed is a control token (the template's kind), not user text
    start = text.index(TOKEN)
    assert any(a <= start and start + len(TOKEN) <= b for a, b in second.prompt.control)


def test_every_source_form_is_the_same_image(tmp_path):
    path = tmp_path / "red.png"
    path.write_bytes(RED)
    url = "data:image/png;base64," + base64.b64encode(RED).decode()
    pil = Image.open(io.BytesIO(RED))
    forms = [path, str(path), RED, url]

    @lp.function
    def prog(s, image):
        s += lp.user(lp.image(image) + "?")
        s += lp.assistant(lp.gen("a", max_tokens=2))

    backend = FakeBackend(image_token=TOKEN)
    for form in forms:
        prog.run(image=form, backend=backend).sync()
    prog.run(image=pil, backend=backend).sync()
    digests = [r.images[0].digest for r in gens(backend)]
    assert digests[:4] == [digest(RED)] * 4
    # a PIL image is encoded as PNG: its pixels, not the file's bytes
    assert ImageInput.from_bytes(gens(backend)[4].images[0].data).load().getpixel((0, 0)) == (
        255,
        0,
        0,
    )


def test_select_and_gen_n_carry_the_images():
    @lp.function
    def prog(s):
        s += lp.user(lp.image(GREEN) + "Colour?")
        s += lp.assistant(lp.select("c", ["red", "green"]))
        s += lp.user("Again")
        s += lp.assistant(lp.gen("g", max_tokens=2, n=2))

    backend = FakeBackend(image_token=TOKEN)
    prog.run(backend=backend).sync()
    scores = [r for r in backend.requests if isinstance(r, ScoreRequest)]
    assert [i.digest for i in scores[0].images] == [digest(GREEN)]
    assert [len(r.images) for r in gens(backend)] == [1, 1]


def test_fork_copies_inherit_and_concat_join_moves_a_copys_own_images():
    @lp.function
    def prog(s):
        s += lp.user_begin() + lp.image(RED) + "Compare:"
        forks = s.fork(2)
        forks[0] += lp.image(BLUE)
        forks[1] += lp.image(GREEN)
        for f in forks:
            f += lp.gen("x", max_tokens=2)
        forks.join(mode="concat_and_append")
        s += lp.user_end()
        s += lp.assistant(lp.gen("verdict", max_tokens=2))

    backend = FakeBackend(image_token=TOKEN)
    state = prog.run(backend=backend)
    state.sync()
    assert backend.prefixes == []  # cache_prefix takes text only: not called over images
    requests = gens(backend)
    copies = sorted(tuple(i.digest for i in r.images) for r in requests[:2])
    assert copies == sorted([(digest(RED), digest(BLUE)), (digest(RED), digest(GREEN))])
    last = requests[-1]
    assert [i.digest for i in last.images] == [digest(RED), digest(BLUE), digest(GREEN)]
    assert state.text().count(TOKEN) == 3


def test_run_batch_keeps_each_programs_images_apart():
    @lp.function
    def prog(s, image):
        s += lp.system("Name the colour.")
        s += lp.user(lp.image(image))
        s += lp.assistant(lp.gen("c", max_tokens=2))

    backend = FakeBackend(image_token=TOKEN)
    images = [RED, BLUE, GREEN, RED]
    states = prog.run_batch([{"image": i} for i in images], num_threads=4, backend=backend)
    for st in states:
        st.sync()
    by_prompt = sorted(r.images[0].digest for r in gens(backend))
    assert by_prompt == sorted(digest(i) for i in images)
    assert all(len(r.images) == 1 for r in gens(backend))


def test_a_text_only_backend_refuses_at_the_image():
    @lp.function
    def prog(s):
        s += lp.user(lp.image(RED) + "Describe it.")
        s += lp.assistant(lp.gen("a", max_tokens=2))

    backend = FakeBackend()
    with pytest.raises(lp.BackendError, match="no vision support"):
        prog.run(backend=backend).sync()
    assert backend.requests == []


def test_the_token_text_outside_an_image_is_refused():
    @lp.function
    def prog(s):
        s += lp.user(lp.image(RED) + f"Is {TOKEN} a tag?")
        s += lp.assistant(lp.gen("a", max_tokens=2))

    backend = FakeBackend(image_token=TOKEN)
    with pytest.raises(lp.BackendError, match="outside lp.image"):
        prog.run(backend=backend).sync()
    assert backend.requests == []


def test_bad_image_sources_raise_at_the_call(tmp_path):
    with pytest.raises(FileNotFoundError):
        lp.image(tmp_path / "missing.png")
    with pytest.raises(ValueError, match="does not fetch"):
        lp.image("https://example.com/cat.png")
    with pytest.raises(ValueError, match="base64"):
        lp.image("data:image/png;base64,@@@")
    with pytest.raises(TypeError, match="PIL image"):
        lp.image(3.5)


def test_a_file_removed_before_the_program_runs_fails_the_run(tmp_path):
    path = tmp_path / "gone.png"
    path.write_bytes(RED)
    image = lp.image(path)
    path.unlink()

    @lp.function
    def prog(s):
        s += lp.user(image + "?")
        s += lp.assistant(lp.gen("a", max_tokens=2))

    backend = FakeBackend(image_token=TOKEN)
    with pytest.raises(FileNotFoundError):
        prog.run(backend=backend).sync()
    assert backend.requests == []


def test_sglangs_own_image_program_runs_by_changing_the_import(tmp_path, monkeypatch):
    """SGLang's test_image_qa (sglang/test/test_programs.py), with `import lmprog as sgl`,
    on a vision backend whose model sees the image it is sent."""
    import importlib.util
    import sys
    from pathlib import Path

    if importlib.util.find_spec("sglang") is None:  # its source is read, never imported
        pytest.skip("sglang is not installed")
    script = Path(__file__).resolve().parents[2] / "scripts" / "interop" / "sglang_programs.py"
    spec = importlib.util.spec_from_file_location("lmprog_interop_programs", script)
    interop = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = interop
    try:
        spec.loader.exec_module(interop)
        programs = interop.load_programs()
    finally:
        sys.modules.pop(spec.name, None)
    (tmp_path / "example_image.png").write_bytes(RED)
    monkeypatch.chdir(tmp_path)

    def sees(request: GenerateRequest) -> str:
        colours = {digest(RED): "a red taxi"}
        return " ".join(colours.get(i.digest, "?") for i in request.images) or "nothing"

    backend = FakeBackend(image_token=TOKEN, responder=sees)
    lp.set_default_backend(backend)
    try:
        programs.test_image_qa()  # asserts "taxi" or "car" in the answer
    finally:
        lp.set_default_backend(None)
    assert [i.digest for i in gens(backend)[-1].images] == [digest(RED)]
