import dataclasses

import pytest

import lmprog as lp
from lmprog.core.sampling import SamplingParams
from lmprog.lang import ir


def test_flatten_accepts_text_numbers_and_expressions():
    assert ir.flatten("hi") == (ir.Text("hi"),)
    assert ir.flatten("") == ()
    assert ir.flatten(3) == (ir.Text("3"),)
    assert ir.flatten(2.5) == (ir.Text("2.5"),)
    g = lp.gen("a")
    assert ir.flatten(g) == (g,)


@pytest.mark.parametrize("bad", [None, True, [1], {"a": 1}, b"bytes", object()])
def test_flatten_rejects_other_types(bad):
    with pytest.raises(TypeError, match="cannot append"):
        ir.flatten(bad)


def test_flatten_none_hints_at_missing_return():
    with pytest.raises(TypeError, match="None"):
        ir.flatten(None)


def test_concatenation_is_flat_and_ordered():
    expr = "Q: " + lp.gen("a", max_tokens=3) + "\n" + (lp.select("b", ["x", "y"]) + "!")
    kinds = [type(n).__name__ for n in ir.flatten(expr)]
    assert kinds == ["Text", "Gen", "Text", "Select", "Text"]
    assert not any(isinstance(n, ir.Concat) for n in expr.parts)


def test_nodes_are_frozen():
    node = lp.gen("a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.name = "b"


def test_gen_merges_only_its_own_arguments_over_defaults():
    defaults = SamplingParams(temperature=0.0, max_tokens=7, top_k=5)
    params = lp.gen("a", max_tokens=3, stop="\n").sampling_params(defaults)
    assert (params.temperature, params.max_tokens, params.top_k, params.stop) == (
        0.0,
        3,
        5,
        ("\n",),
    )
    assert lp.gen("b").sampling_params(defaults) is defaults


def test_describe_is_readable():
    assert ir.Text("hello").describe() == "Text('hello')"
    assert "max_tokens=4" in lp.gen("x", max_tokens=4).describe()
    assert ir.Image(b"1234").describe() == "Image(<4 bytes>)"
