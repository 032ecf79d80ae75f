"""lp.separate_reasoning on a model whose reasoning markers are special tokens (gpt-oss's
harmony markers): a tiny random-weight Llama over the default model's tokenizer with
`<|channel|>`, `<|message|>`, `<|end|>`, `<|start|>` added as special tokens, through
lp.Runtime on the CPU. The DSL's constraint takes the markers as their ids (as the server's
does), and the gen's text keeps them (skip_special_tokens off for the gen) so that it splits
into the thinking and the answer; the tokenizer's EOS never shows in the text."""

from __future__ import annotations

import pytest
from hf_tiny import default_hf_tokenizer, save_tiny_llama

import lmprog as lp
from lmprog.core.protocol import GenerateRequest
from lmprog.core.reasoning import FORMATS
from lmprog.core.sampling import SamplingParams
from lmprog.fsm import Constraint
from lmprog.lang.reasoning import Reasoning

pytestmark = pytest.mark.e2e

HARMONY = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>")
GPT_OSS = FORMATS["gpt-oss"]


@pytest.fixture(scope="module")
def harmony_rt(tmp_path_factory):
    tok = default_hf_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(HARMONY)})
    folder = save_tiny_llama(tmp_path_factory.mktemp("tiny-harmony"), tok)
    rt = lp.Runtime(model=str(folder), device="cpu", max_total_tokens=2048)
    yield rt
    rt.shutdown()


def _ids(rt, names):
    return [rt.tokenizer.convert_tokens_to_ids(n) for n in names]


def test_the_sdk_constraint_takes_the_markers_as_their_ids(harmony_rt):
    specials = Reasoning.specials(GPT_OSS, harmony_rt.tokenizer)
    assert set(specials) == set(HARMONY)
    assert Reasoning.specials(GPT_OSS, None) == {}  # no tokenizer (an endpoint): text
    whole = Reasoning.constrain(Constraint.from_regex("yes|no"), GPT_OSS, "none", specials)
    assert whole.matches("<|channel|>analysis<|message|>hm<|end|><|start|>assistant"
                         "<|channel|>final<|message|>yes")  # fmt: skip
    prompt = harmony_rt.chat_template.role_prefix("assistant")
    params = SamplingParams(max_tokens=6, temperature=0, skip_special_tokens=False)
    out = harmony_rt.generate(GenerateRequest(prompt, params, whole))
    channel, message = _ids(harmony_rt, ("<|channel|>", "<|message|>"))
    assert out.token_ids[0] == channel  # by id, as gpt-oss writes it, not "<" spelled
    assert message in out.token_ids[:6]
    assert out.text.startswith("<|channel|>analysis<|message|>")


@lp.function
def ask(s, budget=None):
    s += lp.user("Yes or no?")
    gen = lp.gen("answer", max_tokens=12, regex="yes|no", temperature=0)
    s += lp.assistant(lp.separate_reasoning(gen, "gpt-oss", thinking_budget=budget))


def test_a_gen_keeps_the_markers_and_splits(harmony_rt):
    state = ask.run(backend=harmony_rt)  # cut by max_tokens inside the thinking
    assert state["answer_reasoning_content"]  # the header's markers were read
    assert state["answer"] == ""
    assert "<|channel|>" not in state.text() and "analysis" not in state.text()


def test_a_budget_then_the_answer_under_its_special_header(harmony_rt):
    state = ask.run(backend=harmony_rt, budget=3)
    assert state["answer"] in ("yes", "no")  # the final channel's header split off
    assert state["answer_reasoning_content"] is not None
    eos = harmony_rt.tokenizer.eos_token
    assert eos not in state["answer"] and eos not in state["answer_reasoning_content"]
    assert state.text().rstrip().endswith(state["answer"] + eos)  # the template's own EOS


def test_the_native_generate_takes_the_markers_as_ids_and_keeps_them(harmony_rt):
    """SGLang's /generate with separate_reasoning: the same constraint, the same text."""
    import json
    import urllib.request

    from lmprog.serve import Server

    prompt = harmony_rt.chat_template.role_prefix("assistant")
    body = {
        "text": prompt,
        "separate_reasoning": True,
        "sampling_params": {"regex": "yes|no", "max_new_tokens": 6, "temperature": 0},
    }
    with Server(harmony_rt, model_name="m", reasoning_parser="gpt-oss").start() as srv:
        req = urllib.request.Request(srv.url + "/generate", json.dumps(body).encode())
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.loads(r.read())
    assert out["reasoning_content"] and out["text"] == ""  # cut inside the thinking, split
    channel = harmony_rt.tokenizer.convert_tokens_to_ids("<|channel|>")
    assert out["output_ids"][0] == channel


def test_through_a_runtime_endpoint(harmony_rt):
    """The DSL over RuntimeEndpoint (SGLang's /generate) with the model's tokenizer here: the
    markers by name in the grammar sent, skip_special_tokens=False sent."""
    from lmprog.backends.sglang_endpoint import sampling_fields
    from lmprog.serve import Server

    assert (
        sampling_fields(SamplingParams(skip_special_tokens=False), None)["skip_special_tokens"]
        is False
    )
    assert "skip_special_tokens" not in sampling_fields(SamplingParams(), None)
    with Server(harmony_rt, model_name="m", reasoning_parser="gpt-oss").start() as srv:
        endpoint = lp.RuntimeEndpoint(srv.url, tokenizer=harmony_rt.tokenizer)
        state = ask.run(backend=endpoint, budget=3)
    assert state["answer"] in ("yes", "no")
    assert state["answer_reasoning_content"] is not None
