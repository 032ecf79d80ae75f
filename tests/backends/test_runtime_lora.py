"""LoRA adapters through lp.Runtime and the DSL (the default model, on the CPU): lora_paths
at start-up, `run(lora_path=...)` for a whole program (gens and selects), `gen(...,
lora_path=...)` for one gen, offline generate, load/unload, and the errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import lmprog as lp
from lmprog.core.errors import LoraError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from lora_testing import write_adapter

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    from lmprog.core.models import resolve_model
    from lmprog.runtime.models import load_model

    try:
        source = resolve_model()
    except ValueError as e:
        pytest.skip(f"the default model is not installed: {e}")
    config = load_model(source, load_format="dummy", device="cpu").config
    root = tmp_path_factory.mktemp("lora")
    return {
        "zero": write_adapter(root / "zero", config, rank=8, std=0.0),  # PEFT's init: B = 0
        "sql": write_adapter(root / "sql", config, rank=8, std=0.05, seed=1),
        "qv": write_adapter(
            root / "qv", config, rank=4, std=0.08, seed=2, targets=("q_proj", "v_proj", "down_proj")
        ),  # fmt: skip
    }


@pytest.fixture(scope="module")
def rt(adapters):
    torch.set_num_threads(1)
    backend = lp.Runtime(
        device="cpu",
        max_total_tokens=4096,
        lora_paths={"zero": str(adapters["zero"]), "sql": str(adapters["sql"])},
        max_lora_rank=8,
    )
    yield backend
    backend.shutdown()


@lp.function
def qa(s, question):
    s += lp.user(question)
    s += lp.assistant(lp.gen("answer", max_tokens=12, temperature=0))
    s += lp.select("verdict", ["yes", "no", "maybe"])


def test_run_lora_path_applies_to_gens_and_selects(rt):
    base = qa.run(question="Is the sky blue?", backend=rt)
    zero = qa.run(question="Is the sky blue?", backend=rt, lora_path="zero")
    sql = qa.run(question="Is the sky blue?", backend=rt, lora_path="sql")
    assert zero["answer"] == base["answer"]  # a B = 0 adapter is the base model
    assert sql["answer"] != base["answer"]
    scores = {k: s.get_meta_info("verdict")["normalized_prompt_logprobs"]
              for k, s in (("base", base), ("zero", zero), ("sql", sql))}  # fmt: skip
    assert scores["zero"] == pytest.approx(scores["base"], abs=1e-4)
    assert scores["sql"] != pytest.approx(scores["base"], abs=1e-3)


def test_gen_lora_path_overrides_the_run(rt):
    @lp.function
    def two(s):
        s += "Write a number:" + lp.gen("a", max_tokens=8, temperature=0)
        s += "\nAgain:" + lp.gen("b", max_tokens=8, temperature=0, lora_path="sql")

    plain = two.run(backend=rt)
    under = two.run(backend=rt, lora_path="zero")
    assert plain["a"] == under["a"]
    direct = rt.generate(
        "Write a number:" + plain["a"] + "\nAgain:",
        {"max_tokens": 8, "temperature": 0, "lora_path": "sql"},
    )
    assert plain["b"] == direct.text


def test_offline_generate_mixes_adapters(rt):
    prompts = ["Hello, my name is", "The capital of France is"] * 2
    params = [{"max_tokens": 8, "temperature": 0, "lora_path": p}
              for p in (None, "sql", "sql", None)]  # fmt: skip
    together = [r.text for r in rt.generate(prompts, params)]
    alone = [rt.generate(p, q).text for p, q in zip(prompts, params)]
    assert together == alone
    assert together[0] != rt.generate(prompts[0], params[1]).text


def test_load_unload_and_errors(rt, adapters, tmp_path):
    assert {a["name"] for a in rt.lora_adapters()} == {"zero", "sql"}
    card = rt.load_lora_adapter("qv", str(adapters["qv"]))
    assert card["rank"] == 4 and card["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    out = rt.generate("Hi", {"max_tokens": 4, "temperature": 0, "lora_path": "qv"})
    assert out.completion_tokens == 4
    rt.unload_lora_adapter("qv")
    with pytest.raises(LoraError, match="no LoRA adapter named 'qv'"):
        rt.generate("Hi", {"max_tokens": 4, "lora_path": "qv"})
    with pytest.raises(LoraError, match="no LoRA adapter named 'nope'"):
        qa.run(question="?", backend=rt, lora_path="nope")
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(LoraError, match="r must be a positive int"):
        rt.load_lora_adapter("broken", str(tmp_path))
    assert {a["name"] for a in rt.lora_adapters()} == {"zero", "sql"}


def test_lora_path_is_checked_where_it_is_given():
    with pytest.raises(TypeError, match="lora_path"):
        lp.gen("x", lora_path=3)
    with pytest.raises(TypeError, match="lora_path"):
        lp.SamplingParams(lora_path="")
    from lmprog.backends.runtime import lora_path_items

    assert lora_path_items(["a=/x", "/y"]) == [("a", "/x"), ("/y", "/y")]
    with pytest.raises(ValueError, match="twice"):
        lora_path_items(["a=/x", "a=/y"])
