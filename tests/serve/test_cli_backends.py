"""`lmprog serve` flags per backend: mapped where they mean something, an error otherwise."""

from __future__ import annotations

import argparse

import pytest

from lmprog.serve import cli
from lmprog.serve.cli import add_serve_arguments, backend_options, choose_backend, main


def options(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return backend_options(parser.parse_args(list(argv)))


def test_runtime_gets_its_flags():
    assert options("--device", "cpu", "--num-threads", "2", "--max-total-tokens", "512") == {
        "device": "cpu",
        "max_total_tokens": 512,
        "quantization": None,
        "num_threads": 2,
    }
    assert options("--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3") == {
        "device": "auto",
        "max_total_tokens": None,
        "quantization": "fp8",
        "num_threads": None,
        "kv_cache_dtype": "fp8_e4m3",
    }
    sinks = options("--attention-sink-size", "4", "--sliding-window-size", "1020")
    assert sinks["attention_sink_size"] == 4 and sinks["sliding_window_size"] == 1020
    assert "attention_sink_size" not in options()  # off unless given


def test_mmproj_reaches_either_backend():
    runtime = options("--backend", "runtime", "--mmproj", "mmproj.gguf")
    assert runtime["mmproj"] == "mmproj.gguf" and "mmproj" not in options()
    llama = options("--backend", "llamacpp", "--device", "cpu", "--mmproj", "mmproj.gguf")
    assert llama["mmproj"] == "mmproj.gguf"


def test_llamacpp_maps_threads_context_and_device():
    llama = ("--backend", "llamacpp")
    assert options(*llama, "--device", "cpu") == {"n_gpu_layers": 0}
    assert options(
        *llama, "--device", "cpu", "--num-threads", "3", "--max-total-tokens", "999"
    ) == {
        "n_gpu_layers": 0,
        "n_threads": 3,
        "n_ctx": 999,
    }
    assert options(*llama, "--device", "cuda") == {"n_gpu_layers": -1}
    assert options(*llama, "--device", "cuda:1") == {"n_gpu_layers": -1, "main_gpu": 1}
    assert options(*llama, "--device", "metal") == {"n_gpu_layers": -1}


def test_max_running_requests_maps_to_each_backend():
    assert options("--max-running-requests", "8")["max_running_requests"] == 8
    assert "max_running_requests" not in options()  # the runtime's default unless given
    llama = ("--backend", "llamacpp", "--device", "cpu")
    assert options(*llama, "--max-running-requests", "1") == {"n_gpu_layers": 0, "n_parallel": 1}


def test_llamacpp_auto_device_follows_the_build():
    llama_cpp = pytest.importorskip("llama_cpp")
    want = -1 if llama_cpp.llama_supports_gpu_offload() else 0
    assert options("--backend", "llamacpp") == {"n_gpu_layers": want}


@pytest.mark.parametrize(
    "argv,match",
    [
        (("--quantization", "int4"), "--quantization int4 applies to --backend runtime only"),
        (("--kv-cache-dtype", "fp8"), "--kv-cache-dtype fp8 applies to --backend runtime only"),
        (("--tp", "2"), "--tp 2 applies to --backend runtime only: llama.cpp splits"),
        (("--dp", "2"), "--dp 2 applies to --backend runtime only: llama.cpp runs one"),
        (
            ("--attention-sink-size", "4"),
            "--attention-sink-size 4 applies to --backend runtime only: .* no attention sinks",
        ),
        (
            ("--sliding-window-size", "64"),
            "--sliding-window-size 64 applies to --backend runtime only",
        ),
        (("--device", "tpu"), "--device 'tpu' is not a llama.cpp device"),
        (("--device", "cuda:x"), "is not a llama.cpp device"),
    ],
)
def test_llamacpp_refuses_flags_it_cannot_apply(argv, match):
    with pytest.raises(ValueError, match=match):
        options("--backend", "llamacpp", *argv)


def test_the_command_line_exits_with_the_reason(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--backend", "llamacpp", "--quantization", "int4"])
    assert exit_.value.code == 2
    assert "applies to --backend runtime only" in capsys.readouterr().err


def chosen(*argv: str) -> tuple[str, str]:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return choose_backend(parser.parse_args(list(argv)))


def test_auto_picks_llamacpp_for_a_gguf_on_a_cpu_and_says_why(monkeypatch):
    monkeypatch.setattr(cli, "_has_cuda", lambda: False)
    backend, why = chosen()
    assert backend == "llamacpp" and "GGUF model on a CPU" in why
    assert chosen("--device", "cpu")[0] == "llamacpp"
    # a flag only the runtime has keeps the runtime, and says which flag
    assert chosen("--quantization", "int4") == ("runtime", "auto: --quantization need the runtime")
    assert chosen("--dp", "2")[0] == "runtime"
    assert chosen("--attention-sink-size", "4") == (
        "runtime",
        "auto: --attention-sink-size need the runtime",
    )
    # an explicit choice is kept
    assert chosen("--backend", "runtime") == ("runtime", "--backend runtime")


def test_auto_picks_the_runtime_on_a_gpu_or_an_hf_folder(monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "_has_cuda", lambda: True)
    assert chosen() == ("runtime", "auto: a CUDA GPU is present")
    assert chosen("--device", "cuda:0") == ("runtime", "auto: --device cuda:0")
    monkeypatch.setattr(cli, "_has_cuda", lambda: False)
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    backend, why = chosen("--model", str(folder))
    assert backend == "runtime", why


def test_every_runtime_flag_is_a_runtime_keyword():
    """Each runtime-only flag (attention sinks included) becomes the lp.Runtime keyword of
    the same name: the options bind to its signature."""
    import inspect

    from lmprog.backends.runtime import Runtime

    argv = ["--backend", "runtime", "--tp", "2", "--dp", "2", "--quantization", "fp8"]
    argv += ["--kv-cache-dtype", "fp8", "--attention-sink-size", "4", "--sliding-window-size", "60"]
    argv += ["--host-kv-cache-bytes", "1000000", "--disk-kv-cache-bytes", "2000000"]
    argv += ["--disk-kv-cache-dir", "/tmp"]  # both backends take these two
    argv += ["--lora-paths", "a=/x", "--enable-lora", "--max-loras-per-batch", "4"]
    argv += ["--max-lora-rank", "8", "--lora-target-modules", "q_proj", "--max-loaded-loras", "3"]
    opts = options(*argv)
    assert {dest for _, dest, _, _ in cli.RUNTIME_ONLY} <= set(opts)
    inspect.signature(Runtime).bind(None, **opts)  # TypeError for a name Runtime lacks


def test_the_disk_tier_flags_reach_llamacpps_saved_states():
    """--disk-kv-cache-bytes/-dir are the runtime's disk tier and llama.cpp's saved states'."""
    import inspect

    from lmprog.backends.llamacpp import LlamaCpp

    argv = ["--backend", "llamacpp", "--disk-kv-cache-bytes", "5000", "--disk-kv-cache-dir", "/d"]
    opts = options(*argv)
    assert opts["state_cache_disk_bytes"] == 5000 and opts["state_cache_disk_dir"] == "/d"
    inspect.signature(LlamaCpp).bind(None, **opts)
    with pytest.raises(ValueError, match="--host-kv-cache-bytes"):
        options("--backend", "llamacpp", "--host-kv-cache-bytes", "5000")
