"""API speculative execution (`num_api_spec_tokens`) without a server.

`CopyEndpoint` is a toy endpoint whose "model" is autoregressive and greedy: the next
character follows the last few characters of the text wherever they first occur in a
fixed document (end of sequence where they do not). One character is one token. A
program whose constant text follows the document can be served by one speculative call;
any program must give the same values with and without speculation.
"""

from __future__ import annotations

import threading

import pytest

import lmprog as lp
from lmprog.core.chat import ChatTemplate
from lmprog.core.errors import BackendError
from lmprog.core.protocol import (
    Backend,
    GenerateRequest,
    GenerateResult,
    ScoreRequest,
    TokenLogprob,
)
from lmprog.core.sampling import SamplingParams
from lmprog.interpreter.api_spec import Surplus, eligible, sampling_key

DOC = (
    "Name: Ada Lovelace\nBorn: 1815\nJob: mathematician\n\n"
    "Name: Alan Turing\nBorn: 1912\nJob: computer scientist\n\n"
)
ORDER = 8  # characters of context the toy model looks at


def next_char(text: str, doc: str = DOC) -> str | None:
    """The toy model's greedy next token (None: end of sequence)."""
    for k in range(min(ORDER, len(text)), 0, -1):
        at = doc.find(text[-k:])
        if at >= 0 and at + k < len(doc):
            return doc[at + k]
    return None


class CopyEndpoint(Backend):
    """A toy endpoint: every generate is one "API call" (counted)."""

    def __init__(self, mode: str | None = "text", chat_only: bool = False, doc: str = DOC) -> None:
        self.mode = mode
        self.doc = doc
        self.chat_only = chat_only  # refuse to continue a partly written assistant message
        self.calls: list[GenerateRequest] = []
        self._lock = threading.Lock()

    @property
    def api_speculation(self):  # type: ignore[override]
        return self.mode

    def generate(self, request: GenerateRequest, stream=None) -> GenerateResult:
        with self._lock:
            self.calls.append(request)
        prompt, p = request.prompt, request.params
        assert isinstance(prompt, str)
        if (
            self.chat_only
            and not prompt.endswith("<|im_start|>assistant\n")
            and "<|im_start|>" in prompt
        ):
            raise BackendError("cannot continue a partly written assistant message")
        out, finish, matched = "", "length", None
        for _ in range(p.max_tokens):
            ch = next_char(prompt + out, self.doc)
            if ch is None:
                finish = "stop"
                break
            out += ch
            hit = (
                min((out.find(s), s) for s in p.stop if s in out)
                if any(s in out for s in p.stop)
                else None
            )
            if hit is not None:
                out, finish, matched = out[: hit[0]], "stop", hit[1]
                break
        logprobs = None
        if p.return_logprob:
            logprobs = tuple(TokenLogprob(ord(c), c, -0.1) for c in out)
            if finish == "stop" and matched is None:
                logprobs += (TokenLogprob(0, "", -0.1),)  # the end-of-sequence token
        return GenerateResult(
            out, (), finish, len(prompt), len(out), matched_stop=matched, logprobs=logprobs
        )

    def score(self, request: ScoreRequest):
        raise AssertionError("not used")

    @property
    def chat_template(self) -> ChatTemplate:
        return ChatTemplate("chatml")

    @property
    def tokenizer(self):
        raise AssertionError("not used")


def card(s, first="Name:", second="\nBorn:", third="\nJob:"):
    s += first + lp.gen("name", stop="\n", max_tokens=24)
    s += second + lp.gen("born", stop="\n", max_tokens=24)
    s += third + lp.gen("job", stop="\n", max_tokens=24)


def run_both(program, n_spec=48, mode="text", doc=DOC, **kwargs):
    """(state, calls) without and with speculation."""
    plain_backend, spec_backend = CopyEndpoint(mode, doc=doc), CopyEndpoint(mode, doc=doc)
    plain = lp.function(program).run(backend=plain_backend, temperature=0, **kwargs)
    spec = lp.function(num_api_spec_tokens=n_spec)(program).run(
        backend=spec_backend, temperature=0, **kwargs
    )
    return plain, spec, len(plain_backend.calls), len(spec_backend.calls)


def values(state, names=("name", "born", "job")):
    return [state[n] for n in names]


# ---- end to end over the interpreter -------------------------------------------------------


def test_matching_text_is_served_from_one_call():
    plain, spec, plain_calls, spec_calls = run_both(card)
    assert values(plain) == [" Ada Lovelace", " 1815", " mathematician"]
    assert values(spec) == values(plain) and spec.text() == plain.text()
    assert (plain_calls, spec_calls) == (3, 1)
    assert spec.get_meta_info("born")["finish_reason"]["type"] == "stop"
    assert spec.get_meta_info("born")["matched_stop"] == "\n"


def test_mismatching_text_falls_back_to_real_calls_with_equal_results():
    plain, spec, plain_calls, spec_calls = run_both(card, second="\nAge:")
    assert values(spec) == values(plain) == [" Ada Lovelace", " Ada Lovelace", " mathematician"]
    # "\nAge:" is not in the surplus: that gen calls again, and so does the last one (after
    # "Age:" the model continues " Ada Lovelace\nBorn:", which "\nJob:" does not match)
    assert plain_calls == 3 and spec_calls == 3


def test_a_short_surplus_serves_what_it_covers_then_calls_again():
    plain, spec, _, spec_calls = run_both(card, n_spec=1)
    assert values(spec) == values(plain)
    # 25 tokens: " Ada Lovelace" + "\nBorn: 1815\nJo" -> born is served, "\nJob:" runs out
    assert spec_calls == 2


def test_max_tokens_is_counted_in_tokens_like_a_real_call():
    def prog(s):
        s += "Name:" + lp.gen("name", stop="\n", max_tokens=24)
        s += "\nBorn:" + lp.gen("born", max_tokens=3)  # no stop: exactly 3 tokens
        s += lp.gen("rest", stop="\n", max_tokens=24)

    plain, spec, _, spec_calls = run_both(prog)
    names = ("name", "born", "rest")
    assert values(spec, names) == values(plain, names) == [" Ada Lovelace", " 18", "15"]
    assert spec.get_meta_info("born")["finish_reason"]["type"] == "length" and spec_calls == 1


def test_end_of_sequence_in_the_surplus_is_final():
    def prog(s):
        s += "A:" + lp.gen("a", stop="Q", max_tokens=40)
        s += lp.gen("b", stop="Q", max_tokens=40)

    plain, spec, _, spec_calls = run_both(prog, doc="Q: 2+2?\nA: 4.")
    assert values(spec, "ab") == values(plain, "ab") == [" 4.", ""]
    assert spec.get_meta_info("a")["finish_reason"]["type"] == "stop" and spec_calls == 1


def test_ineligible_gens_make_ordinary_calls():
    def prog(s):
        s += "Name:" + lp.gen("name", stop="\n", max_tokens=24)
        s += "\nBorn:" + lp.gen("born", stop="\n", max_tokens=24, frequency_penalty=0.5)
        s += "\nJob:" + lp.gen("job", stop="\n", max_tokens=24, temperature=0.7, seed=1)

    plain, spec, _, spec_calls = run_both(prog)
    assert values(spec)[:2] == values(plain)[:2]
    assert spec_calls == 3  # the penalty gen is not eligible; the sampled one differs in key


def test_backends_without_api_speculation_ignore_it():
    backend = CopyEndpoint(mode=None)
    lp.function(num_api_spec_tokens=48)(card).run(backend=backend, temperature=0)
    assert len(backend.calls) == 3 and all(not r.params.return_logprob for r in backend.calls)


def test_message_mode_speculates_from_the_start_of_the_assistant_message():
    doc = "<|im_start|>assistant\nName: Ada Lovelace\nBorn: 1815\n<|im_end|>"

    def prog(s):
        s += lp.user("Tell me about Ada.")
        s += lp.assistant(
            "Name:"
            + lp.gen("name", stop="\n", max_tokens=24)
            + "\nBorn:"
            + lp.gen("born", stop="\n", max_tokens=24)
        )

    backend = CopyEndpoint(mode="message", chat_only=True, doc=doc)
    spec = lp.function(num_api_spec_tokens=32)(prog).run(backend=backend, temperature=0)
    assert [spec["name"], spec["born"]] == [" Ada Lovelace", " 1815"]
    assert len(backend.calls) == 1 and backend.calls[0].prompt.endswith("<|im_start|>assistant\n")
    with pytest.raises(BackendError, match="partly written"):
        lp.function(prog).run(
            backend=CopyEndpoint(mode="message", chat_only=True, doc=doc), temperature=0
        )


def test_streaming_runs_deliver_served_values_whole():
    backend = CopyEndpoint()
    state = lp.function(num_api_spec_tokens=48)(card).run(
        backend=backend, temperature=0, stream=True
    )
    assert "".join(state.text_iter()) == "Name: Ada Lovelace\nBorn: 1815\nJob: mathematician"
    assert len(backend.calls) == 1


# ---- the surplus on its own ----------------------------------------------------------------

KEY = sampling_key(SamplingParams(temperature=0))


def surplus(text, tokens=None, complete=False):
    tokens = tokens or list(text)
    ends, at = [], 0
    for t in tokens:
        at += len(t)
        ends.append(at)
    assert at == len(text)
    return Surplus(text, tuple(ends), complete, KEY)


def params(**kw):
    return SamplingParams(temperature=0, **kw)


def test_serve_cuts_at_the_stop_that_completes_first():
    s = surplus("abcXYd", tokens=["ab", "cX", "Y", "d"])
    result, rest = s.serve(params(stop=("cXY", "X"), max_tokens=10))
    assert (result.text, result.matched_stop, result.completion_tokens) == ("abc", "X", 2)
    assert rest.pos == 3


def test_serve_respects_max_tokens_and_token_boundaries():
    s = surplus("hello world", tokens=["hel", "lo", " wor", "ld"])
    result, rest = s.serve(params(max_tokens=2, stop=("rld",)))
    assert (result.text, result.finish_reason, rest.pos) == ("hello", "length", 5)
    assert rest.after_text(" w").serve(params(max_tokens=1)) is None  # mid-token: cannot count
    assert s.serve(params(max_tokens=9)) is None  # ran out before a stop or max_tokens


def test_complete_surplus_ends_a_gen_and_text_must_match_exactly():
    s = surplus("ok", complete=True)
    result, rest = s.serve(params(max_tokens=9, stop=("\n",)))
    assert (result.text, result.finish_reason) == ("ok", "stop")
    assert rest.after_text("!") is None and rest.after_text("") is not None


def test_from_result_cuts_where_token_strings_disagree_with_the_text():
    lp_ = lambda toks: tuple(TokenLogprob(-1, t, -1.0) for t in toks)
    good = GenerateResult("abc", (), "stop", 1, 3, logprobs=lp_(["a", "bc", "<|im_end|>"]))
    s = Surplus.from_result(good, KEY)
    assert (s.text, s.ends, s.complete) == ("abc", (1, 3), True)
    split = GenerateResult("aé!", (), "length", 1, 3, logprobs=lp_(["a", "\ufffd", "\ufffd!"]))
    s = Surplus.from_result(split, KEY)
    assert (s.text, s.ends, s.complete) == ("a", (1,), False)
    assert Surplus.from_result(GenerateResult("a", (), "stop", 1, 1), KEY) is None


def test_eligibility():
    assert eligible(params(stop=("\n",)), None)
    assert not eligible(params(), object())
    assert not eligible(params(return_logprob=True), None)
    assert not eligible(params(min_tokens=1), None)
    assert not eligible(params(stop_token_ids=(2,)), None)
