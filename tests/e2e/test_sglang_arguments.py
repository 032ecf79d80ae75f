"""On the real model, on both backends: SGLang's stop_regex, gen(n=...), flush_cache and
get_server_info (issue 38, section 1)."""

import re

import lmprog as sgl  # as an SGLang program imports it


@sgl.function
def count(s):
    s += "Count from 1 to 20: 1, 2, 3," + sgl.gen("rest", max_tokens=40, stop_regex=r"\b7\b")


def test_stop_regex_ends_generation_where_the_pattern_first_matches(backend):
    state = count.run(temperature=0, backend=backend)
    meta = state.get_meta_info("rest")
    free = count.run(temperature=0, backend=backend, stop_regex=None)["rest"]
    assert meta["finish_reason"] == {"type": "stop", "matched": r"\b7\b"}, state["rest"]
    assert re.search(r"\b7\b", state["rest"]) and state["rest"].rstrip().endswith("7")
    assert free.startswith(state["rest"])  # the same greedy text, cut where it matched


@sgl.function
def samples(s):
    s += "A random fruit:" + sgl.gen("fruit", max_tokens=4, n=3, stop="\n", seed=1)


def test_gen_n_draws_n_continuations_and_the_text_goes_on_with_the_first(backend):
    state = samples.run(temperature=1.0, backend=backend)
    fruits = state["fruit"]
    assert isinstance(fruits, list) and len(fruits) == 3
    assert state.text() == "A random fruit:" + fruits[0]
    again = samples.run(temperature=1.0, backend=backend)["fruit"]
    assert again == fruits  # seeded: seed + i for sample i


def test_flush_cache_and_get_server_info(backend):
    count.run(temperature=0, backend=backend, max_tokens=2)
    assert sgl.flush_cache(backend) is True  # idle: emptied
    info = sgl.get_server_info(backend)
    assert info["model_path"] == backend.model_name and info["backend"] == type(backend).__name__
