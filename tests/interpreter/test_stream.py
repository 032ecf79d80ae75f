import asyncio

import pytest
from fakes import FakeBackend, Gate, within

import lmprog as lp


@lp.function
def story(s, topic):
    s += lp.user("Tell me about " + topic)
    with s.assistant():
        s += lp.gen("first", max_tokens=6)
        s += "\n"
        s += lp.gen("second", max_tokens=4)


def numbered_words(request):
    return "".join(f" w{i}" for i in range(request.params.max_tokens))


def test_stream_returns_at_once_and_pieces_concatenate():
    # Each gen's last piece is held until the reader has the first gen's first piece: the
    # test passes only if run() returns and pieces reach the reader while a gen is in flight.
    gate = Gate()
    state = story.run("cats", backend=FakeBackend(gate=gate, responder=numbered_words), stream=True)

    def read():
        pieces = []
        for piece in state.text_iter():
            pieces.append(piece)
            if piece == " w0":
                gate.open()
        return pieces

    pieces = within(30, read)
    assert state.error() is None
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
    gate = Gate()  # the second gen is held until the first one's iterator has ended

    def held_second(request):
        if request.params.max_tokens == 4:
            gate.pass_through()
        return " done"

    state = story.run("x", backend=FakeBackend(responder=held_second), stream=True)
    assert "".join(within(30, lambda: list(state.text_iter("first")))) == " done"
    gate.open()
    within(30, state.sync)  # raises the gate's BackendError if the iterator waited for it


def test_text_iter_of_a_finished_state_replays_everything():
    state = story.run("x", backend=FakeBackend())
    assert "".join(state.text_iter()) == state.text()
    with pytest.raises(TypeError):
        state.text_iter(3)


def test_async_iteration_does_not_block_the_event_loop():
    gate = Gate()  # every gen is held until a task on the event loop opens the gate

    async def main():
        state = story.run("owls", backend=FakeBackend(gate=gate), stream=True)

        async def opener():  # runs only if the iteration below leaves the loop free
            while not gate.held:
                await asyncio.sleep(0.001)
            gate.open()

        task = asyncio.create_task(opener())
        pieces = [p async for p in state.text_async_iter()]
        answer = [p async for p in state.text_async_iter("second")]
        await task
        return state, pieces, answer

    state, pieces, answer = asyncio.run(asyncio.wait_for(main(), 30))
    assert state.error() is None
    assert "".join(pieces) == state.text() and "".join(answer) == state["second"]


def test_async_iteration_raises_the_programs_error():
    async def main():
        state = story.run("FAIL", backend=FakeBackend(fail_on="FAIL"), stream=True)
        return [p async for p in state.text_async_iter()]

    with pytest.raises(lp.BackendError):
        asyncio.run(asyncio.wait_for(main(), 5))


def test_run_async_runs_programs_concurrently_without_blocking():
    backend = FakeBackend(rendezvous=4)  # each gen fails unless four are in flight at once

    async def main():
        return await asyncio.gather(*(story.run_async(f"t{i}", backend=backend) for i in range(4)))

    states = asyncio.run(asyncio.wait_for(main(), 30))
    assert all(s["second"] for s in states)
    assert backend.max_active == 4


def test_run_async_re_raises_and_validates():
    backend = FakeBackend(fail_on="FAIL")
    with pytest.raises(lp.BackendError):
        asyncio.run(asyncio.wait_for(story.run_async("FAIL", backend=backend), 5))
    with pytest.raises(TypeError, match="unexpected keyword"):
        asyncio.run(story.run_async("x", backend=backend, topics="y"))
