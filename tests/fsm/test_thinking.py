"""Constraints after a reasoning model's thinking (lmprog.fsm.thinking): free thinking, the
end marker, then the constrained answer, as one grammar. Through the token engine on a toy
byte-level vocabulary: random walks end valid (the answer matches, the thinking holds no end
marker), the end marker is reachable from every point of the thinking, its forced bytes are
the marker once its first byte is written, and any constraint kind composes (regex,
choices, JSON schema, EBNF, the server's tool-call grammars)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from fsm_toys import byte_level_tokenizer

from lmprog.core.errors import ConstraintError
from lmprog.core.reasoning import FORMATS
from lmprog.fsm import Constraint
from lmprog.fsm import compose as c
from lmprog.fsm.index import TokenIndex
from lmprog.fsm.thinking import after_thinking

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
    "required": ["a", "b"],
}
ANSWERS = {
    "regex": (Constraint.from_regex(r"[0-9]{1,3}"), lambda s: s.isdigit() and len(s) <= 3),
    "choices": (Constraint.from_choices(["yes", "no"]), lambda s: s in ("yes", "no")),
    "json": (
        Constraint.from_json_schema(SCHEMA),
        lambda s: jsonschema.Draft202012Validator(SCHEMA).is_valid(json.loads(s)),
    ),
    "ebnf": (
        Constraint.from_ebnf('root ::= "x" [0-9]+'),
        lambda s: s[:1] == "x" and s[1:].isdigit(),
    ),
}


@pytest.fixture(scope="module")
def tok():
    return byte_level_tokenizer()


def split(text: str, opened: bool):
    return FORMATS["qwen3"].split(text, "open" if opened else "none")


@pytest.mark.parametrize("kind", sorted(ANSWERS))
@pytest.mark.parametrize("opened", [True, False])
def test_whole_texts(kind, opened):
    answer, _ = ANSWERS[kind]
    whole = after_thinking(answer, start="<think>", end="</think>", opened=opened)
    good = {"regex": "12", "choices": "yes", "json": '{"a": 1, "b": "x"}', "ebnf": "x12"}[kind]
    think = "Hmm, a </thin or <think> is fine.\n</think>\n\n"
    assert whole.matches(("" if opened else "<think>\n") + think + good)
    assert not whole.matches(("" if opened else "<think>\n") + think + good + "!")
    assert not whole.matches("a </think> b </think>\n" + good)  # one end marker, then the answer
    assert whole.matches(good) is (not opened)  # the block is optional when the model opens it


@pytest.mark.parametrize("kind", sorted(ANSWERS))
def test_random_walks_end_valid_with_the_marker_reachable(tok, kind):
    """Random token walks through the composed guide: at every step of the thinking the end
    marker's tokens can be taken (and its forced bytes, once started, are the marker); every
    finished walk's answer matches its constraint."""
    answer, valid = ANSWERS[kind]
    index = TokenIndex.get(
        after_thinking(answer, start="<think>", end="</think>", opened=True), tok
    )
    rng = random.Random(7)
    end_ids = tok.encode("</think>")
    ascii_ids = {
        i for i in range(len(tok)) if tok.decode([i]).isascii() and i != index.eos_token_id
    }
    finished = 0
    for _ in range(60):
        guide, text = index.new_guide(), ""
        for _ in range(rng.randrange(0, 25)):  # some thinking: any allowed ASCII token
            ids = [t for t in guide.allowed_token_ids().tolist() if t in ascii_ids]
            t = rng.choice(ids)
            if "</think>" in text + tok.decode([t]):
                break
            probe = guide.copy()
            for e in end_ids:  # the end marker is reachable here
                assert probe.is_allowed(e), repr(text)
                probe.advance(e)
            guide.advance(t)
            text += tok.decode([t])
        if "</think>" in text:
            continue
        for e in end_ids[:1]:
            guide.advance(e)
        forced = guide.forced_bytes().decode()
        assert "</think>".startswith("<" + forced) or forced.startswith("/think>"), forced
        for e in tok.encode("</think>"[1:]):
            guide.advance(e)
        text += "</think>"
        for _ in range(200):  # the answer: random allowed tokens until EOS
            ids = guide.allowed_token_ids().tolist()
            if index.eos_token_id in ids and (rng.random() < 0.5 or ids == [index.eos_token_id]):
                break
            t = rng.choice([i for i in ids if i in ascii_ids] or ids)
            guide.advance(t)
            text += tok.decode([t])
        else:
            continue
        reasoning, said = split(text, True)
        assert "</think>" not in reasoning
        assert valid(said), repr(text)
        finished += 1
    assert finished > 20


def test_tool_calls_compose():
    args = Constraint.from_json_schema(
        {"type": "object", "properties": {"city": {"type": "string"}}}
    )
    call = c.seq(
        c.json_text('<tool_call>\n{"name": "f", "arguments": '),
        c.embed(args),
        c.json_text("}\n</tool_call>"),
    )
    calls = c.constraint(call, "tool calls")
    whole = after_thinking(calls, start="<think>", end="</think>", opened=True)
    assert whole.matches(
        'I will call f.</think>\n\n<tool_call>\n{"name": "f", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert not whole.matches('I will call f.</think>\n\n{"name": "f"}')


def test_a_format_without_an_end_marker_is_refused():
    with pytest.raises(ConstraintError, match="end marker"):
        after_thinking(Constraint.from_regex("a"), start="", end="", opened=True)
