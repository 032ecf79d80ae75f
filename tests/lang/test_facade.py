import subprocess
import sys

import pytest

import lmprog as lp

API_NAMES = [
    "function",
    "gen",
    "select",
    "system",
    "user",
    "assistant",
    "system_begin",
    "system_end",
    "user_begin",
    "user_end",
    "assistant_begin",
    "assistant_end",
    "image",
    "Arg",
    "set_default_backend",
    "global_config",
    "token_length_normalized",
    "greedy_token_selection",
    "unconditional_likelihood_normalized",
    "ConstraintError",
    "ContextLengthError",
    "LoraError",
    "BackendError",
    "SamplingParams",
]


def test_the_api_names_exist():
    missing = [n for n in API_NAMES if not hasattr(lp, n)]
    assert not missing


def test_import_is_light():
    code = (
        "import sys, lmprog\n"
        "heavy = [m for m in ('torch', 'llama_cpp', 'transformers', 'tqdm', 'lmprog.backends', 'lmprog.runtime') if m in sys.modules]\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_unknown_attributes_raise_attribute_error():
    with pytest.raises(AttributeError):
        lp.does_not_exist


def test_set_default_backend_checks_its_argument():
    with pytest.raises(TypeError):
        lp.set_default_backend("llama")
