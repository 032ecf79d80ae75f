import pytest

import lmprog as lp
from lmprog.lang import ir


@lp.function
def qa(s, question, prefix="Q: "):
    s += lp.system("Be terse.")
    with s.user():
        s += prefix + question
    s += lp.assistant(lp.gen("answer", max_tokens=8))


def kinds(graph):
    return [type(n).__name__ for n in graph.nodes]


def test_trace_records_the_nodes_in_order():
    graph = qa.trace(question=lp.Arg)
    assert kinds(graph) == [
        "RoleBegin",
        "Text",
        "RoleEnd",
        "RoleBegin",
        "Text",
        "ArgRef",
        "RoleEnd",
        "RoleBegin",
        "Gen",
        "RoleEnd",
    ]
    assert graph.arguments == ("question",) and graph.stopped is None
    assert graph.nodes[4] == ir.Text("Q: ")  # the default argument was used
    assert graph.nodes[8] == lp.gen("answer", max_tokens=8)


def test_missing_arguments_default_to_placeholders_and_values_are_kept():
    assert qa.trace().arguments == ("question",)
    graph = qa.trace(question="Why?", prefix=lp.Arg)
    assert graph.arguments == ("prefix",)
    assert ir.Text("Why?") in graph.nodes


def test_constant_prefix_stops_at_the_first_argument():
    prefix = qa.trace().constant_prefix()
    assert prefix == (
        ir.RoleBegin("system"),
        ir.Text("Be terse."),
        ir.RoleEnd("system"),
        ir.RoleBegin("user"),
        ir.Text("Q: "),
    )
    known = qa.trace(question="x", prefix="y").constant_prefix()
    assert ir.Text("yx") in known and known[-1] == ir.RoleBegin("assistant")  # up to the gen


@pytest.mark.parametrize(
    "body, reason",
    [
        (lambda s, a: s.__iadd__(str(a)), "str()"),
        (lambda s, a: s.__iadd__(f"{a:>8}!"), "formatting with the spec"),
        (lambda s, a: s.__iadd__(f"{a}!".upper()), "changed as text"),
        (lambda s, a: s.__iadd__(lp.gen("g", stop=f"{a}")), "Gen node's arguments"),
        (lambda s, a: s.__iadd__("yes" if a else "no"), "truth test"),
        (lambda s, a: s.__iadd__(a.upper()), ".upper"),
        (lambda s, a: [s.__iadd__(x) for x in a], "iteration"),
        (lambda s, a: s.__iadd__(lp.gen("g", max_tokens=a)), "max_tokens"),
    ],
)
def test_tracing_stops_where_a_value_is_needed(body, reason):
    def program(s, a):
        s += "start"
        body(s, a)
        s += "never recorded"

    graph = lp.function(program).trace()
    assert reason in graph.stopped
    assert graph.nodes == (ir.Text("start"),)


def test_reading_a_generated_value_stops_the_trace():
    @lp.function
    def loop(s):
        s += lp.gen("x")
        if s["x"] == "done":
            s += "!"

    graph = loop.trace()
    assert "reads variable 'x'" in graph.stopped
    assert kinds(graph) == ["Gen"]


def test_a_program_swallowing_exceptions_still_stops():
    @lp.function
    def careful(s, a):
        try:
            s += str(a)
        except Exception:
            s += "swallowed"

    assert careful.trace().stopped and careful.trace().nodes == ()


def test_forks_are_sub_graphs():
    @lp.function
    def tot(s, topic):
        s += "Think about " + topic
        forks = s.fork(2)
        forks += lambda i: f"\nIdea {i}: " + lp.gen("idea", max_tokens=4)
        forks.join(mode="concat_and_append")
        s += lp.gen("verdict")

    graph = tot.trace()
    fork = graph.nodes[2]
    assert isinstance(fork, ir.Fork) and fork.n == 2 and len(fork.branches) == 2
    assert fork.branches[1].nodes == (ir.Text("\nIdea 1: "), lp.gen("idea", max_tokens=4))
    assert graph.nodes[3] == ir.Join(fork.fork_id, "concat_and_append")
    assert sum(isinstance(n, ir.Gen) for n in graph.walk()) == 3
    text = str(graph)
    assert "graph tot(topic)" in text and "branch1" in text and "Join(" in text


def test_printing_shows_why_tracing_stopped():
    assert "tracing stopped" in str(lp.function(lambda s, a: s.__iadd__(str(a))).trace())


def test_errors_in_the_program_are_not_hidden_by_tracing():
    @lp.function
    def nested(s):
        with s.user():
            s += lp.system("x")

    with pytest.raises(ValueError, match="nest"):
        nested.trace()


def test_trace_validates_sampling_keywords_like_run():
    with pytest.raises(TypeError, match="unexpected keyword"):
        qa.trace(question="x", tempreature=0)
