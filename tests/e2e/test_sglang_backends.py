"""On the real model, on both backends: SGLang's backend-level names (issue 15,
differences 7 and 8): `global_config.default_backend.token_usage` counts a program's tokens,
and a batch of an f-string program shares its traced constant prefix."""

import lmprog as sgl  # as an SGLang program imports it
from lmprog.lang import ir

SHOTS = "The capital of Italy is Rome.\nThe capital of Spain is Madrid.\n"


@sgl.function
def capital(s, country):
    s += SHOTS + f"The capital of {country} is"
    s += sgl.gen("answer", max_tokens=4, stop="\n")
    s += "\nIs that right? " + sgl.select("ok", choices=["yes", "no"])


def test_token_usage_of_the_default_backend_counts_a_run(backend):
    sgl.set_default_backend(backend)
    try:
        usage = sgl.global_config.default_backend.token_usage
        usage.reset()
        state = capital.run(country="France", temperature=0)
        meta = state.get_meta_info("answer")
        assert usage.completion_tokens == meta["completion_tokens"] > 0
        # the gen's prompt, then the select's prompt and its choices' tokens
        prompts = meta["prompt_tokens"] + state.get_meta_info("ok")["prompt_tokens"]
        assert usage.prompt_tokens > prompts
        usage.reset()
        assert (usage.prompt_tokens, usage.completion_tokens) == (0, 0)
    finally:
        sgl.set_default_backend(None)


def test_an_f_string_batch_traces_every_gen_and_matches_single_runs(backend):
    graph = capital.trace()
    assert graph.stopped is None
    assert [n.name for n in graph.nodes if isinstance(n, (ir.Gen, ir.Select))] == ["answer", "ok"]
    assert ir.ArgRef("country") in graph.nodes
    states = capital.run_batch(
        [{"country": "France"}, {"country": "Japan"}], temperature=0, backend=backend
    )
    single = capital.run(country="Japan", temperature=0, backend=backend)
    assert states[1]["answer"] == single["answer"] and states[1]["ok"] == single["ok"]
    assert states[0].text().startswith(SHOTS + "The capital of France is")
