"""Fuzzing (issue 13): hypothesis-generated DSL arguments, regexes, JSON schemas and server
bodies get lmprog's errors (TypeError, ValueError, ConstraintError, 4xx with the OpenAI
error shape) or a result, never an internal error, a 500 or a hang. A fake backend stands in
for the model (the model is not what is tested), so each test takes a few seconds."""

from __future__ import annotations

import http.client
import json
import string
from urllib.parse import urlsplit

import pytest
from fakes import FakeBackend, within
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmprog as lp
from lmprog.core.errors import ConstraintError
from lmprog.core.prompt import Prompt, encode_prompt, mark_special, unmark

FAST = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
LMPROG_ERRORS = (TypeError, ValueError, ConstraintError)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
GEN_KEYS = [
    "max_tokens",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "ignore_eos",
    "seed",
    "return_logprob",
    "top_logprobs_num",
    "regex",
    "dtype",
    "choices",
]


@FAST
@given(st.dictionaries(st.sampled_from(GEN_KEYS), values, max_size=4))
def test_gen_arguments_are_accepted_or_refused_cleanly(kwargs):
    try:
        lp.gen("x", **kwargs)
    except LMPROG_ERRORS:
        pass


@FAST
@given(st.one_of(values, st.lists(st.text(max_size=5), max_size=6)))
def test_select_choices_are_accepted_or_refused_cleanly(choices):
    try:
        lp.select("x", choices=choices)
    except LMPROG_ERRORS:
        pass


regex_alphabet = st.sampled_from(list("ab01.*+?|()[]{}^$\\-,dws") + ["{2}", "{1,3}", "(?:", "\\d"])


@FAST
@given(st.lists(regex_alphabet, max_size=12).map("".join))
def test_regexes_compile_or_raise_constraint_error(pattern):
    try:
        lp.Constraint.from_regex(pattern)
    except LMPROG_ERRORS:
        pass


schemas = st.recursive(
    st.one_of(
        st.sampled_from(
            [
                {"type": "string"},
                {"type": "integer", "minimum": 0},
                {"type": "number"},
                {"type": "boolean"},
                {"type": "null"},
                {"enum": ["a", 1, None]},
                {"const": "x"},
                {"type": "string", "pattern": "[a-z]+"},
                {"type": "string", "maxLength": 3},
                {"type": "nonsense"},
                {"$ref": "#/nowhere"},
                {},
                True,
            ]
        ),
        values,
    ),
    lambda inner: st.one_of(
        st.builds(lambda i: {"type": "array", "items": i}, inner),
        st.builds(
            lambda p: {"type": "object", "properties": p, "required": sorted(p)[:1]},
            st.dictionaries(
                st.text(string.ascii_lowercase, min_size=1, max_size=4), inner, max_size=3
            ),
        ),
        st.builds(lambda a: {"anyOf": a}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=8,
)


@FAST
@given(schemas)
def test_json_schemas_compile_or_raise_constraint_error(schema):
    try:
        lp.Constraint.from_json_schema(schema)
    except LMPROG_ERRORS:
        pass


texts = st.lists(
    st.one_of(
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=6),
        st.sampled_from(
            ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "\U000f0000", "\U000f0001"]
        ),
    ),
    max_size=6,
).map("".join)


class MarkerTokenizer:
    """Characters as tokens, plus three special tokens (ids 0-2) recognised in any text."""

    SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    all_special_tokens = list(SPECIAL)

    def encode(self, text, add_special_tokens=False, split_special_tokens=False):
        out, i = [], 0
        while i < len(text):
            hit = next((s for s in self.SPECIAL if text.startswith(s, i)), None)
            if hit and not split_special_tokens:
                out.append(self.SPECIAL.index(hit))
                i += len(hit)
            else:
                out.append(1000 + ord(text[i]))
                i += 1
        return out


@FAST
@given(st.lists(st.tuples(st.booleans(), texts), max_size=6))
def test_only_control_spans_make_control_tokens(segments):
    text, control, n_control = "", [], 0
    tok = MarkerTokenizer()
    for is_control, piece in segments:
        if is_control:
            control.append((len(text), len(text) + len(piece)))
            n_control += sum(x < 1000 for x in tok.encode(piece))
        text += piece
    ids = encode_prompt(tok, Prompt(text, control))
    assert sum(x < 1000 for x in ids) <= n_control
    assert encode_prompt(tok, Prompt(text, [(0, len(text))])) == tok.encode(text)


@FAST
@given(st.lists(texts, max_size=4))
def test_marked_renders_unmark_to_the_plain_text(contents):
    tok = MarkerTokenizer()
    marked = mark_special(contents, tok)
    prompt = unmark("<|im_start|>" + "|".join(marked) + "<|im_end|>")
    clean = [c.replace("\U000f0000", "").replace("\U000f0001", "") for c in contents]
    assert str(prompt) == "<|im_start|>" + "|".join(clean) + "<|im_end|>"
    ids = encode_prompt(tok, prompt)
    assert ids[0] == 1 and ids[-1] == 2 and sum(x < 1000 for x in ids) == 2


@FAST
@given(texts, st.lists(st.sampled_from(GEN_KEYS[:14]), max_size=2), values)
def test_programs_run_or_fail_cleanly(text, keys, value):
    @lp.function
    def prog(s, t):
        s += lp.user(t)
        s += lp.assistant(lp.gen("a", max_tokens=4, **{k: value for k in keys}))

    try:
        state = prog.run(text, backend=FakeBackend())
    except LMPROG_ERRORS:
        return
    assert within(5, state.error) is None


# ---- server bodies -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def url():
    from lmprog.serve import Server

    with Server(FakeBackend(), model_name="fake", max_json_depth=16).start() as srv:
        yield srv.url


FIELDS = GEN_KEYS[:14] + ["n", "stream", "logprobs", "top_logprobs", "response_format", "tools"]
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system", "assistant", "tool", "bogus"]),
            "content": st.one_of(texts, values),
        }
    ),
    max_size=3,
)


def post(url, path, body):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(data)
    except ValueError:
        return resp.status, data


def _check(status, data):
    assert status < 500, (status, data)
    if status >= 400:
        assert isinstance(data, dict) and set(data["error"]) == {"message", "type", "param", "code"}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.dictionaries(st.sampled_from(FIELDS), values, max_size=3), messages)
def test_chat_bodies_are_answered_or_refused_with_a_4xx(url, fields, msgs):
    body = {"model": "fake", "messages": msgs, "max_tokens": 2, **fields}
    _check(*post(url, "/v1/chat/completions", json.dumps(body, allow_nan=True).encode()))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.dictionaries(st.sampled_from(FIELDS + ["prompt", "echo", "regex"]), values, max_size=4))
def test_completion_bodies_are_answered_or_refused_with_a_4xx(url, fields):
    body = {"model": "fake", "prompt": "Hi", "max_tokens": 2, **fields}
    _check(*post(url, "/v1/completions", json.dumps(body, allow_nan=True).encode()))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=200))
def test_raw_bytes_are_refused_with_a_4xx(url, raw):
    _check(*post(url, "/v1/chat/completions", raw))
