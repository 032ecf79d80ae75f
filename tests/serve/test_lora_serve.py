"""LoRA adapters through lmprog serve (the default model on the CPU runtime): `model` set to
an adapter on /v1/completions and /v1/chat/completions, `lora_path` in SGLang's /generate,
/v1/models listing the adapters, /v1/load_lora_adapter and /v1/unload_lora_adapter behind
the API key, clear errors for unknown and malformed adapters, and the CLI flags."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from serve_http import assert_error, post_json, request

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from lora_testing import write_adapter

pytestmark = pytest.mark.e2e
KEY = {"Authorization": "Bearer sekrit"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from lmprog.core.models import resolve_model
    from lmprog.runtime.models import load_model

    try:
        source = resolve_model()
    except ValueError as e:
        pytest.skip(f"the default model is not installed: {e}")
    config = load_model(source, load_format="dummy", device="cpu").config
    root = tmp_path_factory.mktemp("lora")
    return {
        "sql": write_adapter(root / "sql", config, rank=8, std=0.05, seed=1),
        "poet": write_adapter(
            root / "poet", config, rank=4, std=0.08, seed=2, targets=("q_proj", "v_proj")
        ),  # fmt: skip
    }


@pytest.fixture(scope="module")
def server(folders):
    from lmprog.backends.runtime import Runtime
    from lmprog.serve import Server

    torch.set_num_threads(1)
    rt = Runtime(device="cpu", max_total_tokens=4096, lora_paths={"sql": str(folders["sql"])},
                 max_lora_rank=8)  # fmt: skip
    with Server(rt, api_key="sekrit").start() as srv:
        yield srv
    rt.shutdown()


def _complete(server, model, prompt="The capital of France is", **extra):
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0, **extra}
    return post_json(server.url, "/v1/completions", body, KEY)


def test_model_names_an_adapter(server):
    status, base = _complete(server, server.model_name)
    assert status == 200, base
    status, sql = _complete(server, "sql")
    assert status == 200 and sql["model"] == server.model_name
    assert sql["choices"][0]["text"] != base["choices"][0]["text"]
    chat = {"model": "sql", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6,
            "temperature": 0}  # fmt: skip
    status, out = post_json(server.url, "/v1/chat/completions", chat, KEY)
    assert status == 200 and out["usage"]["completion_tokens"] == 6
    anthropic = {"model": "sql", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    status, out = post_json(server.url, "/v1/messages", anthropic, KEY)
    assert status == 200 and out["usage"]["output_tokens"] <= 4, out
    status, err = _complete(server, "nope")
    assert_error(status, err, 404, param="model", code="model_not_found")
    assert "'sql'" in err["error"]["message"]


def test_native_generate_takes_lora_path(server):
    status, direct = _complete(server, "sql", prompt="Hello")
    body = {"text": "Hello", "sampling_params": {"max_new_tokens": 8, "temperature": 0},
            "lora_path": "sql"}  # fmt: skip
    status, out = post_json(server.url, "/generate", body, KEY)
    assert status == 200 and out["text"] == direct["choices"][0]["text"]
    batch = {"text": ["Hello", "Hello"], "sampling_params": {"max_new_tokens": 8,
             "temperature": 0}, "lora_path": [None, "sql"]}  # fmt: skip
    status, outs = post_json(server.url, "/generate", batch, KEY)
    assert status == 200 and outs[1]["text"] == out["text"] and outs[0]["text"] != out["text"]
    status, err = post_json(server.url, "/generate", {**body, "lora_path": "nope"}, KEY)
    assert_error(status, err, 404, param="lora_path", code="lora_not_found")


def test_load_list_unload(server, folders, tmp_path):
    load = {"lora_name": "poet", "lora_path": str(folders["poet"])}
    status, _ = post_json(server.url, "/v1/load_lora_adapter", load)
    assert status == 401  # behind the API key
    status, out = post_json(server.url, "/v1/load_lora_adapter", load, KEY)
    assert status == 200 and out["loaded_adapters"]["poet"] == str(folders["poet"])
    status, models = request(server.url, "GET", "/v1/models", headers=KEY)
    cards = {m["id"]: m for m in models["data"]}
    assert set(cards) == {server.model_name, "sql", "poet"}
    assert cards["poet"]["parent"] == server.model_name
    assert cards["poet"]["root"] == str(folders["poet"])
    status, card = request(server.url, "GET", "/v1/models/poet", headers=KEY)
    assert status == 200 and card["id"] == "poet"
    assert _complete(server, "poet")[0] == 200
    status, err = post_json(server.url, "/v1/load_lora_adapter", load, KEY)
    assert_error(status, err, 400, code="invalid_lora")  # already loaded
    (tmp_path / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
    bad = {"lora_name": "bad", "lora_path": str(tmp_path)}
    status, err = post_json(server.url, "/v1/load_lora_adapter", bad, KEY)
    assert_error(status, err, 400, param="lora_path", code="invalid_lora")
    assert "adapter_model" in err["error"]["message"]
    status, out = post_json(server.url, "/v1/unload_lora_adapter", {"lora_name": "poet"}, KEY)
    assert status == 200 and set(out["loaded_adapters"]) == {"sql"}
    status, err = post_json(server.url, "/v1/unload_lora_adapter", {"lora_name": "poet"}, KEY)
    assert_error(status, err, 404, param="lora_name", code="lora_not_found")
    assert_error(*_complete(server, "poet"), 404, param="model")
    assert _complete(server, "sql")[0] == 200  # the others serve on


def test_cli_lora_flags():
    import argparse

    from lmprog.serve.cli import add_serve_arguments, backend_options, choose_backend

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--lora-paths", "a=/x", "/y", "--max-loras-per-batch", "4"])
    assert choose_backend(args)[0] == "runtime"
    opts = backend_options(args)
    assert opts["lora_paths"] == ["a=/x", "/y"] and opts["max_loras_per_batch"] == 4
    args = parser.parse_args(["--backend", "llamacpp", "--enable-lora", "--lora-paths", "a=/x"])
    assert backend_options(args)["lora_paths"] == ["a=/x"]  # llama.cpp serves adapters too
    args = parser.parse_args(["--backend", "llamacpp", "--max-loras-per-batch", "4"])
    with pytest.raises(ValueError, match="--max-loras-per-batch"):
        backend_options(args)
