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
