"""SamplingParams refuses what cannot be sampled, at the call that received it."""

import math

import pytest

import lmprog as lp
from lmprog.core.sampling import SamplingParams


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p", "presence_penalty"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_numbers_are_refused(name, value):
    with pytest.raises(ValueError, match=f"{name} must be a finite number"):
        SamplingParams(**{name: value})
    with pytest.raises(ValueError, match="finite"):
        lp.gen("x", **{name: value})


def test_finite_values_at_the_bounds_pass():
    params = SamplingParams(temperature=1e6, top_p=1.0, min_p=0.0, presence_penalty=-2.0)
    assert params.temperature == 1e6


def test_list_fields_say_what_they_take():
    with pytest.raises(TypeError, match="stop must be a list of strings"):
        lp.gen("x", stop=5)
    with pytest.raises(TypeError, match="stop_token_ids must be a list of ints"):
        SamplingParams(stop_token_ids="5")
    assert SamplingParams(stop=["a", "b"], stop_token_ids=[1]).stop == ("a", "b")


def test_lone_surrogates_are_refused_where_the_text_enters():
    """Text with a lone surrogate (from a bad decode, or a JSON escape without its pair)
    cannot be tokenized: it is refused at the append, in a role, and in stop strings."""
    from fakes import FakeBackend

    from lmprog.core.text import check_text

    with pytest.raises(ValueError, match=r"lone surrogate U\+D800 at position 3"):
        check_text("ab \ud800")
    check_text("fine: é 😀")
    with pytest.raises(ValueError, match=r"lone surrogate U\+DC80"):
        lp.user("x\udc80")
    with pytest.raises(ValueError, match="a stop string has a lone surrogate"):
        lp.gen("x", stop=["a\ud800"])

    @lp.function
    def appends(s):
        s += "hi \ud800"

    with pytest.raises(ValueError, match="lone surrogate"):
        appends.run(backend=FakeBackend())
