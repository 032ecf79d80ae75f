"""SGLang programs with `import lmprog as sgl` (issue 15, differences 7, 8 and 9): the
global config and token usage, f-strings of arguments while tracing, and the state's and
backends' SGLang names."""

import threading

import pytest
from fakes import FakeBackend

import lmprog as sgl
from lmprog.core.protocol import GenerateRequest, GenerateResult, TokenUsage
from lmprog.lang import ir


@pytest.fixture
def default_backend():
    backend = FakeBackend(responder=lambda r: "Paris")
    sgl.set_default_backend(backend)
    yield backend
    sgl.set_default_backend(None)


@sgl.function
def qa(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=4))


# ---- 7: global_config.default_backend and backend.token_usage ---------------------------


def test_global_config_default_backend_is_the_one_set(default_backend):
    assert sgl.global_config.default_backend is default_backend
    other = FakeBackend()
    sgl.global_config.default_backend = other  # SGLang programs may set it there too
    assert sgl.global_config.default_backend is other
    qa.run(question="Capital of France?")
    assert other.generations() and not default_backend.generations()
    with pytest.raises(TypeError, match="lmprog backend"):
        sgl.global_config.default_backend = "http://localhost:30000"
    with pytest.raises(AttributeError, match="default_backend, verbosity"):
        sgl.global_config.verbsity = 2  # a typo names the settings there are


def test_token_usage_counts_every_call_and_resets(default_backend):
    # As SGLang's benchmarks do: run, then read the default backend's token usage.
    usage = sgl.global_config.default_backend.token_usage
    usage.reset()
    state = qa.run(question="Capital of France?")
    meta = state.get_meta_info("answer")
    assert usage.prompt_tokens == meta["prompt_tokens"] > 0
    assert usage.completion_tokens == meta["completion_tokens"] > 0
    qa.run_batch([{"question": "a?"}, {"question": "b?"}])
    assert usage.completion_tokens == 3 * meta["completion_tokens"]
    usage.reset()
    assert (usage.prompt_tokens, usage.completion_tokens) == (0, 0)
    assert repr(usage) == "TokenUsage(prompt_tokens=0, completion_tokens=0)"


def test_token_usage_counts_select_and_is_per_backend():
    a, b = FakeBackend(), FakeBackend()

    @sgl.function
    def pick(s):
        s += "Pick: " + sgl.select("c", choices=["yes", "no"])

    pick.run(backend=a)
    # the prompt plus each choice's tokens (the fake backend's tokens are bytes)
    assert a.token_usage.prompt_tokens == len("Pick: ") + len("yes") + len("no")
    assert a.token_usage.completion_tokens == 0
    assert b.token_usage.prompt_tokens == 0


def test_token_usage_counts_a_subclass_calling_super_once():
    class Logged(FakeBackend):
        def generate(self, request, stream=None):
            return super().generate(request, stream)

    backend = Logged(responder=lambda r: "abc")
    backend.generate(GenerateRequest("hello"))
    assert (backend.token_usage.prompt_tokens, backend.token_usage.completion_tokens) == (5, 3)


def test_token_usage_is_thread_safe():
    usage = TokenUsage()
    result = GenerateResult("x", (1,), "stop", prompt_tokens=2, completion_tokens=1)
    threads = [
        threading.Thread(target=lambda: [usage.add_result(result) for _ in range(500)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (usage.prompt_tokens, usage.completion_tokens) == (4000, 2000)


# ---- 8: tracing f-strings ---------------------------------------------------------------

SHOTS = "The capital of Italy is Rome.\nThe capital of Spain is Madrid.\n"


@sgl.function
def capital(s, country):
    s += SHOTS + f"The capital of {country} is"
    s += sgl.gen("answer", max_tokens=4, stop="\n")
    s += f"\nIts population? {country} has" + sgl.gen("population", max_tokens=4)


def test_an_f_string_of_an_argument_traces_as_text_and_argument_nodes():
    graph = capital.trace(country=sgl.Arg)
    assert graph.stopped is None
    assert graph.nodes[:3] == (
        ir.Text(SHOTS + "The capital of "),
        ir.ArgRef("country"),
        ir.Text(" is"),
    )
    assert [n.name for n in graph.nodes if isinstance(n, ir.Gen)] == ["answer", "population"]
    assert graph.constant_prefix() == (ir.Text(SHOTS + "The capital of "),)
    assert "Arg(country)" in str(graph)


def test_run_batch_caches_the_constant_prefix_before_an_f_string_argument():
    backend = FakeBackend(responder=lambda r: "Paris")
    states = capital.run_batch([{"country": "France"}, {"country": "Japan"}], backend=backend)
    assert backend.prefixes == [SHOTS + "The capital of "]
    assert states[1].text().startswith(SHOTS + "The capital of Japan is")
    assert "Japan has" in states[1].text()


def test_a_format_spec_or_a_changed_f_string_still_stops_the_trace():
    @sgl.function
    def padded(s, country):
        s += f"[{country:>10}]" + sgl.gen("x")

    assert "spec '>10'" in padded.trace().stopped

    @sgl.function
    def shouted(s, country):
        s += "Hi " + f"{country}".upper() + sgl.gen("x")

    graph = shouted.trace()
    assert "changed as text" in graph.stopped and graph.nodes == ()


# ---- 9: the state's SGLang names --------------------------------------------------------


def test_get_var_set_var_setitem_contains_and_ret_value():
    backend = FakeBackend(responder=lambda r: "Paris")

    @sgl.function
    def prog(s):
        s += "Q: capital? A: " + sgl.gen("answer", max_tokens=4)
        s.set_var("checked", s.get_var("answer") == "Paris")
        s["score"] = {"points": 3}
        assert "score" in s and "missing" not in s
        return s["score"]["points"] + 1

    state = prog.run(backend=backend)
    assert state.get_var("answer") == "Paris"
    assert state["checked"] is True and state.get_var("score") == {"points": 3}
    assert state.get_meta_info("score") == {}
    assert state.ret_value == 4
    assert "score" in state and "answer" in state
    state.set_var("note", "after the run")  # SGLang allows it on a finished state too
    assert state["note"] == "after the run"
    assert "note" not in state.text()
    with pytest.raises(TypeError, match="non-empty str"):
        state.set_var("", 1)


def test_set_var_before_a_fork_is_seen_by_the_copies():
    backend = FakeBackend(responder=lambda r: "x")

    @sgl.function
    def prog(s):
        s["topic"] = "cats"
        s += "start"
        forks = s.fork(2)
        for f in forks:
            f += f["topic"]
        forks.join()

    assert prog.run(backend=backend).text() == "start"


def test_sglang_backend_names_exist():
    # lp.Runtime(model_path=...), lp.RuntimeEndpoint(url), lp.OpenAI(model): constructors
    # with SGLang's signatures (the e2e and serve tests run them).
    import inspect

    assert "model_path" in inspect.signature(sgl.Runtime).parameters
    assert list(inspect.signature(sgl.OpenAI).parameters)[0] == "model"
    assert list(inspect.signature(sgl.RuntimeEndpoint).parameters)[0] == "base_url"
