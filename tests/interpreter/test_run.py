import threading

import pytest
from fakes import FakeBackend, Gate

import lmprog as lp
from lmprog.core.protocol import GenerateRequest, ScoreRequest
from lmprog.lang import ir


@pytest.fixture
def backend():
    return FakeBackend()


@lp.function
def chat(s, question):
    s += lp.system("Be terse.")
    with s.user():
        s += question
    s += lp.assistant(lp.gen("answer", max_tokens=4))


def test_roles_render_with_the_chat_template_and_build_messages():
    backend = FakeBackend(responder=lambda r: "Paris")
    state = chat.run("Capital of France?", backend=backend)
    assert state.text() == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
        "<|im_start|>assistant\nParis<|im_end|>\n"
    )
    assert state["answer"] == "Paris"
    assert state.messages() == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris"},
    ]
    # The gen saw everything before it, ending with the assistant prefix.
    assert backend.generations()[0].prompt.endswith(
        "Capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_first_role_message_uses_the_first_prefix():
    class Marked(FakeBackend):
        @property
        def chat_template(self):
            base = super().chat_template

            class T:
                def role_prefix(self, role, first=False):
                    return ("FIRST:" if first else "") + base.role_prefix(role)

                def role_suffix(self, role):
                    return base.role_suffix(role)

            return T()

    state = chat.run("q", backend=Marked(responder=lambda r: "a"))
    assert state.text().count("FIRST:") == 1 and state.text().startswith("FIRST:<|im_start|>system")


def test_meta_info_comes_from_the_result(backend):
    state = chat.run("q", backend=backend)
    meta = state.get_meta_info("answer")
    assert meta["completion_tokens"] == 4 and meta["finish_reason"]["type"] == "length"
    assert meta["prompt_tokens"] == len(backend.generations()[0].prompt)


def test_sampling_defaults_merge_under_gen_arguments(backend):
    @lp.function
    def two(s):
        s += lp.gen("a", max_tokens=3)
        s += lp.gen("b", temperature=0.5)

    two.run(backend=backend, temperature=0, max_tokens=7, top_k=4)
    first, second = (r.params for r in backend.generations())
    assert (first.max_tokens, first.temperature, first.top_k) == (3, 0, 4)
    assert (second.max_tokens, second.temperature, second.top_k, second.top_p) == (7, 0.5, 4, 1.0)


def test_unknown_run_keyword_is_a_type_error(backend):
    with pytest.raises(TypeError, match="question"):
        chat.run("q", backend=backend, max_token=5)
    assert backend.requests == []


def test_temperature_zero_is_deterministic(backend):
    texts = {chat.run("same", backend=backend, temperature=0).text() for _ in range(3)}
    assert len(texts) == 1
    sampled = {chat.run("same", backend=backend).text() for _ in range(3)}
    assert len(sampled) > 1  # the toy model does vary when sampling


def test_select_appends_the_best_scored_choice():
    backend = FakeBackend(
        scorer=lambda prompt, choice: [-0.1 if choice == "blue" else -2.0] * len(choice)
    )

    @lp.function
    def color(s):
        s += "The sky is "
        s += lp.select("color", ["red", "blue", "green"]) + "."

    state = color.run(backend=backend)
    assert state["color"] == "blue" and state.text() == "The sky is blue."
    meta = state.get_meta_info("color")
    assert meta["normalized_scores"] == pytest.approx([-2.0, -0.1, -2.0])
    assert meta["choices_method"] == "token_length_normalized"
    request = backend.requests[0]
    assert (
        isinstance(request, ScoreRequest)
        and request.prompt == "The sky is "
        and not request.unconditional
    )


def test_unconditional_select_asks_for_unconditional_scores(backend):
    @lp.function
    def pick(s):
        s += lp.select("x", ["a", "b"], choices_method=lp.unconditional_likelihood_normalized)

    state = pick.run(backend=backend)
    assert backend.requests[0].unconditional and state["x"] in ("a", "b")


def test_gen_with_choices_scores_instead_of_generating(backend):
    @lp.function
    def pick(s):
        s += lp.gen("x", choices=["yes", "no"], temperature=0)

    assert pick.run(backend=backend)["x"] in ("yes", "no")
    assert [type(r) for r in backend.requests] == [ScoreRequest]


def test_var_scope_captures_the_text_appended_inside(backend):
    @lp.function
    def scoped(s):
        s += "before "
        with s.var_scope("inner"):
            s += "one " + lp.gen(max_tokens=2) + " two"
        s += " after"

    state = scoped.run(backend=backend, temperature=0)
    assert state["inner"].startswith("one ") and state["inner"].endswith(" two")
    assert state.text() == "before " + state["inner"] + " after"


def test_programs_compose_by_calling(backend):
    @lp.function
    def inner(s, word):
        s += word + lp.gen("x", max_tokens=1)

    @lp.function
    def outer(s):
        inner(s, "hello")
        s += "!"

    state = outer.run(backend=backend)
    assert state.text().startswith("hello") and state.text().endswith("!") and state["x"]


class IntConstraint:
    """Duck-typed stand-in for lmprog.fsm.Constraint.from_dtype(int)."""

    pattern = r"-?\d+"

    def matches(self, text):
        return text.lstrip("-").isdigit()

    def parse(self, text):
        if not self.matches(text):
            raise ValueError(f"not an int: {text!r}")
        return int(text)


def test_constrained_gen_variables_hold_their_text_and_parsed_gives_the_value():
    backend = FakeBackend(responder=lambda r: "42")

    @lp.function
    def number(s):
        s += "n = " + ir.Gen("n", (), IntConstraint(), "dtype=int")
        s += ", n + 1 = " + s["n"] + "1"  # as SGLang programs use it: text

    state = number.run(backend=backend)
    assert state["n"] == "42" and state.parsed("n") == 42
    assert state.text() == "n = 42, n + 1 = 421"
    assert backend.generations()[0].constraint.__class__ is IntConstraint


def test_unparseable_constrained_output_is_a_constraint_error():
    # finished (at a stop), not cut short at max_tokens: the backend broke the constraint
    @lp.function
    def number(s):
        s += ir.Gen("n", (("stop", ("\n",)),), IntConstraint(), "dtype=int")

    with pytest.raises(lp.ConstraintError, match="does not parse"):
        number.run(backend=FakeBackend(responder=lambda r: "4x\n"))


def test_a_constrained_gen_cut_short_keeps_its_text_and_parsed_raises():
    @lp.function
    def number(s):
        s += ir.Gen("n", (), IntConstraint(), "dtype=int")

    state = number.run(backend=FakeBackend(responder=lambda r: "4x"))  # finish_reason "length"
    assert state["n"] == "4x"
    with pytest.raises(lp.ConstraintError, match="finish_reason 'length'"):
        state.parsed("n")


def test_dtype_gens_parse_through_lmprog_fsm():
    backend = FakeBackend(responder=lambda r: "True" if r.prompt.endswith("bool: ") else "17")

    @lp.function
    def typed(s):
        s += "int: " + lp.gen("i", dtype=int) + "\nbool: " + lp.gen("b", dtype=bool)

    state = typed.run(backend=backend)
    assert state["i"] == "17" and state["b"] == "True"  # the text, as in SGLang
    assert state.parsed("i") == 17 and state.parsed("b") is True


def test_user_code_runs_ahead_of_generation():
    gate = Gate()  # the gen cannot finish before the gate opens
    backend = FakeBackend(gate=gate, responder=lambda r: " answer")
    marks = {}

    @lp.function
    def ahead(s):
        s += lp.gen("a", max_tokens=2)
        s += "appended while generating"  # an append that waited for the gen would deadlock
        threading.Timer(0.05, gate.open).start()  # opens while the read below waits
        marks["a"] = s["a"]
        marks["read after the gate opened"] = gate.is_open

    ahead.run(backend=backend)
    assert marks == {"a": " answer", "read after the gate opened": True}


def test_programs_without_roles_need_no_chat_template():
    class NoTemplate(FakeBackend):
        @property
        def chat_template(self):
            raise ValueError("this model ships no chat template")

    @lp.function
    def plain(s):
        s += "text " + lp.gen("a", max_tokens=1)

    backend = NoTemplate()
    assert plain.run(backend=backend)["a"]
    assert len(plain.run_batch([{}, {}], backend=backend)) == 2
    with pytest.raises(ValueError, match="no chat template"):
        chat.run("q", backend=backend)


def test_a_finished_state_is_read_only(backend):
    state = chat.run("q", backend=backend)
    with pytest.raises(RuntimeError, match="finished"):
        state += "more"


def test_requests_are_plain_protocol_objects(backend):
    chat.run("q", backend=backend)
    assert all(type(r) in (GenerateRequest, ScoreRequest) for r in backend.requests)


def test_reading_a_regenerated_variable_waits_for_the_new_value():
    answers = iter(["search", "search", "finish"])
    backend = FakeBackend(
        latency=0.02, scorer=lambda prompt, choice: [0.0 if choice == current[0] else -5.0]
    )
    current = [None]

    @lp.function
    def react(s):
        steps = 0
        while steps < 5:
            current[0] = next(answers)
            s += "\nAction: " + lp.select("action", ["search", "finish"])
            steps += 1
            if s["action"] == "finish":
                break
        s += f"\nsteps={steps}"

    state = react.run(backend=backend)
    assert state.text().endswith("steps=3")
    assert state.text().count("Action: search") == 2 and state["action"] == "finish"


def test_a_backend_context_length_error_surfaces_unchanged():
    class Short(FakeBackend):
        def generate(self, request, stream=None):
            raise lp.ContextLengthError("prompt of 9000 tokens exceeds the context of 2048")

    with pytest.raises(lp.ContextLengthError, match="exceeds the context"):
        chat.run("q", backend=Short())


def test_an_unclosed_role_shows_in_messages():
    """Issue 13, finding 7: an open `user_begin()` is the last message, not dropped."""

    @lp.function
    def unclosed(s):
        s += lp.system("Be brief.")
        s += lp.user_begin()
        s += "What is 2+2?"

    state = unclosed.run(backend=FakeBackend())
    assert state.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
    ]

    @lp.function
    def closed(s):
        s += lp.user("Hi")

    assert closed.run(backend=FakeBackend()).messages() == [{"role": "user", "content": "Hi"}]
