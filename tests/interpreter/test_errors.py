import pytest
from fakes import FakeBackend, within

import lmprog as lp


class Boom(Exception):
    pass


def test_the_programs_exception_is_re_raised_by_run():
    error = Boom("boom")

    @lp.function
    def failing(s):
        s += "text"
        raise error

    with pytest.raises(Boom) as info:
        failing.run(backend=FakeBackend())
    assert info.value is error


def test_a_backend_error_surfaces_from_run_and_from_reads_inside():
    seen = {}

    @lp.function
    def reads(s):
        s += "FAIL " + lp.gen("a")
        try:
            s["a"]
        except lp.BackendError as e:
            seen["read"] = e
            raise

    with pytest.raises(lp.BackendError, match="fake backend failure"):
        within(5, lambda: reads.run(backend=FakeBackend(fail_on="FAIL")))
    assert isinstance(seen["read"], lp.BackendError)


def test_readers_of_a_failed_streaming_program_do_not_hang():
    @lp.function
    def prog(s):
        s += "FAIL " + lp.gen("a") + lp.gen("b")
        s += "after"

    state = prog.run(backend=FakeBackend(fail_on="FAIL", latency=0.05), stream=True)
    for read in (
        lambda: state["a"],
        lambda: state["b"],
        state.sync,
        lambda: list(state.text_iter()),
        lambda: list(state.text_iter("b")),
    ):
        with pytest.raises(lp.BackendError):
            within(5, read)
    assert isinstance(state.error(), lp.BackendError)
    assert within(5, state.text) == "FAIL "  # text up to the failure stays readable


def test_an_exception_in_a_streaming_body_releases_readers_of_undeclared_variables():
    @lp.function
    def prog(s):
        s += lp.gen("a", max_tokens=2)
        raise Boom("body failed")

    state = prog.run(backend=FakeBackend(latency=0.05), stream=True)
    with pytest.raises(Boom):
        within(5, lambda: state["never_declared"])


@lp.function
def exits_on_two(s, i):
    s += f"item {i} " + lp.gen("a", max_tokens=2)
    if i == 2:
        raise SystemExit("item 2 called sys.exit")


def test_a_base_exception_in_one_program_is_kept_on_its_state():
    """Not only Exception: a SystemExit in one batch item is that item's error; the others
    keep their results (it used to escape run_batch and lose them all)."""
    states = within(
        10, lambda: exits_on_two.run_batch([{"i": i} for i in range(4)], backend=FakeBackend())
    )
    assert isinstance(states[2].error(), SystemExit)
    assert [s.error() for i, s in enumerate(states) if i != 2] == [None] * 3
    assert all(s["a"] for i, s in enumerate(states) if i != 2)
    with pytest.raises(SystemExit):  # run() re-raises it, as it does any program error
        exits_on_two.run(2, backend=FakeBackend())
    streamed = exits_on_two.run(2, backend=FakeBackend(latency=0.01), stream=True)
    with pytest.raises(SystemExit):
        within(5, streamed.sync)
    assert isinstance(streamed.error(), SystemExit)


def test_unknown_variables_raise_key_error_listing_what_exists():
    @lp.function
    def prog(s):
        s += lp.gen("a", max_tokens=1)

    state = prog.run(backend=FakeBackend())
    with pytest.raises(KeyError, match=r"available: \['a'\]"):
        state["b"]


def test_reading_a_variable_not_asked_for_yet_fails_fast_inside_the_program():
    @lp.function
    def prog(s):
        s["later"]
        s += lp.gen("later")

    with pytest.raises(KeyError, match="later"):
        within(5, lambda: prog.run(backend=FakeBackend()))


def test_validation_errors_raise_at_the_append_and_the_program_can_go_on():
    caught = []

    @lp.function
    def prog(s):
        for bad in (lambda: s.__iadd__(None), lambda: s.__iadd__([1])):
            with pytest.raises(TypeError):
                bad()
        with s.user():
            with pytest.raises(ValueError, match="nest"):
                s += lp.system_begin()
            with pytest.raises(ValueError, match="nest"):
                with s.assistant():
                    pass
            with pytest.raises(ValueError, match="open message is 'user'"):
                s += lp.assistant_end()
            s += "fine"
        with pytest.raises(ValueError, match="no message is open"):
            s += lp.user_end()
        caught.append("ok")

    state = prog.run(backend=FakeBackend())
    assert caught == ["ok"]
    assert state.messages() == [{"role": "user", "content": "fine"}]


def test_sampling_arguments_merged_with_run_defaults_are_checked_at_the_append():
    @lp.function
    def prog(s):
        s += lp.gen("a", min_tokens=5)

    backend = FakeBackend()
    with pytest.raises(ValueError, match="min_tokens=5 is larger than max_tokens=2"):
        prog.run(backend=backend, max_tokens=2)
    assert backend.requests == []
    assert prog.run(backend=backend, max_tokens=8)["a"]


def test_images_need_a_vision_backend():
    @lp.function
    def prog(s):
        s += lp.image(b"\x89PNG") + "Describe it."

    with pytest.raises(lp.BackendError, match="no vision support"):
        prog.run(backend=FakeBackend())


def test_placeholders_cannot_run():
    @lp.function
    def prog(s, x):
        s += x

    with pytest.raises(TypeError, match="lp.Arg"):
        prog.run(prog.trace().nodes[0], backend=FakeBackend())


def test_appends_after_a_failure_are_dropped_and_the_error_kept():
    backend = FakeBackend(fail_on="FAIL")

    @lp.function
    def prog(s):
        s += "FAIL" + lp.gen("a")
        for _ in range(20):
            s += lp.gen("more")

    with pytest.raises(lp.BackendError):
        within(5, lambda: prog.run(backend=backend))
    assert backend.requests == []


def test_a_failing_fork_copy_fails_the_parent_at_join():
    @lp.function
    def prog(s):
        s += "start "
        forks = s.fork(3)
        forks += lambda i: ("FAIL " if i == 1 else "ok ") + lp.gen("x", max_tokens=2)
        forks.join()
        s += "after"

    with pytest.raises(lp.BackendError):
        within(5, lambda: prog.run(backend=FakeBackend(fail_on="FAIL")))


def test_copies_of_a_fork_whose_parent_failed_do_not_hang():
    @lp.function
    def prog(s):
        s += "FAIL" + lp.gen("a")
        forks = s.fork(2)
        forks += lp.gen("b")
        forks.join()

    state = prog.run(backend=FakeBackend(fail_on="FAIL"), stream=True)
    with pytest.raises(lp.BackendError):
        within(5, lambda: state["b"])
