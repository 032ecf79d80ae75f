"""SGLang's own frontend (`sgl.RuntimeEndpoint`, unchanged) runs every program of SGLang's
`sglang/test/test_programs.py` against `lmprog serve` on both backends (issue 38, section 2),
through scripts/interop/sglang_frontend.py (each program on a thread with a timeout, so none
hangs the suite). Skipped where sglang is not importable (`scripts/setup.sh --test` installs
its frontend). On the runtime the four slowest programs run with LMPROG_SGLANG_ALL=1 only
(they run on llama.cpp always), to keep the CPU suite within its budget.

Every program passes except those listed below with their reason: MODEL_ANSWER, where the
program checks an answer the bundled 135M model gets wrong (the same answer comes through
lmprog's own DSL on the same backend: the tests at the end), and NOT_ON_THIS_CLIENT, where
SGLang's client or this set-up cannot run the program against any server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import traceback
import urllib.request
import warnings
from pathlib import Path

import pytest

import lmprog as lp

pytestmark = pytest.mark.e2e

pytest.importorskip("sglang", reason="SGLang's frontend is not installed (setup.sh --test)")
# test_programs.py imports sglang.srt.utils, which sets cache folders in os.environ
# (TRITON_CACHE_DIR, ...) and warning filters at import time: kept from the rest of the suite
_environ = dict(os.environ)
with warnings.catch_warnings():
    pytest.importorskip("sglang.test.test_programs", reason="SGLang's frontend imports fail")
os.environ.clear()
os.environ.update(_environ)

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(
        f"lmprog_interop_{name}", ROOT / "scripts" / "interop" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


frontend = _script("sglang_frontend")
dsl_programs = _script("sglang_programs")

# The program checks an answer the bundled 135M model does not give (SGLang's suite runs these
# on 7B-class models). Measured through SGLang's frontend on both servers and through
# lmprog's DSL on both backends: the same answers.
MODEL_ANSWER = {
    # temperature 0: " New York"
    "test_few_shot_qa": "the capital of the United States: the model answers ' New York'",
    # SGLang's client sends regex [-+]?[0-9]+ with stop [" ", "\n"]: digits can only go on,
    # and the model writes 24000... (lmprog's own gen_int ends numbers at more characters)
    "test_decode_int": "the model goes on writing digits after '24' under SGLang's REGEX_INT",
    # temperature 0.1: 'a Frenchman ...', without "paris" in most draws
    "test_expert_answer": "the model's expert answer seldom names Paris",
    # temperature 0.1: the model never reaches Finish with an answer
    "test_react": "the model's ReAct trace ends without an answer",
    # temperature 0: the model ends its answer at once (EOS)
    "test_parallel_encoding": "the model answers '' (EOS first) instead of 'Noah'",
    # SGLang's REGEX_STR "[\w\d\s]*" never has to close and the program runs with
    # max_new_tokens=64: on llama.cpp (whose greedy choices move with the batch's layout) the
    # model has written 'Paris_smallus_Monaco_...' to the limit, an open string json.loads
    # refuses (as it would from SGLang's own server)
    "test_decode_json": "the model can fill REGEX_STR's open string to max_new_tokens",
}
# SGLang's client or this set-up cannot run the program against any server: (reason, the
# exception SGLang's program raises here)
NOT_ON_THIS_CLIENT = {
    "test_image_qa": (
        "needs SGLang's example_image.png in the working directory and a vision model "
        "(the default model reads text: lmprog serve answers its image_data with a 400)",
        IndexError,  # its executor failed to read the image: no messages
    ),
    "test_completion_speculative": (
        "reads backend.token_usage, which SGLang's RuntimeEndpoint lacks (SGLang runs it on "
        "its OpenAI backend only)",
        AttributeError,
    ),
    "test_gen_min_new_tokens": (
        "imports SGLang's server tokenizer utilities (sglang.srt), which need torchvision "
        "and a Hugging Face tokenizer at the model path",
        ModuleNotFoundError,
    ),
}
# SGLang's frontend keeps only the latest streamed event's meta_info for a variable, and its
# reader may wake after several events: their text then comes with the last event's logprobs
# alone and the program's count check fails (in 1 of 5 and 5 of 6 runs on 2 cores shared with
# other work; the events as its client received them were all consistent, 325 of 325). Where it
# fails so, the test checks lmprog's events itself and reports the race as an expected failure.
CLIENT_RACE = {
    "test_stream_logprobs": "SGLang's frontend merged streamed events it read late (client race)"
}
# test_chat_completion_speculative passes as SGLang's suite counts it (its program's error
# stays in its state: SGLang's RuntimeEndpoint has no is_chat_model); it sends no request.
# The runtime's slowest programs on 2 CPU threads (37, 21, 14 and 14 s measured): the suite
# runs them on llama.cpp only unless LMPROG_SGLANG_ALL=1, to keep the CPU suite in budget
SLOW_ON_RUNTIME = {
    "test_parallel_decoding",
    "test_decode_json_regex",
    "test_stream",
    "test_decode_int",
}
RUN_ALL = os.environ.get("LMPROG_SGLANG_ALL") == "1"
TIMEOUT_S = {"test_parallel_decoding": 300.0}  # 512 summary tokens; ~52 s on 2 CPU threads
DEFAULT_TIMEOUT_S = 120.0

NAMES = sorted(frontend.programs())


@pytest.fixture(scope="module", params=["llamacpp", "runtime"])
def backend(request, rt):
    if request.param == "runtime":
        yield rt
        return
    pytest.importorskip("llama_cpp", reason="the llama.cpp backend is not installed")
    backend = lp.LlamaCpp()
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def server(backend):
    from lmprog.serve import Server

    with Server(backend, stats_interval_s=None).start() as srv:
        frontend.use_server(srv.url)
        yield srv


@pytest.fixture(scope="module")
def outcomes(server):
    """Each program's outcome on this backend's server, run on first use."""
    cache: dict = {}

    def outcome(name: str):
        if name not in cache:
            cache[name] = frontend.run_program(name, TIMEOUT_S.get(name, DEFAULT_TIMEOUT_S))
        return cache[name]

    return outcome


def streamed_events(url: str) -> list[dict]:
    """The meta_info of each event of a streamed /generate with logprobs, as SGLang's
    test_stream_logprobs asks for them."""
    body = {
        "text": "USER: Write a travel blog post about Hawaii.\nASSISTANT:",
        "sampling_params": {"max_new_tokens": 64, "temperature": 0},
        "stream": True,
        "return_logprob": True,
    }
    req = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    events = []
    with urllib.request.urlopen(req, timeout=120) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                events.append(json.loads(line[5:])["meta_info"])
    return events


def answer_check_failed(name: str, error: BaseException | None) -> bool:
    """The program's own check failed (an assert, or test_decode_json's json.loads, in its
    test function), not a request or a client."""
    if not isinstance(error, (AssertionError, json.JSONDecodeError)):
        return False
    frames = traceback.extract_tb(error.__traceback__)
    if isinstance(error, json.JSONDecodeError):  # raised inside json: the program's call before
        while frames and Path(frames[-1].filename).parent.name == "json":
            frames.pop()
    if not frames:
        return False
    last = frames[-1]
    return Path(last.filename).name.startswith("test_programs") and last.name == name


def test_every_program_is_listed_or_expected_to_pass():
    assert set(MODEL_ANSWER) | set(NOT_ON_THIS_CLIENT) <= set(NAMES)
    assert len(NAMES) == 19, NAMES  # SGLang 0.5.23's programs; a new one is run too


@pytest.mark.parametrize("name", NAMES)
def test_sglang_program_through_its_frontend(request, server, outcomes, name):
    if request.node.callspec.params["backend"] == "runtime" and name in SLOW_ON_RUNTIME:
        if not RUN_ALL:
            pytest.skip("slow on the runtime's CPU path: LMPROG_SGLANG_ALL=1 runs it")
    outcome = outcomes(name)
    assert outcome.status != "TIMEOUT", outcome.describe()
    if name in MODEL_ANSWER:
        # sampled programs may draw the right answer; any other failure is lmprog's
        assert outcome.status == "PASS" or answer_check_failed(name, outcome.error), (
            outcome.describe()
        )
    elif name in CLIENT_RACE and outcome.status != "PASS":
        assert answer_check_failed(name, outcome.error), outcome.describe()
        events = streamed_events(server.url)
        prev = 0
        for meta in events:
            assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - prev, meta
            assert meta["output_token_logprobs_length"] == meta["completion_tokens"], meta
            prev = meta["completion_tokens"]
        assert len(events) > 1 and prev > 1
        pytest.xfail(CLIENT_RACE[name])
    elif name in NOT_ON_THIS_CLIENT:
        _, raises = NOT_ON_THIS_CLIENT[name]
        assert isinstance(outcome.error, raises), outcome.describe()
    else:
        assert outcome.status == "PASS", outcome.describe()


# ---- the same answers through lmprog's own DSL ----------------------------------------------


@pytest.fixture(scope="module")
def dsl(backend, tmp_path_factory):
    """SGLang's test programs with `import lmprog as sgl`, on this backend in process.
    Imported from a test_*.py file, as SGLang's own: pytest rewrites the asserts of both, so
    their failure messages compare."""
    folder = tmp_path_factory.mktemp("dsl")
    (folder / "test_programs_on_lmprog.py").write_text(dsl_programs.lmprog_source())
    sys.path.insert(0, str(folder))
    lp.set_default_backend(backend)
    try:
        yield importlib.import_module("test_programs_on_lmprog")
    finally:
        lp.set_default_backend(None)
        sys.path.remove(str(folder))
        sys.modules.pop("test_programs_on_lmprog", None)


def run_dsl(dsl, name: str) -> AssertionError | None:
    try:
        getattr(dsl, name)(**frontend.KWARGS.get(name, {}))
    except AssertionError as exc:
        return exc
    return None


def message(error: AssertionError) -> str:
    return re.sub(r" at 0x[0-9a-f]+", "", str(error))


@pytest.mark.parametrize("name", ["test_few_shot_qa", "test_parallel_encoding"])
def test_greedy_answers_are_the_same_through_lmprogs_dsl(outcomes, dsl, backend, name):
    """At temperature 0 the same check fails with the same answer on both paths. On
    llama.cpp greedy tokens are not guaranteed across the two paths (its kernels round by
    how a prompt is chunked into batches and cells: docs/serving.md; on one CPU build
    SGLang's path missed few_shot_qa's answer where the DSL's found it): there each path
    only has to pass or fail the same answer check, nothing else."""
    through_sglang = outcomes(name).error
    through_dsl = run_dsl(dsl, name)
    if not isinstance(backend, lp.Runtime):
        for error in (through_sglang, through_dsl):
            assert error is None or answer_check_failed(name, error), error
        return
    assert answer_check_failed(name, through_sglang), outcomes(name).describe()
    assert answer_check_failed(name, through_dsl), through_dsl
    # the same answer, in the message (pytest's explanation names objects by address)
    assert message(through_dsl) == message(through_sglang)
    lines = [
        traceback.extract_tb(e.__traceback__)[-1].lineno for e in (through_dsl, through_sglang)
    ]
    assert lines[0] == lines[1]


@pytest.mark.parametrize("name", ["test_expert_answer", "test_react"])
def test_sampled_answers_fail_the_same_check_through_lmprogs_dsl(outcomes, dsl, name):
    """Sampled (temperature 0.1): the DSL fails the same answer check or draws a passing
    answer, as SGLang's frontend does; nothing else fails."""
    outcome = outcomes(name)
    assert outcome.status == "PASS" or answer_check_failed(name, outcome.error)
    through_dsl = run_dsl(dsl, name)
    assert through_dsl is None or answer_check_failed(name, through_dsl), through_dsl


def test_sglangs_int_request_writes_the_same_digits_through_lmprogs_dsl(outcomes, backend):
    """SGLang's gen_int request (REGEX_INT, stop at a space or newline) through lmprog's DSL:
    the model goes on after 24 as through SGLang's frontend."""
    outcome = outcomes("test_decode_int")
    assert answer_check_failed("test_decode_int", outcome.error), outcome.describe()
    assert re.search(r"in a day is 24\d", str(outcome.error)), outcome.describe()

    @lp.function
    def hours(s):
        s += "The number of hours in a day is "
        s += lp.gen("hours", regex=lp.REGEX_INT, stop=[" ", "\n"], max_tokens=16)

    text = hours.run(backend=backend, temperature=0)["hours"]
    assert re.fullmatch(r"24\d+", text), text
