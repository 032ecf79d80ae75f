"""Tensor parallelism through lp.Runtime on the bundled model (SmolLM2-135M: 9 query heads,
3 KV heads, vocabulary 49,152, all divisible by 3): TP=3 over 3 CPU processes, its GGUF
sharded at load, answers as TP=1 does; a tp_size the heads do not divide is refused before
any process starts."""

from __future__ import annotations

import pytest
from tp_testing import assert_same, leftover_workers

import lmprog as lp
from lmprog.core.models import resolve_model

PARAMS = {"max_tokens": 5, "temperature": 0, "return_logprob": True}
PROMPTS = ["The capital of France is", "1, 2, 3, 4,"]


@pytest.fixture(scope="module")
def bundled():
    try:
        resolve_model()
    except ValueError as e:
        pytest.skip(f"the default model is not installed: {e}")


@lp.function
def year(s):
    s += "The first moon landing was in the year " + lp.gen("y", regex=r"19[0-9]{2}")


def test_tp3_on_the_bundled_model_matches_tp1(bundled):
    with lp.Runtime(device="cpu") as one:
        want = one.generate(PROMPTS, PARAMS)
        want_year = year.run(backend=one, temperature=0)["y"]
    # speculative decoding (n-gram drafts verified in the batch) keeps greedy outputs
    with lp.Runtime(device="cpu", tp_size=3, speculative="ngram") as three:
        got = three.generate(PROMPTS, PARAMS)
        again = three.generate(PROMPTS[0], PARAMS)  # its prompt is in the radix cache now
        got_year = year.run(backend=three, temperature=0)["y"]  # a constraint's masks
        stats = three.stats()
    assert got_year == want_year and len(got_year) == 4
    assert_same(got, want)
    assert [r.text for r in got] == [r.text for r in want]
    assert again.token_ids == want[0].token_ids and again.cached_tokens > 0
    assert stats["cached_tokens"] > 0
    assert stats["spec_verify_steps"] > 0  # drafts were verified by all three ranks
    assert leftover_workers() == []


def test_a_tp_size_the_heads_do_not_divide_is_refused_naming_the_sizes(bundled):
    with pytest.raises(ValueError, match=r"tp_size=2 does not divide the model's 9 query heads"):
        lp.Runtime(device="cpu", tp_size=2)
    with pytest.raises(ValueError, match=r"tp_size=4 does not divide the model's 9 query heads"):
        lp.Runtime(device="cpu", tp_size=4)
    with pytest.raises(ValueError, match="tp_size must be an int >= 1"):
        lp.Runtime(device="cpu", tp_size=0)
    assert leftover_workers() == []
