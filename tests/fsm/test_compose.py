"""Constraints composed from parts (lmprog.fsm.compose): literal text around a schema's grammar,
beside a JSON answer that starts the same way, a marker beside free text."""

import pytest

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm import compose as c
from lmprog.fsm.regex import compile_user_regex, raw

ARGS = Constraint.from_json_schema(
    {"type": "object", "properties": {"city": {"type": "string"}}}, strict=False
)
ANSWER = Constraint.from_json_schema(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name"],
        "additionalProperties": False,
    }
)


def call(name: str):
    head = c.json_text('{"name": "' + name + '", "arguments": ')
    return c.seq(head, c.embed(ARGS), c.json_text("}"))


def test_a_call_beside_a_json_answer_that_starts_like_it():
    both = c.constraint(c.choice(call("f"), call("g"), c.embed(ANSWER)), "calls or answer")
    assert both.kind == "ebnf" and both.source == both.lark
    assert both.matches('{"name": "f", "arguments": {"city": "Oslo", "x": [1, {"y": 2}]}}')
    assert both.matches('{"name": "g", "arguments": {}}')
    assert both.matches('{"name": "f"}') and both.matches('{"name": "fg", "age": 3}')
    assert both.matches('{ "name": "h"}')  # the answer's own whitespace
    assert not both.matches('{"name": "f", "arguments": 1}')  # neither a call nor an answer
    assert not both.matches('{"name": "f", "arguments": {"city": 1}}')
    assert not both.matches('{"name": 1}')


def test_a_marker_beside_free_text_and_repeated_calls():
    free = c.regex(raw(compile_user_regex(r"[^<][\s\S]*")))
    marked = c.seq(c.text("<tool_call>\n"), call("f"), c.text("\n</tool_call>"))
    calls = c.seq(marked, c.rep(c.seq(c.json_text("\n"), marked), 0, 1))
    either = c.constraint(c.choice(calls, free), "calls or text")
    one = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert either.matches(one) and either.matches(one + "\n" + one)
    assert not either.matches(one + "\n" + one + "\n" + one)
    assert either.matches("hello <tool_call>") and not either.matches("<tool_call>\nhi")


def test_equal_parts_give_equal_grammars_and_grammars_do_not_embed():
    first = c.constraint(c.choice(call("f"), c.embed(ANSWER)), "x")
    assert first.lark == c.constraint(c.choice(call("f"), c.embed(ANSWER)), "x").lark
    assert c.constraint(c.seq(c.embed(Constraint.from_regex("[0-9]+")), c.text("!")), "n").matches(
        "12!"
    )
    with pytest.raises(ConstraintError, match="ebnf grammar cannot be combined"):
        c.embed(Constraint.from_ebnf('root ::= "a"'))


def test_a_schema_with_parametric_rules_embeds():
    tags = Constraint.from_json_schema(
        {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True}
    )
    both = c.constraint(c.seq(c.embed(tags), c.text(" and "), c.embed(tags)), "two lists")
    assert both.matches('["a", "b"] and ["b"]') and not both.matches('["a", "a"] and []')
