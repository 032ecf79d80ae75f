"""Requests as vLLM's and SGLang's users send them, with the official `openai` client on
loopback against the default model: the guided_* and SGLang constraint extras,
repetition_penalty, conflicts between constraints (400s naming the field)."""

from __future__ import annotations

import json
import re

import openai
import pytest

from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams
from lmprog.fsm.index import matches_bytes
from lmprog.serve.constraints import output_constraint
from lmprog.serve.errors import APIError

pytestmark = pytest.mark.e2e

POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["x"],
    "additionalProperties": False,
}
GRAMMAR = 'root ::= "red" | "green" | "blue"'


def _chat(client, server, extra, **kw):
    r = client.chat.completions.create(
        model=server.model_name,
        messages=[{"role": "user", "content": "Pick a color, a number or a word."}],
        max_tokens=24,
        temperature=0,
        extra_body=extra,
        **kw,
    )
    return r.choices[0].message.content


def _complete(client, server, extra):
    r = client.completions.create(
        model=server.model_name, prompt="Answer:", max_tokens=24, temperature=0, extra_body=extra
    )
    return r.choices[0].text


def _point(text):
    value = json.loads(text)
    assert set(value) == {"x"} and isinstance(value["x"], int) and 0 <= value["x"] <= 99
    return True


CASES = [
    ("guided_regex", r"[0-9]{3}", lambda t: re.fullmatch(r"[0-9]{3}", t)),
    ("regex", r"(yes|no)!", lambda t: t in ("yes!", "no!")),
    ("guided_choice", ["alpha", "beta", "gamma"], lambda t: t in ("alpha", "beta", "gamma")),
    ("guided_json", POINT, _point),
    ("guided_json", json.dumps(POINT), _point),  # vLLM takes the schema as JSON text too
    ("json_schema", json.dumps(POINT), _point),  # SGLang's: a JSON string
    ("json_schema", POINT, _point),
    ("guided_grammar", GRAMMAR, lambda t: t in ("red", "green", "blue")),
    ("ebnf", GRAMMAR, lambda t: t in ("red", "green", "blue")),
]
IDS = [f"{name}-{i}" for i, (name, _, _) in enumerate(CASES)]


@pytest.mark.parametrize(("field", "value", "ok"), CASES, ids=IDS)
def test_each_constraint_extra_on_chat(client, server, field, value, ok):
    text = _chat(client, server, {field: value})
    assert ok(text), text


@pytest.mark.parametrize(("field", "value", "ok"), CASES[::2], ids=IDS[::2])
def test_each_constraint_extra_on_completions(client, server, field, value, ok):
    text = _complete(client, server, {field: value})
    assert ok(text), text


def test_guided_json_with_a_whitespace_pattern(client, server):
    text = _chat(client, server, {"guided_json": POINT, "guided_whitespace_pattern": r"[ ]{0,2}"})
    assert _point(text), text
    # the pattern is the one generation writes between JSON tokens: two spaces, not three
    # (the constraint's own grammar; texts are read with any JSON whitespace)
    wide = output_constraint(guided_json=POINT, guided_whitespace_pattern=r"[ ]{0,2}")
    assert matches_bytes(wide, b'{  "x":  5}') and not matches_bytes(wide, b'{   "x": 5}')
    assert not matches_bytes(output_constraint(guided_json=POINT), b'{  "x": 5}')  # [ ]?
    assert wide.matches('{   "x": 5}')


def _bad(call) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    assert info.value.status_code == 400
    err = info.value.body
    assert set(err) == {"message", "type", "param", "code"}, err
    return err


@pytest.mark.parametrize(
    ("extra", "kw", "param"),
    [
        ({"guided_json": POINT, "guided_regex": "a+"}, {}, "guided_regex"),
        ({"regex": "a+", "guided_choice": ["a"]}, {}, "guided_choice"),
        ({"ebnf": GRAMMAR, "guided_grammar": GRAMMAR}, {}, "guided_grammar"),
        ({"json_schema": POINT}, {"response_format": {"type": "json_object"}}, "json_schema"),
        ({"guided_json": POINT}, {"response_format": {"type": "json_object"}}, "guided_json"),
    ],
)
def test_two_constraints_are_a_400_naming_them(client, server, extra, kw, param):
    err = _bad(lambda: _chat(client, server, extra, **kw))
    assert err["param"] == param and err["code"] == "conflicting_constraints"
    for name in (*extra, *kw):
        assert name in err["message"]


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"guided_whitespace_pattern": r"\s*"}, "guided_whitespace_pattern", None),
        (
            {"guided_regex": "a+", "guided_whitespace_pattern": " "},
            "guided_whitespace_pattern",
            None,
        ),
        (
            {"guided_json": POINT, "guided_whitespace_pattern": "(["},
            "guided_whitespace_pattern",
            "invalid_regex",
        ),
        ({"guided_grammar": "root ::= undefined_rule"}, "guided_grammar", "invalid_grammar"),
        ({"ebnf": "root ::= ("}, "ebnf", "invalid_grammar"),
        ({"guided_regex": "(unclosed"}, "guided_regex", "invalid_regex"),
        ({"guided_json": {"type": "bogus"}}, "guided_json", "invalid_schema"),
        ({"guided_json": "{not json"}, "guided_json", "invalid_schema"),
        ({"guided_choice": []}, "guided_choice", "invalid_value"),
        ({"repetition_penalty": 0.0}, "repetition_penalty", None),
    ],
)
def test_bad_extras_are_400s_naming_the_field(client, server, extra, param, code):
    err = _bad(lambda: _chat(client, server, extra))
    assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    assert _chat(client, server, {"guided_choice": ["ok"]}) == "ok"  # still serving


def test_a_grammar_with_tools_under_auto_is_a_400(client, server):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    err = _bad(lambda: _chat(client, server, {"guided_grammar": GRAMMAR}, tools=[tool]))
    assert err["param"] == "guided_grammar"
    text = _chat(client, server, {"guided_grammar": GRAMMAR}, tools=[tool], tool_choice="none")
    assert text in ("red", "green", "blue")


def test_output_constraint_refuses_two_fields_directly():
    with pytest.raises(APIError, match="guided_regex and guided_grammar"):
        output_constraint(guided_regex="a", guided_grammar=GRAMMAR)


PROMPT = "red red red red red red red red red red red red"


def test_repetition_penalty_changes_greedy_output_as_in_process(rt, client, server):
    def served(**extra):
        return client.completions.create(
            model=server.model_name,
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            extra_body=extra,
        ).choices[0]

    plain, penalised = served(), served(repetition_penalty=1.8)
    assert plain.text != penalised.text
    # the prompt's word is penalised: the plain model keeps repeating it, the penalised less
    assert plain.text.count("red") > penalised.text.count("red"), (plain.text, penalised.text)
    direct = rt.generate(
        GenerateRequest(
            PROMPT, SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.8)
        )
    )
    assert penalised.text == direct.text
    # chat takes it too; a penalty below 1 favours repeats
    chat = client.chat.completions.create(
        model=server.model_name,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=8,
        temperature=0,
        extra_body={"repetition_penalty": 0.5},
    )
    assert chat.choices[0].message.content


def _samples(server) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_metrics_histograms_count_a_streamed_and_a_plain_request(client, server):
    before = _samples(server)
    stream = client.chat.completions.create(
        model=server.model_name,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=6,
        temperature=0,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    r = client.completions.create(model=server.model_name, prompt="One, two,", max_tokens=5)
    after = _samples(server)

    def grew(name, by=1.0):
        assert after.get(name, 0.0) - before.get(name, 0.0) >= by, name

    for h in (
        "lmprog_time_to_first_token_seconds",
        "lmprog_time_per_output_token_seconds",
        "lmprog_e2e_request_latency_seconds",
        "lmprog_request_queue_time_seconds",
    ):
        grew(h + "_count", 2)
        assert after[h + '_bucket{le="+Inf"}'] == after[h + "_count"]
    grew('lmprog_http_requests_total{path="/v1/completions",status="200"}')
    grew('lmprog_http_requests_total{path="/v1/chat/completions",status="200"}')
    grew("lmprog_completion_tokens_total", r.usage.completion_tokens + 1)
    grew("lmprog_prompt_tokens_total", r.usage.prompt_tokens)
    assert "lmprog_cached_prompt_tokens_total" in after
    assert 0.0 <= after["lmprog_prefix_cache_hit_rate"] <= 1.0  # the engine's own
