"""EBNF grammars (GBNF dialect): checked against reference recognizers written here, at the
text level (Constraint.matches) and through the tokens of a toy tokenizer; errors at compile
time for malformed grammars and empty languages."""

from __future__ import annotations

import random

import pytest
from fsm_toys import byte_level_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.index import TokenIndex

ARITH = r"""
# integer arithmetic with + - * and parentheses
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor ("*" factor)*
factor ::= [0-9]+ | "(" expr ")"
"""
DYCK = 'root ::= ("(" root ")")*\n'  # balanced parentheses, any depth


def arith_reference(text: str) -> bool:
    """A recursive-descent recognizer of ARITH's language."""
    pos = 0

    def factor() -> bool:
        nonlocal pos
        if pos < len(text) and text[pos].isdigit() and text[pos].isascii():
            while pos < len(text) and text[pos].isdigit() and text[pos].isascii():
                pos += 1
            return True
        if pos < len(text) and text[pos] == "(":
            pos += 1
            if not expr() or pos >= len(text) or text[pos] != ")":
                return False
            pos += 1
            return True
        return False

    def term() -> bool:
        nonlocal pos
        if not factor():
            return False
        while pos < len(text) and text[pos] == "*":
            pos += 1
            if not factor():
                return False
        return True

    def expr() -> bool:
        nonlocal pos
        if not term():
            return False
        while pos < len(text) and text[pos] in "+-":
            pos += 1
            if not term():
                return False
        return True

    return expr() and pos == len(text)


def dyck_reference(text: str) -> bool:
    depth = 0
    for ch in text:
        if ch not in "()":
            return False
        depth += 1 if ch == "(" else -1
        if depth < 0:
            return False
    return depth == 0


def random_arith(rng: random.Random, depth: int = 0) -> str:
    if depth > 4 or rng.random() < 0.4:
        return str(rng.randrange(1000))
    parts = [random_arith(rng, depth + 1) for _ in range(rng.randint(1, 3))]
    text = "".join(p + rng.choice("+-*") for p in parts[:-1]) + parts[-1]
    return f"({text})" if rng.random() < 0.5 else text


def mutations(text: str, rng: random.Random) -> list[str]:
    out = [text]
    for _ in range(6):
        i = rng.randrange(len(text) + 1)
        op = rng.randrange(3)
        if op == 0:
            out.append(text[:i] + rng.choice("()+-*09x ") + text[i:])
        elif op == 1 and text:
            out.append(text[:i] + text[i + 1 :])
        else:
            out.append(text[:i])
    return out


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_arithmetic_agrees_with_the_reference(seed):
    c, rng = Constraint.from_ebnf(ARITH), random.Random(seed)
    for text in mutations(random_arith(rng), rng):
        assert c.matches(text) == arith_reference(text), text


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet="()", max_size=40))
def test_balanced_parentheses_agree_with_the_reference(text):
    assert Constraint.from_ebnf(DYCK).matches(text) == dyck_reference(text)


def test_recursion_has_no_depth_limit():
    c = Constraint.from_ebnf(DYCK)
    assert c.matches("(" * 500 + ")" * 500)
    assert not c.matches("(" * 500 + ")" * 499)
    assert Constraint.from_ebnf(ARITH).matches("(" * 200 + "1" + ")" * 200)


def test_through_the_tokens_of_a_tokenizer():
    tok = byte_level_tokenizer()
    index = TokenIndex.get(Constraint.from_ebnf(ARITH), tok)
    rng = random.Random(0)
    for _ in range(20):
        text = random_arith(rng)
        guide = index.new_guide()
        guide.advance_all(tok.encode(text, add_special_tokens=False))
        assert guide.can_stop() and guide.is_allowed(index.eos_token_id)
    guide = index.new_guide()
    guide.advance_all(tok.encode("(1+", add_special_tokens=False))
    assert not guide.can_stop()
    allowed = {index.vocab.token_bytes[t] for t in guide.allowed_token_ids().tolist()}
    assert b"(" in allowed and b"7" in allowed and b")" not in allowed and b"+" not in allowed


def test_a_lark_grammar_is_taken_as_it_is():
    c = Constraint.from_ebnf('start: "a"+ "b"\n')
    assert c.matches("aab") and not c.matches("b")


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        ('root ::= "a" root\n', "can never finish"),
        ('root ::= x\nx ::= x "a" | "b" x\n', "can never finish"),
        ("root ::= foo\n", "'foo' is used in 'root' but never defined"),
        ('item ::= "a"\n', "no `root` rule"),
        ('root ::= "a\n', "line 2"),
        ("root ::= [a-\n", "invalid EBNF grammar"),
        ("", "empty"),
        ('start: "a" b\n', "unknown name"),
    ],
)
def test_bad_grammars_are_refused_at_compile_time(grammar, message):
    with pytest.raises(ConstraintError, match=message):
        Constraint.from_ebnf(grammar)


def test_gen_takes_ebnf():
    import lmprog as lp

    with pytest.raises(ValueError, match="at most one"):
        lp.gen("x", regex="a", ebnf=ARITH)
    with pytest.raises(TypeError, match="ebnf must be a str"):
        lp.gen("x", ebnf=5)
    with pytest.raises(ConstraintError, match="never finish"):
        lp.gen("x", ebnf='root ::= "a" root')
