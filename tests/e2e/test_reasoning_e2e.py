"""Reasoning on the bundled model, on both backends: SmolLM2 driven by a ChatML template
whose generation prompt opens a <think> block (tests/data/chat_templates/chatml-think.jinja).
The model is no reasoning model, so it rambles: what is checked is the machinery. Under a
thinking budget every answer ends valid (the end marker forced after N tokens, the answer
under its constraint), the thinking holds at most N tokens; without one, every output that
ends is thinking, one end marker, and a valid answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import lmprog as lp
from lmprog.core.chat import ChatTemplate
from lmprog.core.protocol import Backend

pytestmark = pytest.mark.e2e

THINK = (
    Path(__file__).parent.parent / "data" / "chat_templates" / "chatml-think.jinja"
).read_text()
SCHEMA = {
    "type": "object",
    "properties": {"capital": {"enum": ["Paris", "Rome", "Madrid"]}, "sure": {"type": "boolean"}},
    "required": ["capital", "sure"],
    "additionalProperties": False,
}
QUESTIONS = ["France", "Italy", "Spain", "Europe's largest country"]


class Thinking(Backend):
    """The session's backend under the thinking template."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._template = ChatTemplate(THINK, eos_token="<|im_end|>")

    def generate(self, request, stream=None):
        return self.backend.generate(request, stream=stream)

    def score(self, request):
        return self.backend.score(request)

    def cache_prefix(self, prompt):
        return self.backend.cache_prefix(prompt)

    @property
    def chat_template(self) -> ChatTemplate:
        return self._template

    @property
    def tokenizer(self) -> Any:
        return self.backend.tokenizer


@lp.function
def capital(s, country, budget=None, temperature=0.7, seed=0):
    s += lp.user(f"What is the capital of {country}? Think first, then answer in JSON.")
    gen = lp.gen("answer", max_tokens=90, json_schema=SCHEMA, temperature=temperature, seed=seed)
    s += lp.assistant(lp.separate_reasoning(gen, thinking_budget=budget))


def test_budgeted_answers_are_all_valid(backend):
    model = Thinking(backend)
    budget = 24
    for seed, country in enumerate(QUESTIONS):
        state = capital.run(country=country, budget=budget, seed=seed, backend=model)
        thinking = state["answer_reasoning_content"]
        assert "</think>" not in thinking
        assert len(backend.tokenizer.encode(thinking, add_special_tokens=False)) <= budget + 2
        jsonschema.validate(json.loads(state["answer"]), SCHEMA)  # 0 invalid answers
        assert state.get_meta_info("answer")["finish_reason"]["type"] == "stop"


def test_unbudgeted_outputs_that_end_are_valid(backend):
    model = Thinking(backend)
    for seed, country in enumerate(QUESTIONS[:2]):
        state = capital.run(country=country, seed=seed, backend=model)
        meta = state.get_meta_info("answer")
        if meta["finish_reason"]["type"] != "stop":  # max_tokens inside the thinking or the answer
            assert meta["finish_reason"]["type"] == "length"
            continue
        jsonschema.validate(json.loads(state["answer"]), SCHEMA)


def test_a_regex_answer_after_free_thinking(backend):
    @lp.function
    def yes_no(s):
        s += lp.user("Is Paris in France? Think, then answer yes or no.")
        gen = lp.gen("answer", max_tokens=60, regex="(yes|no)", temperature=0)
        s += lp.assistant(lp.separate_reasoning(gen, thinking_budget=30))

    state = yes_no.run(backend=Thinking(backend))
    assert state["answer"] in ("yes", "no")
    assert state["answer_reasoning_content"]
    assert state.text().endswith(state["answer"] + "<|im_end|>\n")
