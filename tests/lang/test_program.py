import pytest

import lmprog as lp


def test_decorating_checks_the_state_parameter():
    def no_params():
        pass

    def keyword_state(*, s):
        pass

    def star_args(*args):
        pass

    async def coroutine(s):
        pass

    for bad in (no_params, keyword_state, star_args):
        with pytest.raises(TypeError, match="state first"):
            lp.function(bad)
    with pytest.raises(TypeError, match="async"):
        lp.function(coroutine)
    with pytest.raises(TypeError):
        lp.function(42)


def test_num_api_spec_tokens_is_kept():
    @lp.function(num_api_spec_tokens=64)
    def f(s):
        pass

    assert f.num_api_spec_tokens == 64 and f.__name__ == "f"
    assert lp.function(lambda s: None).num_api_spec_tokens is None
    with pytest.raises(ValueError):
        lp.function(num_api_spec_tokens=0)(lambda s: None)


@lp.function
def prog(s, question, temperature_hint="low", *, style="short"):
    pass


def test_keywords_split_into_arguments_and_sampling_defaults():
    call = prog.prepare_call(("Q",), {"style": "long", "temperature": 0, "max_tokens": 9})
    assert call.args == ("Q",) and call.kwargs == {"style": "long"}
    assert (call.defaults.temperature, call.defaults.max_tokens) == (0, 9)


def test_unknown_keywords_list_the_parameters():
    with pytest.raises(TypeError) as info:
        prog.prepare_call((), {"question": "q", "tempreature": 0})
    assert "tempreature" in str(info.value) and "['question', 'temperature_hint', 'style']" in str(
        info.value
    )


def test_missing_or_duplicated_arguments_raise_type_error():
    with pytest.raises(TypeError, match="question"):
        prog.prepare_call((), {})
    with pytest.raises(TypeError, match="multiple values"):
        prog.prepare_call(("a",), {"question": "b"})


def test_bad_sampling_defaults_raise_at_the_call():
    with pytest.raises(ValueError, match="temperature"):
        prog.prepare_call(("q",), {"temperature": -1})


def test_a_parameter_named_like_a_sampling_field_is_an_argument():
    @lp.function
    def f(s, temperature):
        pass

    call = f.prepare_call((), {"temperature": "warm"})
    assert call.kwargs == {"temperature": "warm"} and call.defaults.temperature == 1.0


def test_bind_fixes_arguments():
    bound = prog.bind(question="fixed")
    assert isinstance(bound, type(prog)) and bound is not prog
    assert bound.prepare_call((), {}).kwargs == {"question": "fixed"}
    assert bound.prepare_call((), {"question": "other"}).kwargs == {"question": "other"}
    with pytest.raises(TypeError, match="unknown argument"):
        prog.bind(nope=1)


def test_a_plain_program_called_without_a_state_asks_for_one():
    from lmprog.lang import Program

    prog = Program(lambda s, x: None)
    with pytest.raises(TypeError, match=r"needs a state as its first argument.*got str"):
        prog("not a state")
