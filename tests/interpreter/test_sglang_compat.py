"""SGLang programs run with `import lmprog as sgl` (issue 15: differences 1, 3, 4, 5)."""

import pytest
from fakes import FakeBackend

import lmprog as sgl
from lmprog.fsm import Constraint


@sgl.function
def qa(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=4))


def test_calling_a_program_without_a_state_runs_it():
    backend = FakeBackend(responder=lambda r: "Paris")
    state = qa(question="Capital of France?", backend=backend)
    assert isinstance(state, sgl.ProgramState)
    assert state["answer"] == "Paris"
    # Positional arguments and stream=True, as `qa.run(...)` takes them.
    streamed = qa("Capital of France?", stream=True, backend=backend, temperature=0)
    assert "".join(streamed.text_iter()).endswith("Paris<|im_end|>\n")
    assert streamed["answer"] == "Paris"


def test_calling_a_program_with_a_state_still_composes():
    backend = FakeBackend(responder=lambda r: "Paris")

    @sgl.function
    def outer(s):
        s += "Q1. "
        qa(s, "Capital of France?")
        qa(s, question="And of Italy?")

    state = outer.run(backend=backend)
    assert state.text().count("Paris") == 2
    # While tracing, the tracer's state composes too: the inner program's nodes are traced.
    graph = outer.trace()
    assert graph.stopped is None
    assert sum(1 for n in graph.nodes if n == sgl.gen("answer", max_tokens=4)) == 2


def test_gen_takes_sglangs_positional_order():
    # SGLang 0.5's sgl.gen: name, max_tokens, min_tokens, n, stop, stop_token_ids, stop_regex,
    # temperature, top_p, top_k, min_p, frequency_penalty, presence_penalty, ignore_eos,
    # return_logprob, logprob_start_len, top_logprobs_num, return_text_in_logprobs, dtype,
    # choices, choices_method, regex, json_schema
    assert sgl.gen("tip", 64, stop="\n") == sgl.gen("tip", max_tokens=64, stop="\n")
    args = ("t", 8, 2, 3, ".", [7], "x+", 0.5, 0.9, 5, 0.1, 0.2, 0.3, True, True, -1, 2, True)
    assert sgl.gen(*args) == sgl.gen(
        "t",
        max_tokens=8,
        min_tokens=2,
        n=3,
        stop=".",
        stop_token_ids=[7],
        stop_regex="x+",
        temperature=0.5,
        top_p=0.9,
        top_k=5,
        min_p=0.1,
        frequency_penalty=0.2,
        presence_penalty=0.3,
        ignore_eos=True,
        return_logprob=True,
        logprob_start_len=-1,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )
    assert sgl.gen("t", *([None] * 17), int) == sgl.gen("t", dtype=int)
    assert sgl.gen("t", *([None] * 18), ["a", "b"]) == sgl.select("t", ["a", "b"])
    assert sgl.gen("t", *([None] * 20), "[0-9]+") == sgl.gen("t", regex="[0-9]+")
    schema = {"type": "integer"}
    assert sgl.gen("t", *([None] * 21), schema) == sgl.gen("t", json_schema=schema)
    backend = FakeBackend(responder=lambda r: "a tip. more")

    @sgl.function
    def tip(s):
        s += "Tip: " + sgl.gen("detailed_tip", 16, stop=".")

    state = tip.run(backend=backend)
    assert state["detailed_tip"] == "a tip"
    assert backend.generations()[0].params.max_tokens == 16


def test_gen_choices_method_goes_to_select():
    method = sgl.greedy_token_selection
    assert sgl.gen("c", choices=["a", "b"], choices_method=method) == sgl.select(
        "c", ["a", "b"], choices_method=method
    )
    with pytest.raises(TypeError, match="choices_method"):
        sgl.gen("c", choices_method=method)


def test_gen_int_and_gen_string_are_typed_gens():
    assert sgl.gen_int("n") == sgl.gen("n", dtype=int)
    # SGLang's order: name, max_tokens, n, stop, stop_token_ids, stop_regex, temperature, ...
    assert sgl.gen_int("n", 8, 2, "\n") == sgl.gen("n", max_tokens=8, n=2, stop="\n", dtype=int)
    assert sgl.gen_string("s", 16, None, None, None, "x", 0.5) == sgl.gen(
        "s", max_tokens=16, stop_regex="x", temperature=0.5, dtype=str
    )
    assert sgl.gen_string("s", 16) == sgl.gen("s", max_tokens=16, dtype=str)
    # as in SGLang, a typed number ends at a space or newline (stop strings, not kept), and
    # at the punctuation that follows numbers in prose and JSON
    assert dict(sgl.gen_int("n").overrides)["stop"] == (" ", "\n", ",", ".", ";", ")", "]", "}")
    assert dict(sgl.gen("x", dtype=float, stop=["!", "\n"]).overrides)["stop"] == (
        ("!", "\n", " ", ",", ";", ")", "]", "}")
    )
    assert "stop" not in dict(sgl.gen_string("s").overrides)
    backend = FakeBackend(responder=lambda r: "42" if r.prompt.endswith("= ") else '"hi"')

    @sgl.function
    def prog(s):
        s += "n = " + sgl.gen_int("n", 4)
        s += "\nname: " + sgl.gen_string("name", 8)

    state = prog.run(backend=backend)
    # the text, as SGLang stores it (a string keeps its quotes); parsed() gives the value
    assert state["n"] == "42" and state.parsed("n") == 42
    assert state["name"] == '"hi"' and state.parsed("name") == "hi"


@pytest.mark.parametrize(
    ("name", "regex", "good", "bad"),
    [
        ("REGEX_INT", r"[-+]?[0-9]+[ \n]*", ["42", "-7 \n"], ["4.2", "x"]),
        ("REGEX_FLOAT", r"[-+]?[0-9]*\.?[0-9]+[ \n]*", ["3.14", "-.5", "2 "], ["1.", "e"]),
        ("REGEX_BOOL", r"(True|False)", ["True", "False"], ["true"]),
        ("REGEX_STR", r"\"[\w\d\s]*\"", ['"a b 1"', '""'], ["abc", '"a"b"']),
    ],
)
def test_sglangs_regex_constants_have_its_values_and_parse(name, regex, good, bad):
    assert getattr(sgl, name) == regex
    constraint = Constraint.from_regex(regex)
    assert all(constraint.matches(text) for text in good)
    assert not any(constraint.matches(text) for text in bad)
    assert sgl.gen("x", regex=getattr(sgl, name)).constraint == constraint


def test_join_accepts_sglangs_concate_and_append_spelling():
    backend = FakeBackend(responder=lambda r: "!")

    @sgl.function
    def prog(s, mode):
        s += "P:"
        forks = s.fork(2)
        forks += [" a", " b"]
        forks += sgl.gen(max_tokens=1)
        forks.join(mode=mode)
        s += " end"

    assert prog(mode="concate_and_append", backend=backend).text() == "P: a! b! end"
    assert prog(mode="concat_and_append", backend=backend).text() == "P: a! b! end"


def test_meta_info_has_sglangs_shapes():
    """Issue 38: finish_reason is SGLang's dict; select's meta info has SGLang's keys."""

    @sgl.function
    def prog(s):
        s += "A:" + sgl.gen("a", max_tokens=8, stop=".")
        s += " B:" + sgl.gen("b", max_tokens=2)
        s += " C:" + sgl.select("c", ["yes", "no"])
        s += " D:" + sgl.select("d", ["yes", "no"], choices_method=sgl.greedy_token_selection)
        s += " E:" + sgl.select(
            "e", ["yes", "no"], choices_method=sgl.unconditional_likelihood_normalized
        )

    answers = iter(["one. two", "three four five six"])
    state = prog.run(backend=FakeBackend(responder=lambda r: next(answers)))
    assert state.get_meta_info("a")["finish_reason"] == {"type": "stop", "matched": "."}
    b = state.get_meta_info("b")
    assert b["finish_reason"] == {"type": "length", "length": b["completion_tokens"]}
    c = state.get_meta_info("c")
    assert set(c) >= {"normalized_prompt_logprobs", "input_token_logprobs", "output_token_logprobs"}
    assert c["normalized_prompt_logprobs"] == c["normalized_scores"]
    first = c["input_token_logprobs"][0]  # [logprob, token_id, token text] per choice token
    assert [t for _, t, _ in first] == list(b"yes") and "".join(x for _, _, x in first) == "yes"
    assert c["output_token_logprobs"] == [[], []]
    d = state.get_meta_info("d")
    assert len(d["greedy_logprob_matrix"]) == 2 and len(d["greedy_logprob_matrix"][1]) == 3
    e = state.get_meta_info("e")
    assert e["normalized_unconditional_prompt_logprobs"] == e["normalized_scores"]
    assert len(e["unconditional_token_logprobs"][0]) == 3
