"""The llama.cpp backend never imports torch (1 s or more, which a first gen used to wait
for): plain, seeded, penalised, logprob, JSON-schema and regex gens and a score, in a fresh
process as a user's script runs them."""

import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend is not installed")

SCRIPT = """
import sys
import lmprog as lp
from lmprog.core.protocol import GenerateRequest, ScoreRequest
from lmprog.core.sampling import SamplingParams as SP
from lmprog.fsm.constraint import Constraint

b = lp.LlamaCpp(n_ctx=512)
schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
runs = [
    (SP(max_tokens=4, temperature=0), None),
    (SP(max_tokens=4, temperature=0.8, top_p=0.9, top_k=20, min_p=0.05, seed=1), None),
    (SP(max_tokens=4, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.5,
        min_tokens=2, seed=2), None),
    (SP(max_tokens=3, temperature=0, return_logprob=True, top_logprobs_num=2), None),
    (SP(max_tokens=12, temperature=0), Constraint.from_json_schema(schema)),
    (SP(max_tokens=6, temperature=0.7, seed=3), Constraint.from_regex("[0-9]{3}")),
]
for params, constraint in runs:
    out = b.generate(GenerateRequest("The answer is", params, constraint))
    assert out.completion_tokens > 0, out
b.score(ScoreRequest("The capital of France is", (" Paris", " London")))
print("torch" in sys.modules)
b.shutdown()
"""


def test_a_llamacpp_program_never_imports_torch():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


PROGRAM = """
import sys
import lmprog as lp

@lp.function
def f(s):
    s += "Q: Is the sky blue? A:" + lp.select("yes", choices=["yes", "no"])
    s += " Number:" + lp.gen("n", regex="[0-9]{2}", temperature=0.7, seed=1)
    s += " Then:" + lp.gen("x", max_tokens=4, temperature=0)

f.run()  # the default backend: llama.cpp on a machine without a GPU torch
print("torch" in sys.modules)
"""


def test_a_program_on_the_default_backend_never_imports_torch():
    import importlib.util

    from lmprog.backends import _gpu_build

    spec = importlib.util.find_spec("torch")
    if spec is not None and _gpu_build(spec.origin):
        pytest.skip("a CUDA or ROCm build of torch: the default backend imports it to look")
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
