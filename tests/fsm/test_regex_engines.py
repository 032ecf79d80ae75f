"""Emitted patterns mean the same in Python ``re`` (``Constraint.matches``) and in the token
engine (llguidance's Rust regex lexer behind TokenIndex), walked here with a
one-character-per-token vocabulary."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmprog.fsm import Constraint
from lmprog.fsm.index import TokenIndex
from lmprog.fsm.vocab import TokenVocab

CHARS = [chr(c) for c in range(32, 127)] + ["é", "\n", "\t", "😀"]
TOKEN = {c: i for i, c in enumerate(CHARS)}

CONSTRAINTS = {
    "object": Constraint.from_json_schema(
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 5},
                "n": {"type": "number", "minimum": -1.5, "maximum": 20},
            },
            "required": ["name"],
            "additionalProperties": {"type": "boolean"},
        }
    ),
    "array": Constraint.from_json_schema(
        {"type": "array", "items": {"enum": ['a"b', 1, None, {"k": [True]}]}, "maxItems": 3}
    ),
    "strings": Constraint.from_json_schema(
        {
            "type": "array",
            "prefixItems": [
                {"type": "string", "format": "date-time"},
                {"type": "string", "pattern": "^[a-z]+\\.$"},
                {"not": {"enum": ["x", "xy"]}, "type": "string"},
            ],
            "items": False,
        }
    ),
    "regex": Constraint.from_regex(r"(\w+\s?){1,3}[.!?]"),
    "dtype_str": Constraint.from_dtype(str),
}


@pytest.fixture(scope="module")
def indexes():
    vocab = TokenVocab((*(c.encode() for c in CHARS), None), eos_token_id=len(CHARS))
    return {name: TokenIndex.get(c, vocab) for name, c in CONSTRAINTS.items()}


def _walk(index, text: str) -> bool:
    guide = index.new_guide()
    for ch in text:
        if not guide.is_allowed(TOKEN[ch]):
            return False
        guide.advance(TOKEN[ch])
    return guide.can_stop()


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
def test_python_and_the_token_engine_agree(name, indexes):
    c, index = CONSTRAINTS[name], indexes[name]
    texts = st.from_regex(c.pattern, fullmatch=True).filter(lambda t: all(ch in TOKEN for ch in t))
    edit = st.tuples(st.integers(0, 40), st.sampled_from(CHARS[:95] + [""]))

    @settings(
        max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(texts, edit)
    def check(text, change):
        at, ch = change
        at = min(at, len(text))
        for candidate in (text, text[:at] + ch + text[at + 1 :]):
            assert c.matches(candidate) == _walk(index, candidate), json.dumps(candidate)

    check()
