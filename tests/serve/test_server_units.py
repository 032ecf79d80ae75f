"""Pieces of the server without HTTP or a model: response formats, logprob layouts, echo
offsets, request -> SamplingParams, Prometheus text (tool calls: test_tools.py)."""

from __future__ import annotations

import pytest

from lmprog.core.protocol import GenerateResult, TokenLogprob, TopLogprob
from lmprog.serve.constraints import output_constraint
from lmprog.serve.errors import APIError
from lmprog.serve.limits import ServerLimits
from lmprog.serve.logprobs import chat_logprobs, completion_logprobs, visible_logprobs
from lmprog.serve.metrics import ServerMetrics
from lmprog.serve.prompt_echo import token_offsets
from lmprog.serve.sampling import choice_params, sampling_params
from lmprog.serve.schemas.chat import ChatCompletionRequest
from lmprog.serve.schemas.completions import ResponseFormat


def test_json_object_nests_to_any_depth():
    c = output_constraint(ResponseFormat(type="json_object"), None)
    assert c.matches('{"a": [1, 2], "b": {"c": "d"}}') and c.matches('{"a": {"b": [{"c": 1}]}}')
    assert c.matches('{"a": {"b": [{"c": [[{"d": [1]}]]}]}}')
    assert not c.matches('{"a": {"b": [{"c": [1}]}}') and not c.matches("[1]")
    assert output_constraint(ResponseFormat(type="text"), None) is None
    assert output_constraint(None, r"\d+").matches("123")
    with pytest.raises(APIError, match="at most one constraint"):
        output_constraint(ResponseFormat(type="json_object"), r"\d+")


def tok(i, text, lp, top=()):
    return TokenLogprob(i, text, lp, tuple(TopLogprob(j, t, v) for j, t, v in top))


def test_logprob_layouts():
    toks = (tok(5, "Hi", -0.5, [(5, "Hi", -0.5), (6, "Yo", -1.0)]), tok(7, "!", float("-inf")))
    chat = chat_logprobs(toks)["content"]
    assert [c["token"] for c in chat] == ["Hi", "!"] and chat[1][
        "logprob"
    ] == -9999.0  # JSON has no -inf
    assert chat[0]["top_logprobs"][1] == {"token": "Yo", "logprob": -1.0, "bytes": [89, 111]}
    comp = completion_logprobs(["A", "Hi", "!"], (None, *toks), [0, 1, 3], top=2)
    assert comp["token_logprobs"] == [None, -0.5, -9999.0] and comp["top_logprobs"][0] is None
    assert comp["top_logprobs"][1] == {"Hi": -0.5, "Yo": -1.0} and comp["text_offset"] == [0, 1, 3]
    assert completion_logprobs(["A"], [None], [0], top=0)["top_logprobs"] is None


def test_a_stop_token_is_not_in_the_visible_logprobs():
    toks = (tok(5, "Hi", -0.5), tok(2, "<|im_end|>", -0.1))
    ended = GenerateResult("Hi", (5, 2), "stop", 3, 2, matched_stop=2, logprobs=toks)
    assert visible_logprobs(ended) == toks[:1]
    by_string = GenerateResult("Hi", (5, 2), "stop", 3, 2, matched_stop="\n", logprobs=toks)
    assert visible_logprobs(by_string) == toks


class ByteTokenizer:
    """One token per UTF-8 byte: decoding a lone byte of 'é' gives a replacement character."""

    def decode(self, ids):
        return bytes(ids).decode(errors="replace")


def test_token_offsets_with_split_characters():
    ids = list("aé b".encode())
    text, pieces, offsets = token_offsets(ByteTokenizer(), ids)
    assert text == "aé b" and len(pieces) == len(ids) == 5
    assert offsets == [0, 1, 1, 2, 3]  # both bytes of é start inside it
    text, pieces, offsets = token_offsets(ByteTokenizer(), list(b"abc"))
    assert (text, pieces, offsets) == ("abc", ["a", "b", "c"], [0, 1, 2])


def chat_body(**fields):
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    )


def test_sampling_params_from_a_request():
    limits = ServerLimits(max_tokens=100)
    p = sampling_params(
        chat_body(
            temperature=0.5,
            top_p=0.9,
            stop="END",
            seed=7,
            top_k=40,
            min_p=0.1,
            presence_penalty=0.5,
            stop_token_ids=[3],
        ),
        limits,
        max_tokens=None,
        logprobs=2,
    )
    assert (p.temperature, p.top_p, p.stop, p.seed, p.top_k, p.min_p) == (
        0.5,
        0.9,
        ("END",),
        7,
        40,
        0.1,
    )
    assert (p.max_tokens, p.return_logprob, p.top_logprobs_num, p.stop_token_ids) == (
        100,
        True,
        2,
        (3,),
    )
    defaults = sampling_params(chat_body(), limits, max_tokens=10, logprobs=None)
    assert (defaults.temperature, defaults.return_logprob, defaults.seed) == (1.0, False, None)
    assert [q.seed for q in choice_params(p, 3)] == [7, 8, 9]
    assert choice_params(defaults, 2) == [defaults, defaults]
    with pytest.raises(APIError) as info:
        sampling_params(chat_body(), limits, max_tokens=101, logprobs=None)
    assert info.value.param == "max_tokens" and info.value.status == 400


def test_prometheus_text():
    stats = {
        "num_running": 2,
        "num_waiting": 1,
        "cache_hit_rate": 0.25,
        "requests_finished": {"stop": 3},
        "model": "x",
    }
    m = ServerMetrics(stats=lambda: stats)
    m.on_response("/v1/completions", 200, 0.5)
    m.on_usage(10, 4, 6)
    m.on_generation(
        arrival=0.0, submitted=0.5, started=1.0, first_piece=2.0, finished=5.0, completion_tokens=4
    )
    text = m.render().decode()
    lines = text.splitlines()
    assert 'lmprog_http_requests_total{path="/v1/completions",status="200"} 1.0' in lines
    assert "lmprog_requests_running 2.0" in lines and "lmprog_requests_queued 1.0" in lines
    assert "lmprog_prefix_cache_hit_rate 0.25" in lines
    assert "lmprog_completion_tokens_total 4.0" in lines
    assert "lmprog_prompt_tokens_total 10.0" in lines
    assert "lmprog_cached_prompt_tokens_total 6.0" in lines
    assert 'lmprog_engine_requests_finished_total{reason="stop"} 3.0' in lines
    # the histograms, each observation in its bucket: queue 0.5 s, TTFT 2 s, TPOT 1 s, e2e 5 s
    for name, value in (
        ("lmprog_request_queue_time_seconds", 0.5),
        ("lmprog_time_to_first_token_seconds", 2.0),
        ("lmprog_time_per_output_token_seconds", 1.0),
        ("lmprog_e2e_request_latency_seconds", 5.0),
    ):
        assert f"# TYPE {name} histogram" in lines
        assert f"{name}_count 1.0" in lines and f"{name}_sum {value}" in lines
        assert f'{name}_bucket{{le="+Inf"}} 1.0' in lines
    assert 'lmprog_http_request_duration_seconds_count{path="/v1/completions"} 1.0' in lines
    # two servers in one process count apart (a registry each)
    other = ServerMetrics().render().decode()
    assert "lmprog_prompt_tokens_total 0.0" in other and "lmprog_requests_running" not in other


def test_metrics_path_labels_name_the_route():
    from lmprog.serve.access import path_label

    assert path_label("/v1/responses") == "/v1/responses"
    assert path_label("/v1/responses/resp_123") == "/v1/responses/{response_id}"
    assert path_label("/v1/models/org/name") == "/v1/models/{model}"
    assert path_label("/v1/chat/completions") == "/v1/chat/completions"
    assert path_label("/v1/responses/a/b") == path_label("/nope") == "other"
