"""A tiny random-weight Qwen3 (transformers' Qwen3ForCausalLM, 2 layers) with the Qwen3 chat
template as published (tests/data/chat_templates/qwen3.jinja) and the bundled model's
tokenizer (its ChatML markers are Qwen3's), through lp.Runtime and lmprog serve: the
template's block (the model may open it; enable_thinking false closes it), a thinking
budget then a JSON schema answer (valid, whatever the random weights say), the DSL's
separate_reasoning on the same runtime."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest
from hf_tiny import default_hf_tokenizer

import lmprog as lp
from lmprog.serve import Server

pytestmark = pytest.mark.e2e

QWEN3 = (Path(__file__).parent.parent / "data" / "chat_templates" / "qwen3.jinja").read_text()
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("tiny-qwen3")
    tok = default_hf_tokenizer()
    tok.chat_template = QWEN3
    config = transformers.Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    rt = lp.Runtime(model=str(folder), device="cpu", max_total_tokens=2048)
    yield rt
    rt.shutdown()


def test_tiny_qwen3_through_the_server(tiny_qwen3):
    assert "enable_thinking" in tiny_qwen3.chat_template.source
    with Server(tiny_qwen3, model_name="q").start() as srv:
        assert srv.reasoning is not None and srv.reasoning.name == "qwen3"
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        for seed in range(3):
            r = client.chat.completions.create(
                model="q",
                messages=[{"role": "user", "content": "A digit?"}],
                max_tokens=40,
                seed=seed,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "d", "schema": SCHEMA},
                },
                extra_body={"thinking_budget": 6},
            )
            message = r.choices[0].message
            jsonschema.validate(json.loads(message.content), SCHEMA)
            assert message.reasoning_content is not None
            assert r.usage.completion_tokens_details.reasoning_tokens <= 6 + 2
        off = client.chat.completions.create(
            model="q",
            messages=[{"role": "user", "content": "A digit?"}],
            max_tokens=12,
            response_format={"type": "json_schema", "json_schema": {"name": "d", "schema": SCHEMA}},
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        assert getattr(off.choices[0].message, "reasoning_content", None) is None
        jsonschema.validate(json.loads(off.choices[0].message.content), SCHEMA)
        # no budget: the block is optional, the answer after it valid when it ends
        free = client.chat.completions.create(
            model="q",
            messages=[{"role": "user", "content": "A digit?"}],
            max_tokens=30,
            temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "d", "schema": SCHEMA}},
        )
        if free.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(free.choices[0].message.content), SCHEMA)


def test_tiny_qwen3_in_the_dsl(tiny_qwen3):
    @lp.function
    def digit(s):
        s += lp.user("A digit?")
        s += lp.assistant(
            lp.separate_reasoning(
                lp.gen("d", max_tokens=30, json_schema=SCHEMA, temperature=0), thinking_budget=5
            )
        )

    state = digit.run(backend=tiny_qwen3)
    assert 0 <= state.parsed("d")["n"] <= 9
    assert isinstance(state["d_reasoning_content"], str)
