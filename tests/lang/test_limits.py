"""DSL limits (issue 13, finding 1): a call asking for more than a limit is a ValueError at
the call naming the limit; `lp.set_limits` changes them."""

import pytest

import lmprog as lp


@pytest.fixture
def restore_limits():
    before = lp.get_limits()
    yield
    lp.set_limits(**{k: getattr(before, k) for k in before.__dataclass_fields__})


def test_stop_lists_are_bounded(restore_limits):
    limits = lp.get_limits()
    with pytest.raises(ValueError, match="max_stop=64"):
        lp.gen("x", stop=[f"s{i}" for i in range(limits.max_stop + 1)])
    with pytest.raises(ValueError, match="max_stop_chars=1024"):
        lp.gen("x", stop="x" * (limits.max_stop_chars + 1))
    lp.gen("x", stop=[f"s{i}" for i in range(limits.max_stop)])  # at the limit: fine
    lp.set_limits(max_stop=2)
    with pytest.raises(ValueError, match="max_stop=2"):
        lp.gen("x", stop=["a", "b", "c"])


def test_run_defaults_stop_lists_are_bounded_too(restore_limits):
    from fakes import FakeBackend

    @lp.function
    def prog(s):
        s += lp.gen("x", max_tokens=2)

    backend = FakeBackend()
    too_many = [f"s{i}" for i in range(lp.get_limits().max_stop + 1)]
    with pytest.raises(ValueError, match=r"run\(stop=.*max_stop=64"):
        prog.run(stop=too_many, backend=backend)
    with pytest.raises(ValueError, match=r"item 0: run\(stop=.*max_stop_chars=1024"):
        prog.run_batch([{}], stop="x" * 1025, backend=backend)
    with pytest.raises(ValueError, match="max_stop=64"):
        prog.trace(stop=too_many)
    assert backend.requests == []  # refused at the call, before any request
    lp.set_limits(max_stop=1)
    assert prog.run(stop="a", backend=backend)["x"] is not None


def test_select_choices_are_bounded(restore_limits):
    lp.set_limits(max_choices=3)
    with pytest.raises(ValueError, match="max_choices=3"):
        lp.select("x", choices=["a", "b", "c", "d"])
    lp.select("x", choices=["a", "b", "c"])


def test_a_large_choice_list_is_checked_fast():
    choices = [str(i) for i in range(10_000)]  # duplicates used to be found in O(n^2)
    assert len(lp.select("x", choices=choices).choices) == 10_000
    with pytest.raises(ValueError, match="repeated"):
        lp.select("x", choices=["a", "b", "a"])


def test_fork_copies_are_bounded(restore_limits):
    from fakes import FakeBackend

    lp.set_limits(max_fork=4)

    @lp.function
    def wide(s, n):
        s += "x"
        s.fork(n).join()

    wide.run(4, backend=FakeBackend())
    with pytest.raises(ValueError, match="max_fork=4"):
        wide.run(5, backend=FakeBackend())


def test_set_limits_checks_names_and_values(restore_limits):
    with pytest.raises(TypeError, match="unknown limit"):
        lp.set_limits(max_nothing=1)
    with pytest.raises(ValueError, match="max_stop"):
        lp.set_limits(max_stop=0)
