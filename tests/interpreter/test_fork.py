import pytest
from fakes import FakeBackend, within

import lmprog as lp


def echo(request):
    """The last line of the prompt, reversed: which copy asked is visible in the answer."""
    return str(request.prompt).rsplit("\n", 1)[-1][::-1]


def test_gather_collects_each_copys_new_variables_in_order():
    backend = FakeBackend(responder=echo)

    @lp.function
    def prog(s):
        s += lp.gen("before", max_tokens=1)
        s += "\n"
        forks = s.fork(3)
        forks += lambda i: f"copy{i}" + lp.gen("x") + lp.gen("y")
        forks.join()
        s += "\nend"

    state = prog.run(backend=backend)
    assert state["x"] == ["0ypoc", "1ypoc", "2ypoc"]
    assert state["y"] == [f"copy{i}{i}ypoc" for i in range(3)]  # each copy saw its own x
    assert state.text().endswith("\nend") and "copy" not in state.text()  # gather leaves the text
    assert len(state.get_meta_info("x")) == 3


def test_copies_start_from_the_parent_and_share_its_variables():
    @lp.function
    def prog(s):
        s += "base " + lp.gen("a", max_tokens=1)
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f" child{i} "
            assert f["a"] == s["a"]
        forks.join()
        for f in forks:
            assert f.text().startswith(s.text())

    prog.run(backend=FakeBackend())


def test_concat_and_append_appends_each_copys_text_in_order():
    backend = FakeBackend(responder=lambda r: "!")

    @lp.function
    def prog(s):
        s += "P:"
        forks = s.fork(3)
        forks += [" a", " b", " c"]
        forks += lp.gen(max_tokens=1)
        s += " parent-continues"
        forks.join(mode="concat_and_append")
        s += " end"

    assert prog.run(backend=backend).text() == "P: parent-continues a! b! c! end"


def test_concat_keeps_messages_of_copies():
    @lp.function
    def prog(s):
        s += lp.user("q")
        forks = s.fork(2)
        forks += lambda i: lp.assistant(f"answer {i}")
        forks.join("concat_and_append")

    messages = prog.run(backend=FakeBackend()).messages()
    assert [m["content"] for m in messages] == ["q", "answer 0", "answer 1"]


def test_fork_caches_the_parent_prefix_first():
    backend = FakeBackend(responder=lambda r: "gen")

    @lp.function
    def prog(s):
        s += "prefix " + lp.gen("a")
        forks = s.fork(2)
        forks += lp.gen("b")
        forks.join()

    prog.run(backend=backend)
    assert backend.prefixes == ["prefix gen"]
    assert all(r.prompt.startswith("prefix gen") for r in backend.generations()[1:])


def test_copies_run_concurrently():
    backend = FakeBackend(rendezvous=4)  # each gen fails unless all four are in flight at once

    @lp.function
    def prog(s):
        forks = s.fork(4)
        forks += lp.gen("x", max_tokens=2)
        forks.join()

    state = within(30, lambda: prog.run(backend=backend))
    assert len(state["x"]) == 4
    assert backend.max_active == 4


def test_nested_forks_gather_lists_of_lists():
    backend = FakeBackend(responder=echo)

    @lp.function
    def prog(s):
        outer = s.fork(2)
        for i, f in enumerate(outer):
            f += f"\no{i}"
            inner = f.fork(2)
            inner += lambda j: f"i{j}" + lp.gen("leaf")
            inner.join()
        outer.join()

    assert prog.run(backend=backend)["leaf"] == [["0i0o", "1i0o"], ["0i1o", "1i1o"]]


def test_group_appends_validate_before_appending():
    @lp.function
    def prog(s):
        forks = s.fork(2)
        with pytest.raises(ValueError, match="exactly 2"):
            forks += ["only one"]
        with pytest.raises(TypeError):
            forks += ["ok", None]
        with pytest.raises(TypeError):
            forks[0] = "replacement"
        forks[1] += "second"
        forks.join("concat_and_append")
        with pytest.raises(ValueError, match="already joined"):
            forks.join()
        with pytest.raises(RuntimeError, match="joined"):
            forks[0] += "late"
        with pytest.raises(ValueError, match="mode"):
            s.fork(1).join(mode="merge")

    assert prog.run(backend=FakeBackend()).text() == "second"


@pytest.mark.parametrize("n, error", [(0, ValueError), (2.0, TypeError), (True, TypeError)])
def test_fork_count_is_checked(n, error):
    @lp.function
    def prog(s):
        s.fork(n)

    with pytest.raises(error):
        prog.run(backend=FakeBackend())


def test_concat_join_requires_matching_roles():
    @lp.function
    def prog(s):
        forks = s.fork(2)
        forks[0] += lp.user_begin()
        with pytest.raises(ValueError, match="copy 0"):
            forks.join("concat_and_append")

    prog.run(backend=FakeBackend())


def test_a_fork_never_joined_does_not_hang_the_program():
    @lp.function
    def prog(s):
        forks = s.fork(2)
        forks += lp.gen("x", max_tokens=1)
        s += "done"

    assert within(5, lambda: prog.run(backend=FakeBackend())).text() == "done"
