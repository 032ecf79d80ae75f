"""Cancellation (issue 13, finding 2): `state.cancel()`, leaving a streamed run's text
iterator early, and cancelling `run_async` abort the running gen's backend call (its stream
callback raises), drop the queued appends, cancel fork copies, and fail the state with
lp.ProgramCancelled."""

import asyncio
import time

import pytest
from fakes import FakeBackend, within

import lmprog as lp

LONG = 300  # words the fake "model" would generate, one streamed piece each


def long_words(request):
    return "".join(f" w{i}" for i in range(LONG))


def slow_backend():
    return FakeBackend(responder=long_words, token_latency=0.002)  # 300 pieces: 0.6 s


def wait_until(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.002)


@lp.function
def two_gens(s):
    s += "Story:"
    s += lp.gen("a", max_tokens=LONG)
    s += "\nMore:"
    s += lp.gen("b", max_tokens=LONG)


def test_cancel_mid_gen_stops_the_backend_call_and_drops_queued_nodes():
    backend = slow_backend()
    state = two_gens.run(backend=backend, stream=True)
    wait_until(lambda: backend.pieces_sent >= 3)
    state.cancel()
    state.cancel()  # idempotent
    error = within(5, state.error)
    assert isinstance(error, lp.ProgramCancelled) and isinstance(error, lp.LmprogError)
    wait_until(lambda: backend.aborted == 1)  # at the call's next piece
    sent = backend.pieces_sent
    assert sent < 10  # the call stopped at its next piece, not after 300
    time.sleep(0.05)
    assert backend.pieces_sent == sent  # nothing runs on
    assert len(backend.generations()) == 1  # the second gen was dropped
    with pytest.raises(lp.ProgramCancelled):
        state["a"]
    with pytest.raises(lp.ProgramCancelled):
        state.sync()
    with pytest.raises(lp.ProgramCancelled):
        list(state.text_iter())


def test_program_body_stops_at_its_next_append():
    backend = slow_backend()
    reached = []

    @lp.function
    def body(s):
        s += lp.gen("a", max_tokens=LONG)
        s["a"]  # raises ProgramCancelled once cancelled
        reached.append("after read")

    state = body.run(backend=backend, stream=True)
    wait_until(lambda: backend.pieces_sent >= 3)
    state.cancel()
    assert isinstance(within(5, state.error), lp.ProgramCancelled)
    time.sleep(0.05)
    assert reached == []


def test_cancel_after_the_end_is_a_no_op():
    state = two_gens.run(backend=FakeBackend())
    state.cancel()
    assert state.error() is None
    assert state["a"]


def test_leaving_text_iter_early_cancels_a_streamed_run():
    backend = slow_backend()
    state = two_gens.run(backend=backend, stream=True)

    def read_three():
        pieces = []
        for piece in state.text_iter("a"):
            pieces.append(piece)
            if len(pieces) == 3:
                break
        return pieces

    assert len(within(5, read_three)) == 3
    assert isinstance(within(5, state.error), lp.ProgramCancelled)
    wait_until(lambda: backend.aborted == 1)
    assert backend.pieces_sent < 10


def test_an_abandoned_iterator_is_cancelled_when_collected():
    backend = slow_backend()
    state = two_gens.run(backend=backend, stream=True)
    it = state.text_iter()
    next(it)
    del it  # the generator is closed: its finally cancels the run
    assert isinstance(within(5, state.error), lp.ProgramCancelled)
    wait_until(lambda: backend.aborted == 1)
    assert backend.pieces_sent < 10


def test_reading_a_finished_state_to_the_end_does_not_cancel():
    state = two_gens.run(backend=FakeBackend(), stream=True)
    assert "".join(state.text_iter()) == state.text()
    for _ in state.text_iter():  # not a streamed run's reader driving it: never cancels
        break
    assert state.error() is None


def test_leaving_text_async_iter_early_cancels():
    backend = slow_backend()
    state = two_gens.run(backend=backend, stream=True)

    async def read_three():
        pieces = []
        async for piece in state.text_async_iter():
            pieces.append(piece)
            if len(pieces) == 3:
                break
        return pieces

    assert len(asyncio.run(read_three())) == 3  # asyncio.run finalizes the generator
    assert isinstance(within(5, state.error), lp.ProgramCancelled)
    wait_until(lambda: backend.aborted == 1)
    assert backend.pieces_sent < 10


def test_wait_for_timeout_of_run_async_cancels():
    backend = slow_backend()

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(two_gens.run_async(backend=backend), 0.05)

    asyncio.run(main())
    wait_until(lambda: backend.aborted == 1)  # the non-streamed gen's call stopped too
    sent = backend.pieces_sent
    assert sent < LONG // 2
    time.sleep(0.05)
    assert backend.pieces_sent == sent
    assert len(backend.generations()) == 1


def test_forks_of_a_cancelled_state_are_cancelled():
    backend = slow_backend()
    copies = []

    @lp.function
    def forked(s):
        s += "Start:"
        forks = s.fork(2)
        copies.extend(forks)
        for f in forks:
            f += lp.gen("x", max_tokens=LONG)
        forks.join()

    state = forked.run(backend=backend, stream=True)
    wait_until(lambda: len(copies) == 2 and backend.pieces_sent >= 4)
    state.cancel()
    assert isinstance(within(5, state.error), lp.ProgramCancelled)
    for copy in copies:
        assert isinstance(within(5, copy.error), lp.ProgramCancelled)
    wait_until(lambda: backend.aborted == 2)
    assert backend.pieces_sent < 20


def test_copies_running_after_the_body_ended_are_cancelled():
    backend = slow_backend()
    copies = []

    @lp.function
    def unjoined(s):
        s += "Start:"
        forks = s.fork(2)
        copies.extend(forks)
        for f in forks:
            f += lp.gen("x", max_tokens=LONG)  # never joined: the body ends while they run

    state = unjoined.run(backend=backend, stream=True)
    wait_until(lambda: len(copies) == 2 and backend.pieces_sent >= 4)
    state.cancel()
    for copy in copies:
        assert isinstance(within(5, copy.error), lp.ProgramCancelled)
    wait_until(lambda: backend.aborted == 2)
    assert backend.pieces_sent < 20


def test_a_collected_streamed_state_aborts_its_request():
    import gc

    backend = slow_backend()
    state = two_gens.run(backend=backend, stream=True)
    wait_until(lambda: backend.pieces_sent >= 3)
    del state  # nobody can read it any more
    gc.collect()
    wait_until(lambda: backend.aborted == 1)
    sent = backend.pieces_sent
    assert sent < 20
    time.sleep(0.05)
    assert backend.pieces_sent == sent
    assert len(backend.generations()) == 1  # the second gen never ran


def test_a_collected_finished_state_changes_nothing():
    import gc

    backend = FakeBackend()
    state = two_gens.run(backend=backend, stream=True)
    state.sync()
    record = state._record
    del state
    gc.collect()
    assert record.error is None and backend.aborted == 0
