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


COPIES: list = []


@lp.function
def two_stories(s):
    s += lp.user("Tell me a very long story about a cat.")
    forks = s.fork(2)
    COPIES[:] = list(forks)
    for f in forks:
        with f.assistant():
            f += lp.gen("story", max_tokens=300, ignore_eos=True)
    forks.join()


def _wait_aborted(backend, expected):
    deadline = time.monotonic() + 20
    while _aborted(backend) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return _aborted(backend)


def test_cancelling_a_state_aborts_its_forks_requests(backend):
    aborted, generated = _aborted(backend), backend.stats()["generated_tokens"]
    COPIES.clear()
    state = two_stories.run(backend=backend, stream=True, temperature=0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (
        len(COPIES) == 2 and any(c._record.take_pieces("story", 0)[0] for c in COPIES)
    ):
        time.sleep(0.01)  # a copy is generating (llama.cpp's one context runs one at a time)
    state.cancel()
    assert isinstance(state.error(), lp.ProgramCancelled)
    assert all(isinstance(c.error(), lp.ProgramCancelled) for c in COPIES)
    # each copy's request aborted (llama.cpp: the waiting one at its first token)
    assert _wait_aborted(backend, aborted + 2) == aborted + 2
    assert backend.stats()["generated_tokens"] - generated < 200
    assert short.run(backend=backend, temperature=0)["hi"]


def test_a_collected_streamed_state_aborts_its_request(backend):
    import gc

    aborted, generated = _aborted(backend), backend.stats()["generated_tokens"]
    state = long_story.run(backend=backend, stream=True, temperature=0)
    record = state._record  # to see it generate, without a reader (leaving one cancels too)
    deadline = time.monotonic() + 20
    while not record.take_pieces("story", 0)[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    del state  # nobody holds the state: its generation is aborted
    gc.collect()
    assert _wait_aborted(backend, aborted + 1) == aborted + 1
    assert isinstance(record.error, lp.ProgramCancelled)
    assert backend.stats()["generated_tokens"] - generated < 100
    assert short.run(backend=backend, temperature=0)["hi"]
