"""lp.OpenAI: the endpoint backend, against lmprog's own server on a loopback port.

The pure pieces (role messages, request fields, echoed-logprob scoring) are unit-tested
without a server; the e2e tests start `lmprog.serve.server.Server` over one in-process
`lp.Runtime` (module scope) and compare the endpoint's answers with the same runtime's
in-process answers under greedy decoding.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import lmprog as lp
from lmprog.backends.openai import OpenAI
from lmprog.backends.openai_convert import constraint_fields, request_fields
from lmprog.backends.openai_messages import marker_template, split_messages
from lmprog.backends.openai_score import score_choices
from lmprog.core.errors import BackendError, ContextLengthError
from lmprog.core.protocol import GenerateRequest, ScoreRequest
from lmprog.core.sampling import SamplingParams

MODEL = "smollm2-135m-instruct"


# ---- pure pieces -----------------------------------------------------------------------------


def render(*parts):
    """Marked-up text as the interpreter writes it in chat mode: (role, content) pairs, and a
    trailing role name for the open message."""
    t = marker_template()
    text = ""
    for i, part in enumerate(parts):
        if isinstance(part, tuple):
            text += t.role_prefix(part[0], first=i == 0) + part[1] + t.role_suffix(part[0])
        else:
            text += t.role_prefix(part, first=i == 0)
    return text


def test_role_segments_become_messages():
    prompt = render(("system", "Be terse."), ("user", "2+2?\nThink."), "assistant")
    chat = split_messages(prompt)
    assert chat.for_generation() == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "2+2?\nThink."},
    ]
    assert split_messages("no roles at all") is None


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("preamble" + render(("user", "hi"), "assistant"), "outside any role"),
        (render(("user", "hi")) + "tail", "outside any role"),
        (render(("user", "hi"), "user"), "only generates assistant"),
        (render(("user", "hi"), "assistant") + "Sure:", "partly written"),
        (render(("user", "hi")), "inside an assistant role"),
    ],
)
def test_prompts_a_chat_api_cannot_take_raise_clearly(prompt, message):
    with pytest.raises(BackendError, match=message):
        split_messages(prompt).for_generation()


def test_request_fields_map_sampling_params():
    p = SamplingParams(
        max_tokens=7,
        stop=("\n", "."),
        temperature=0.5,
        top_p=0.9,
        top_k=5,
        seed=3,
        min_tokens=1,
        return_logprob=True,
        top_logprobs_num=2,
    )
    kwargs, extra = request_fields(p, chat=False)
    assert kwargs == {
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["\n", "."],
        "seed": 3,
        "logprobs": 2,
    }
    assert extra == {"top_k": 5, "min_tokens": 1}
    kwargs, extra = request_fields(SamplingParams(return_logprob=True), chat=True)
    assert kwargs["logprobs"] is True and kwargs["top_logprobs"] == 0 and extra == {}


def test_constraints_become_response_format_or_a_clear_error():
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    fields = constraint_fields(lp.Constraint.from_json_schema(schema), None)
    assert fields["response_format"]["type"] == "json_schema"
    assert fields["response_format"]["json_schema"]["schema"] == schema
    assert fields["response_format"]["json_schema"]["strict"] is True
    spec = constraint_fields(lp.Constraint.from_json_schema(schema, strict=False), None)
    assert spec["response_format"]["json_schema"]["strict"] is False  # open objects asked for
    regex = lp.Constraint.from_regex(r"[0-9]+")
    assert constraint_fields(regex, "regex") == {"regex": regex.pattern}
    with pytest.raises(BackendError, match="regex_field"):
        constraint_fields(regex, None)


def echoed(tokens, logprobs, offsets=None):
    lp_ = SimpleNamespace(
        tokens=tokens, token_logprobs=logprobs, text_offset=offsets, top_logprobs=None
    )
    return SimpleNamespace(text="".join(tokens), logprobs=lp_)


def test_choice_scores_take_the_tokens_overlapping_the_choice():
    # prompt "Sky:" + " blue"; the server merged ":" with " b" into one straddling token
    with_offsets = echoed(["Sky", ": b", "lue"], [None, -1.0, -2.0], [0, 3, 6])
    without = echoed(["Sky", ": b", "lue"], [None, -1.0, -2.0])
    for choice in (with_offsets, without):
        scores, prompt_tokens = score_choices([choice], "Sky:", (" blue",), unconditional=False)
        assert scores[0].token_logprobs == (-1.0, -2.0) and prompt_tokens == 1


# ---- against a real lmprog server ---------------------------------------------------------


@pytest.fixture(scope="module")
def runtime():
    import torch

    torch.set_num_threads(1)
    rt = lp.Runtime(context_length=512)
    yield rt
    rt.shutdown()


@pytest.fixture(scope="module")
def server(runtime):
    from lmprog.serve.server import Server

    with Server(runtime, host="127.0.0.1", port=0).start() as srv:
        yield srv


@pytest.fixture
def chat(server):
    with OpenAI(base_url=server.url, regex_field="regex") as backend:  # chat mode (the default)
        yield backend


@pytest.fixture
def completion(server):
    with OpenAI(MODEL, base_url=server.url + "/v1/", tokenizer=MODEL) as backend:  # completion mode
        yield backend


GREEDY = SamplingParams(max_tokens=8, temperature=0, stop=("\n",))


@pytest.mark.e2e
def test_gen_equals_the_in_process_runtime(runtime, completion):
    request = GenerateRequest("The capital of France is", GREEDY)
    ours, theirs = completion.generate(request), runtime.generate(request)
    assert ours.text == theirs.text and ours.finish_reason == theirs.finish_reason
    assert (
        ours.completion_tokens == theirs.completion_tokens
        and ours.prompt_tokens == theirs.prompt_tokens
    )
    pieces: list[str] = []
    streamed = completion.generate(request, stream=pieces.append)
    assert "".join(pieces) == streamed.text == ours.text and len(pieces) > 1


@pytest.mark.e2e
def test_logprobs_come_back_per_token(completion):
    params = SamplingParams(max_tokens=4, temperature=0, return_logprob=True, top_logprobs_num=2)
    result = completion.generate(GenerateRequest("1, 2, 3,", params))
    assert "".join(t.token for t in result.logprobs) == result.text and len(result.logprobs) == 4
    assert all(len(t.top) == 2 and t.logprob <= 0 for t in result.logprobs)


def qa(s, question):
    s += lp.system("You are a terse assistant.")
    s += lp.user(question)
    s += lp.assistant(lp.gen("answer", max_tokens=10))


@pytest.mark.e2e
def test_roles_run_as_chat_messages_or_rendered_text(runtime, chat, completion):
    program = lp.function(qa)
    local = program.run(question="Name a colour.", backend=runtime, temperature=0)
    over_chat = program.run(question="Name a colour.", backend=chat, temperature=0)
    over_text = program.run(question="Name a colour.", backend=completion, temperature=0)
    assert over_chat["answer"] == over_text["answer"] == local["answer"]
    assert over_chat.messages() == local.messages() and chat.stats()["chat_calls"] == 1
    assert chat.model_name == MODEL  # found through /v1/models


@pytest.mark.e2e
def test_json_schema_goes_as_response_format(chat, completion):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }

    @lp.function
    def person(s):
        s += lp.user("Ada is 36. Her name and age in JSON?")
        s += lp.assistant(lp.gen("info", json_schema=schema, max_tokens=32))

    for backend in (chat, completion):
        info = json.loads(person.run(backend=backend, temperature=0)["info"])
        assert list(info) == ["name", "age"] and isinstance(info["age"], int)  # the schema's order


@pytest.mark.e2e
def test_regex_needs_a_regex_field(chat, completion):
    @lp.function
    def year(s):
        s += "Ada Lovelace was born in the year " + lp.gen("year", regex=r"1[0-9]{3}", max_tokens=6)

    assert year.run(backend=chat, temperature=0)["year"].startswith("1")
    before = completion.stats()["api_calls"]
    with pytest.raises(BackendError, match="regex_field"):
        year.run(backend=completion, temperature=0)
    assert completion.stats()["api_calls"] == before  # refused before any call


@pytest.mark.e2e
def test_select_scores_match_the_runtime(runtime, completion, chat):
    request = ScoreRequest(
        "The capital of France is", (" Paris", " London", " a city"), unconditional=True
    )
    ours, theirs = completion.score(request), runtime.score(request)
    for a, b in zip(ours.choices, theirs.choices):
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-3)
        assert len(a.unconditional_token_logprobs) == len(b.unconditional_token_logprobs)

    @lp.function
    def pick(s):
        s += lp.user("Is the sky blue?")
        s += lp.assistant(lp.select("yn", ["yes", "no"]))

    assert pick.run(backend=completion)["yn"] == pick.run(backend=runtime)["yn"]
    with pytest.raises(BackendError, match="prompt logprobs"):
        pick.run(backend=chat)


@pytest.mark.e2e
def test_endpoint_errors_carry_the_servers_message(server, runtime):
    from lmprog.serve.server import Server

    with OpenAI("no-such-model", base_url=server.url) as wrong:
        with pytest.raises(BackendError, match="HTTP 404.*does not exist"):
            wrong.generate(GenerateRequest("Hi", GREEDY))
        assert wrong.stats()["errors"] == 1
    with OpenAI(MODEL, base_url=server.url) as backend:
        with pytest.raises(ContextLengthError, match="HTTP 400"):
            backend.generate(GenerateRequest("word " * 600, GREEDY))
        assert backend.generate(GenerateRequest("Hi", GREEDY)).completion_tokens > 0  # still usable
    with Server(runtime, port=0, api_key="sesame").start() as locked:
        with OpenAI(MODEL, base_url=locked.url, api_key="wrong") as backend:
            with pytest.raises(BackendError, match="HTTP 401.*API key"):
                backend.generate(GenerateRequest("Hi", GREEDY))
        with OpenAI(MODEL, base_url=locked.url, api_key="sesame") as backend:
            assert backend.generate(GenerateRequest("Hi", GREEDY)).completion_tokens > 0
    with OpenAI(MODEL, base_url=locked.url, max_retries=0) as gone:  # stopped: nothing listens
        with pytest.raises(BackendError, match="cannot reach"):
            gone.generate(GenerateRequest("Hi", GREEDY))


def test_what_an_endpoint_cannot_provide_raises_clearly():
    backend = OpenAI("m", base_url="http://127.0.0.1:9")
    with pytest.raises(BackendError, match="tokenizer"):
        backend.tokenizer
    with pytest.raises(BackendError, match="chat_template"):
        OpenAI("m", base_url="http://127.0.0.1:9", chat=False).chat_template
    with pytest.raises(ValueError, match="chat=False"):
        OpenAI("m", base_url="http://127.0.0.1:9", chat=True, chat_template="chatml")
    assert (
        backend.chat and backend.api_speculation == "message" and backend.base_url.endswith(":9/v1")
    )


# ---- API speculative execution over the server --------------------------------------------

FEW_SHOT = (
    "Name: Ada Lovelace\nBorn: 1815\nJob: mathematician\n\n"
    "Name: Alan Turing\nBorn: 1912\nJob: computer scientist\n\n"
)


def card(s):
    s += FEW_SHOT + "Name:" + lp.gen("name", stop="\n", max_tokens=12)
    s += "\nBorn:" + lp.gen("born", stop="\n", max_tokens=8)
    s += "\nJob:" + lp.gen("job", stop="\n", max_tokens=12)


def chat_card(s):
    s += lp.user("Write a card for a famous scientist, in the format Name/Born/Job.")
    s += lp.assistant("Name: Ada Lovelace\nBorn: 1815\nJob: mathematician")
    s += lp.user("Another one.")
    s += lp.assistant(
        "Name:"
        + lp.gen("name", stop="\n", max_tokens=12)
        + "\nBorn:"
        + lp.gen("born", stop="\n", max_tokens=8)
        + "\nJob:"
        + lp.gen("job", stop="\n", max_tokens=12)
    )


def card_values(state):
    return [state["name"], state["born"], state["job"]]


@pytest.mark.e2e
def test_api_speculation_saves_calls_with_equal_results(server):
    with (
        OpenAI(MODEL, base_url=server.url, chat=False, chat_template="chatml") as plain,
        OpenAI(MODEL, base_url=server.url, chat=False, chat_template="chatml") as spec,
    ):
        expected = lp.function(card).run(backend=plain, temperature=0)
        got = lp.function(num_api_spec_tokens=24)(card).run(backend=spec, temperature=0)
        assert card_values(got) == card_values(expected) and got.text() == expected.text()
        assert all(v.strip() for v in card_values(got))
        assert plain.stats()["api_calls"] == 3 and spec.stats()["api_calls"] == 1
        assert spec.stats()["prompt_tokens"] * 2 < plain.stats()["prompt_tokens"]


@pytest.mark.e2e
def test_api_speculation_fills_an_assistant_message_on_a_chat_endpoint(server, completion):
    expected = lp.function(chat_card).run(
        backend=completion, temperature=0
    )  # roles rendered as text
    with OpenAI(MODEL, base_url=server.url) as chat:
        with pytest.raises(BackendError, match="partly written"):
            lp.function(chat_card).run(backend=chat, temperature=0)
        before = chat.stats()["api_calls"]
        got = lp.function(num_api_spec_tokens=24)(chat_card).run(backend=chat, temperature=0)
        assert card_values(got) == card_values(expected)
        assert chat.stats()["api_calls"] - before == 1
