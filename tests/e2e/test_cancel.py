"""Cancellation on the bundled model, on every backend (issue 13, finding 2): leaving the
text iterator of a streamed 300-token gen after 3 pieces aborts the backend request (the
Runtime counts it in requests_finished["abort"], llama.cpp in "aborted"), far fewer than
300 tokens are generated, and the backend serves the next program."""

import time

import lmprog as lp


@lp.function
def long_story(s):
    s += lp.user("Tell me a very long story about a cat.")
    with s.assistant():
        s += lp.gen("story", max_tokens=300, ignore_eos=True)


@lp.function
def short(s):
    s += lp.user("Say hi.")
    with s.assistant():
        s += lp.gen("hi", max_tokens=4)


def _aborted(backend):
    stats = backend.stats()
    return stats["requests_finished"]["abort"] if "requests_finished" in stats else stats["aborted"]


def test_leaving_text_iter_aborts_the_request(backend):
    aborted, generated = _aborted(backend), backend.stats()["generated_tokens"]
    state = long_story.run(backend=backend, stream=True, temperature=0)
    pieces = []
    for piece in state.text_iter("story"):
        pieces.append(piece)
        if len(pieces) == 3:
            break
    assert isinstance(state.error(), lp.ProgramCancelled)
    deadline = time.monotonic() + 10
    while _aborted(backend) == aborted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _aborted(backend) == aborted + 1
    assert backend.stats()["generated_tokens"] - generated < 100
    assert short.run(backend=backend, temperature=0)["hi"]  # the backend serves on
