"""Arguments and names SGLang programs pass (issue 38, section 1): fork's position_ids_offset,
`s.copy()`, select's temperature, gen's n and stop_regex, run/run_batch's n, stop_regex,
use_thread, generator_style and positional items, flush_cache / get_server_info,
`function.cache()`, `sgl.video` and global_config's flags."""

import pytest
from fakes import FakeBackend

import lmprog as sgl  # as an SGLang program imports it


def test_fork_takes_position_ids_offset_and_defaults_to_one_copy():
    # SGLang's benchmark/line_retrieval: s.fork(len(contexts), position_ids_offset)
    @sgl.function
    def retrieval(s, contexts):
        s += "Lines:\n"
        forks = s.fork(len(contexts), [i * 1000 for i in range(len(contexts))])
        forks += lambda i: contexts[i] + "\n"
        forks.join(mode="concate_and_append")
        single = s.fork()
        assert len(single) == 1
        single.join()
        s += "Answer:" + sgl.gen("answer", max_tokens=4)

    backend = FakeBackend(responder=lambda r: " 42")
    state = retrieval.run(contexts=["a", "b"], backend=backend)
    assert state.text() == "Lines:\na\nb\nAnswer: 42"
    with pytest.raises(TypeError, match="position_ids_offset"):
        retrieval.run(contexts=["a"], backend=backend, temperature=0).fork(1, 5)


def test_copy_is_a_fork_of_one_joined_at_the_end():
    @sgl.function
    def prog(s):
        s += "Q:"
        with s.copy() as c:
            c += sgl.gen("draft", max_tokens=4)
        s += " done"

    state = prog.run(backend=FakeBackend(responder=lambda r: " yes"))
    assert state["draft"] == [" yes"]  # gathered, as SGLang's join() gathers
    assert state.text() == "Q: done"


def test_select_takes_sglangs_positional_temperature():
    assert sgl.select("a", ["x", "y"], 0.0) == sgl.select("a", ["x", "y"])
    method = sgl.greedy_token_selection
    assert sgl.select("a", ["x", "y"], 0, method) == sgl.select(
        "a", ["x", "y"], choices_method=method
    )
    assert sgl.gen("a", choices=["x", "y"], temperature=0) == sgl.select("a", ["x", "y"])
    with pytest.raises(ValueError, match="temperature must be 0"):
        sgl.select("a", ["x", "y"], 0.7)


def test_gen_n_draws_that_many_and_the_text_goes_on_with_the_first():
    answers = iter(["one", "two", "three"])
    backend = FakeBackend(responder=lambda r: next(answers))

    @sgl.function
    def prog(s):
        s += "Say a number: " + sgl.gen("x", max_tokens=4, n=3, seed=5)

    state = prog.run(backend=backend)
    assert state["x"] == ["one", "two", "three"]
    assert state.text() == "Say a number: one"
    assert [m["completion_tokens"] for m in state.get_meta_info("x")] == [3, 3, 5]
    requests = backend.generations()
    assert [r.params.n for r in requests] == [1, 1, 1]
    assert [r.params.seed for r in requests] == [5, 6, 7]  # seed + i, as the server's n
    assert len({r.prompt for r in requests}) == 1


def test_run_n_and_stop_regex_are_defaults_for_every_gen():
    backend = FakeBackend(responder=lambda r: "abc")

    @sgl.function
    def prog(s):
        s += sgl.gen("a", max_tokens=4) + sgl.gen("b", max_tokens=4, n=1)

    state = prog.run(backend=backend, n=2, stop_regex=r"\d+", use_thread=False)
    assert state["a"] == ["abc", "abc"] and state["b"] == "abc"
    assert all(r.params.stop_regex == (r"\d+",) for r in backend.generations())
    with pytest.raises(ValueError, match="stop_regex"):
        prog.run(backend=backend, stop_regex="(")
    with pytest.raises(TypeError, match="use_thread"):
        prog.run(backend=backend, use_thread="yes")


def test_run_batch_takes_lists_of_positional_arguments_and_generator_style():
    @sgl.function
    def prog(s, question, suffix="?"):
        s += question + suffix + sgl.gen("a", max_tokens=2)

    backend = FakeBackend(responder=lambda r: "!")
    states = prog.run_batch([["Why"], ("How", "!?")], backend=backend)
    assert [st.text() for st in states] == ["Why?!", "How!?!"]
    with pytest.raises(TypeError, match="takes 1 to 2"):
        prog.run_batch([["a", "b", "c"]], backend=backend)
    generated = prog.run_batch(
        [{"question": "A"}, {"question": "B"}], backend=backend, generator_style=True
    )
    assert not isinstance(generated, list)
    assert [st.text() for st in generated] == ["A?!", "B?!"]


def test_flush_cache_and_get_server_info_at_the_top_level_and_on_backends():
    backend = FakeBackend()
    assert backend.flush_cache() is False  # a backend with no cache to empty
    info = backend.get_server_info()
    assert info["backend"] == "FakeBackend" and "version" in info and "stats" in info
    sgl.set_default_backend(backend)
    try:
        assert sgl.flush_cache() is False
        assert sgl.get_server_info() == info
        assert sgl.global_config.default_backend.get_server_info()["backend"] == "FakeBackend"
    finally:
        sgl.set_default_backend(None)
    assert sgl.flush_cache() is False and sgl.get_server_info() is None  # no backend


def test_function_cache_prefills_the_constant_prefix():
    @sgl.function
    def prog(s, question):
        s += "You are a careful assistant. " * 4 + "Question: " + question
        s += sgl.gen("a", max_tokens=2)

    backend = FakeBackend()
    prog.cache(backend=backend)
    assert backend.prefixes == ["You are a careful assistant. " * 4 + "Question: "]


def test_video_says_no_backend_takes_it():
    with pytest.raises(sgl.BackendError, match="video"):
        sgl.video("clip.mp4", 8)


def test_global_config_flags_that_programs_set(capsys):
    @sgl.function
    def prog(s, x):
        s += "The same long prefix for every item. " * 3 + x + sgl.gen("a", max_tokens=2)

    backend = FakeBackend(responder=lambda r: "!")
    config = sgl.global_config
    try:
        config.enable_precache_with_tracing = False
        prog.run_batch([{"x": "a"}, {"x": "b"}], backend=backend)
        assert backend.prefixes == []  # no traced prefix cached first
        config.enable_precache_with_tracing = True
        prog.run_batch([{"x": "a"}, {"x": "b"}], backend=backend)
        assert len(backend.prefixes) == 1
        config.verbosity = 2  # SGLang's: print each run's text
        prog.run(x="c", backend=backend)
        assert capsys.readouterr().out.endswith("c!\n")
        config.enable_parallel_encoding = False
        with pytest.raises(ValueError, match="must be True"):
            config.skip_special_tokens_in_output = False
    finally:
        config.verbosity = 0
        config.enable_parallel_encoding = True
