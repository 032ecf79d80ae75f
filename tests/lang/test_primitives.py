import pytest

import lmprog as lp
from lmprog.lang import ir


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"max_tokens": "5"}, TypeError),
        ({"max_tokens": -1}, ValueError),
        ({"max_tokens": 2, "min_tokens": 5}, ValueError),
        ({"temperature": -0.5}, ValueError),
        ({"temperature": "hot"}, TypeError),
        ({"top_p": 0.0}, ValueError),
        ({"top_k": 0}, ValueError),
        ({"stop": [1]}, TypeError),
        ({"stop_token_ids": ["x"]}, TypeError),
        ({"ignore_eos": 1}, TypeError),
        ({"top_logprobs_num": 50}, ValueError),
        ({"regex": "a", "dtype": int}, ValueError),
        ({"choices": ["a"], "regex": "a"}, ValueError),
        ({"dtype": list}, TypeError),
        ({"regex": 5}, TypeError),
    ],
)
def test_gen_rejects_bad_arguments_at_the_call(kwargs, error):
    with pytest.raises(error):
        lp.gen("x", **kwargs)


@pytest.mark.parametrize("name", [3, "", b"x"])
def test_gen_name_must_be_a_str(name):
    with pytest.raises(TypeError, match="name"):
        lp.gen(name)


def test_gen_keeps_only_explicit_arguments_normalised():
    node = lp.gen("x", stop="\n", temperature=0)
    assert node.overrides == (("stop", ("\n",)), ("temperature", 0))
    # min_tokens alone is fine: max_tokens may come from run()'s defaults.
    assert lp.gen("y", min_tokens=500).overrides == (("min_tokens", 500),)


def test_gen_with_choices_is_a_select():
    node = lp.gen("c", choices=["a", "b"], temperature=0)
    assert isinstance(node, ir.Select)
    assert node.choices == ("a", "b") and node.method is lp.token_length_normalized


@pytest.mark.parametrize(
    "choices, error",
    [
        ([], ValueError),
        (["a", "a"], ValueError),
        (["a", ""], ValueError),
        (["a", 1], TypeError),
        ("ab", TypeError),
        (None, TypeError),
        (5, TypeError),
    ],
)
def test_select_rejects_bad_choices(choices, error):
    with pytest.raises(error):
        lp.select("x", choices)


def test_select_rejects_unknown_method():
    with pytest.raises(TypeError, match="choices_method"):
        lp.select("x", ["a", "b"], choices_method="greedy")
    node = lp.select("x", ("a", "b"), choices_method=lp.greedy_token_selection)
    assert node.method is lp.greedy_token_selection


def test_role_functions_wrap_their_content():
    assert ir.flatten(lp.user("hi")) == (ir.RoleBegin("user"), ir.Text("hi"), ir.RoleEnd("user"))
    assert ir.flatten(lp.system()) == (ir.RoleBegin("system"), ir.RoleEnd("system"))
    inner = ir.flatten(lp.assistant(lp.gen("a") + "."))
    assert [type(n) for n in inner] == [ir.RoleBegin, ir.Gen, ir.Text, ir.RoleEnd]
    assert (lp.user_begin(), lp.user_end()) == (ir.RoleBegin("user"), ir.RoleEnd("user"))
    assert (lp.system_begin(), lp.assistant_end()) == (
        ir.RoleBegin("system"),
        ir.RoleEnd("assistant"),
    )


def test_role_content_is_type_checked():
    with pytest.raises(TypeError):
        lp.user([1, 2])


def test_image_validates_its_source(tmp_path):
    assert lp.image(b"\x89PNG").source == b"\x89PNG"
    path = tmp_path / "a.png"
    path.write_bytes(b"\x89PNG")
    assert lp.image(path).source == str(path)
    with pytest.raises(FileNotFoundError):
        lp.image(tmp_path / "missing.png")
    with pytest.raises(TypeError):
        lp.image(42)
    with pytest.raises(ValueError):
        lp.image(b"")


def _fsm_constraint():
    try:
        from lmprog.fsm import Constraint
    except ImportError:
        return None
    return Constraint


def test_constrained_gen_builds_a_constraint_or_says_why_not():
    Constraint = _fsm_constraint()
    if Constraint is None:
        with pytest.raises(lp.ConstraintError, match="lmprog.fsm"):
            lp.gen("n", regex=r"\d+")
        return
    node = lp.gen("n", regex=r"\d+")
    assert isinstance(node.constraint, Constraint) and node.constraint.matches("42")
    assert not node.constraint.matches("4a")
    typed = lp.gen("b", dtype=bool)
    assert typed.constraint.parse("True") is True and not typed.constraint.matches("true")
