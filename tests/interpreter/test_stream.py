import asyncio
import time

import pytest

import lmprog as lp
from fakes import FakeBackend, within


@lp.function
def story(s, topic):
    s += lp.user("Tell me about " + topic)
    with s.assistant():
        s += lp.gen("first", max_tokens=6)
        s += "\n"
        s += lp.gen("second", max_tokens=4)


def test_stream_returns_at_once_and_pieces_concatenate():
    state = story.run("cats", backend=FakeBackend(latency=0.2, token_latency=0.01), stream=True)
    t0 = time.perf_counter()
    pieces = within(5, lambda: list(state.text_iter()))
    assert time.perf_counter() - t0 > 0.2  # pieces arrived while generating
    assert "".join(pieces) == state.text()
    assert len(pieces) > 10  # token-sized pieces, not one blob


def test_variable_pieces_arrive_in_order_and_concatenate_to_the_value():
    state = story.run("dogs", backend=FakeBackend(token_latency=0.005), stream=True, temperature=0)
    first = within(5, lambda: list(state.text_iter("first")))
    assert len(first) == 6 and "".join(first) == state["first"]
    assert "".join(within(5, lambda: list(state.text_iter("second")))) == state["second"]
    reference = story.run("dogs", backend=FakeBackend(), temperature=0)
    assert state.text() == reference.text()  # streaming does not change the result


def test_a_variables_iterator_ends_when_the_variable_is_complete():
    def slow_second(request):
        if request.params.max_tokens == 4:
            time.sleep(0.5)
        return " done"

    state = story.run("x", backend=FakeBackend(responder=slow_second), stream=True)
    t0 = time.perf_counter()
    assert "".join(within(5, lambda: list(state.text_iter("first")))) == " done"
    assert time.perf_counter() - t0 < 0.4
    state.sync()


def test_text_iter_of_a_finished_state_replays_everything():
    state = story.run("x", backend=FakeBackend())
    assert "".join(state.text_iter()) == state.text()
    with pytest.raises(TypeError):
        state.text_iter(3)


def test_async_iteration_does_not_block_the_event_loop():
    async def main():
        state = story.run("owls", backend=FakeBackend(latency=0.1, token_latency=0.01), stream=True)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        pieces = [p async for p in state.text_async_iter()]
        answer = [p async for p in state.text_async_iter("second")]
        task.cancel()
        return state, pieces, answer, ticks

    state, pieces, answer, ticks = asyncio.run(asyncio.wait_for(main(), 5))
    assert "".join(pieces) == state.text() and "".join(answer) == state["second"]
    assert ticks >= 10


def test_async_iteration_raises_the_programs_error():
    async def main():
        state = story.run("FAIL", backend=FakeBackend(fail_on="FAIL"), stream=True)
        return [p async for p in state.text_async_iter()]

    with pytest.raises(lp.BackendError):
        asyncio.run(asyncio.wait_for(main(), 5))


def test_run_async_runs_programs_concurrently_without_blocking():
    backend = FakeBackend(latency=0.2)

    async def main():
        t0 = time.perf_counter()
        states = await asyncio.gather(*(story.run_async(f"t{i}", backend=backend) for i in range(4)))
        return states, time.perf_counter() - t0

    states, elapsed = asyncio.run(asyncio.wait_for(main(), 5))
    assert all(s["second"] for s in states)
    assert backend.max_active == 4
    assert elapsed < 1.0, f"4 programs of 2 x 0.2 s took {elapsed:.2f} s"


def test_run_async_re_raises_and_validates():
    backend = FakeBackend(fail_on="FAIL")
    with pytest.raises(lp.BackendError):
        asyncio.run(asyncio.wait_for(story.run_async("FAIL", backend=backend), 5))
    with pytest.raises(TypeError, match="unexpected keyword"):
        asyncio.run(story.run_async("x", backend=backend, topics="y"))
