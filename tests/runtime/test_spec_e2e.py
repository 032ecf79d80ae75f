"""Speculative decoding on the default model (SmolLM2-135M, CPU): n-gram drafts on prompts
whose answer copies the input are mostly accepted, and outputs are those of plain decoding
(greedy, seeded sampling, a stop string, a JSON constraint)."""

from __future__ import annotations

import json

import pytest
import torch
from spec_testing import requires_default_model

import lmprog as lp
from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams as SP
from lmprog.fsm.constraint import Constraint

pytestmark = [pytest.mark.e2e, requires_default_model]

TEXT = (
    "Maria Lopez, a chemist from Valencia, joined the Northern Lights Institute in March 2019. "
    "Her colleague Tom Becker, an engineer from Hamburg, arrived two years later."
)


@pytest.fixture(scope="module")
def rt():
    torch.set_num_threads(1)
    runtime = lp.Runtime(
        device="cpu",
        max_total_tokens=4096,
        check_integrity=True,
        speculative={"method": "ngram", "num_tokens": 6},
    )
    yield runtime
    runtime.shutdown()


def prompt(rt, instruction):
    msgs = [{"role": "user", "content": f"{instruction}\n\n{TEXT}"}]
    return rt.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def both(rt, request):
    """(speculation off, speculation on) results of the same request."""
    out = []
    for on in (False, True):
        rt.engine.set_speculation(on)
        rt.flush_cache()
        out.append(rt.generate(request))
    return out


def test_copying_answers_are_identical_and_mostly_accepted(rt):
    p = prompt(rt, "Repeat the following text exactly.")
    before = rt.stats()
    off, on = both(rt, GenerateRequest(p, SP(max_tokens=48, temperature=0.0)))
    stats = rt.stats()
    assert on.token_ids == off.token_ids and on.text == off.text
    verified = stats["spec_verified_tokens"] - before["spec_verified_tokens"]
    accepted = stats["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    assert verified >= 10 and accepted / verified > 0.5, (accepted, verified)
    seeded = SP(max_tokens=24, temperature=0.7, seed=3)
    s_off, s_on = both(rt, GenerateRequest(p, seeded))
    assert s_on.token_ids == s_off.token_ids  # point-mass drafts: same RNG use as plain


def test_stop_string_inside_the_copied_span(rt):
    p = prompt(rt, "Repeat the following text exactly.")
    off, on = both(rt, GenerateRequest(p, SP(max_tokens=48, temperature=0.0, stop="Institute")))
    assert on.text == off.text and on.token_ids == off.token_ids
    assert on.finish_reason == "stop" and on.matched_stop == "Institute"
    assert "Institute" not in on.text


def test_json_extraction_under_a_constraint(rt):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
        "required": ["name", "city"],
        "additionalProperties": False,
    }
    c = Constraint.from_json_schema(schema)
    p = prompt(rt, "Give the chemist's name and city as JSON.")
    off, on = both(rt, GenerateRequest(p, SP(max_tokens=40, temperature=0.0), constraint=c))
    assert on.text == off.text and on.finish_reason == "stop"
    value = json.loads(on.text)
    assert set(value) == {"name", "city"}
    rt.engine.check_integrity()


RHYME = (
    "The cat sat on the mat. The cat sat on the hat. The cat sat on the bat. "
    "The dog ran to the park. The dog ran to the lake. The dog ran to the gate."
)


def test_ngram_token_trees_give_the_same_outputs(rt):
    """n-gram token trees (several continuations as siblings, ngram_branches=3): the greedy
    outputs of plain decoding, also under a JSON constraint (seeded sampling with trees:
    test_spec_tree.py)."""
    from lmprog.runtime.speculative.ngram import NgramProposer

    spec = rt.engine.speculator
    chain = spec.proposer
    rt.engine.call(lambda: spec.set_proposer(NgramProposer(2, 4, branches=3), "ngram-tree"))
    try:
        # repeated phrases with different endings: the suffix matches in several places
        msgs = [{"role": "user", "content": f"Repeat the following text exactly.\n\n{RHYME}"}]
        p = rt.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        before = rt.stats()
        off, on = both(rt, GenerateRequest(p, SP(max_tokens=40, temperature=0.0)))
        stats = rt.stats()
        assert on.token_ids == off.token_ids
        assert stats["spec_tree_verifies"] > before["spec_tree_verifies"]
        assert stats["spec_accepted_tokens"] - before["spec_accepted_tokens"] >= 10
        schema = {"type": "object", "properties": {"name": {"type": "string"}},
                  "required": ["name"], "additionalProperties": False}  # fmt: skip
        c = Constraint.from_json_schema(schema)
        q = prompt(rt, "Give the chemist's name as JSON.")
        off, on = both(rt, GenerateRequest(q, SP(max_tokens=40, temperature=0.0), constraint=c))
        assert on.text == off.text and on.finish_reason == off.finish_reason
        if on.finish_reason == "stop":
            assert set(json.loads(on.text)) == {"name"}
        rt.engine.check_integrity()
    finally:
        rt.engine.call(lambda: spec.set_proposer(chain, "ngram"))
