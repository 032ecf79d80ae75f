"""RuntimeConfig and LlamaCppConfig: each knob listed once (type, default, help, SGLang's
name, serve flag), validated at construction, split into the subsystem configs, and the
source of lp.Runtime's and lp.LlamaCpp's keywords and of `lmprog serve`'s backend flags."""

from __future__ import annotations

import argparse
import inspect
from dataclasses import fields

import pytest

import lmprog as lp
from lmprog.backends.config import LlamaCppConfig
from lmprog.backends.runtime_config import RuntimeConfig
from lmprog.runtime.config import (
    AttentionSinkConfig,
    CacheConfig,
    EngineConfig,
    LoraConfig,
    SchedulerConfig,
)
from lmprog.runtime.speculative.config import SpeculativeConfig
from lmprog.serve.cli import RUNTIME_ONLY, add_serve_arguments, backend_options


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("config", [RuntimeConfig, LlamaCppConfig])
def test_every_knob_has_help(config):
    for f in fields(config):
        assert isinstance(f.metadata.get("help"), str) and len(f.metadata["help"]) > 10, f.name
    table = config.table()
    assert all(f"| `{f.name}` |" in table for f in fields(config))


def test_every_serve_flag_has_help_and_its_knobs_dest():
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    by_dest = {a.dest: a for a in parser._actions}
    flagged = [f for f in fields(RuntimeConfig) if f.metadata["flag"] is not None]
    assert len(flagged) >= 19
    for f in flagged:
        action = by_dest[f.name]
        assert action.option_strings == list(f.metadata["flag"].names)
        assert action.help and f.metadata["help"].split(" (")[0][:20] in action.help


# What `lmprog serve --help` listed before the flags were built from RuntimeConfig:
# (option strings, dest, default); every one stays.
SERVE_FLAGS_BEFORE = [
    (("--device",), "device", "auto"),
    (("--quantization",), "quantization", None),
    (("--kv-cache-dtype",), "kv_cache_dtype", "auto"),
    (("--host-kv-cache-bytes",), "host_kv_cache_bytes", 0),
    (("--disk-kv-cache-bytes",), "disk_kv_cache_bytes", 0),
    (("--disk-kv-cache-dir",), "disk_kv_cache_dir", None),
    (("--dp", "--dp-size"), "dp_size", 1),
    (("--tp", "--tp-size"), "tp_size", 1),
    (("--attention-sink-size",), "attention_sink_size", None),
    (("--lora-paths",), "lora_paths", None),
    (("--enable-lora",), "enable_lora", None),
    (("--max-loras-per-batch",), "max_loras_per_batch", 8),
    (("--max-lora-rank",), "max_lora_rank", None),
    (("--lora-target-modules",), "lora_target_modules", None),
    (("--max-loaded-loras",), "max_loaded_loras", None),
    (("--sliding-window-size",), "sliding_window_size", None),
    (("--max-total-tokens",), "max_total_tokens", None),
    (("--max-running-requests",), "max_running_requests", None),
    (("--num-threads",), "num_threads", None),
]


def test_the_serve_flags_are_those_of_before():
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    actions = {tuple(a.option_strings): a for a in parser._actions}
    for names, dest, default in SERVE_FLAGS_BEFORE:
        assert actions[names].dest == dest and actions[names].default == default, names
    assert actions[("--quantization",)].choices == ("int4", "fp8")
    assert actions[("--kv-cache-dtype",)].choices == ("auto", "fp8_e4m3", "fp8")
    assert actions[("--lora-paths",)].nargs == "+" and actions[("--lora-paths",)].metavar
    assert parse("--enable-lora").enable_lora is True and parse("--dp", "3").dp_size == 3
    assert [flag for flag, *_ in RUNTIME_ONLY] == [
        "--quantization",
        "--kv-cache-dtype",
        "--host-kv-cache-bytes",
        "--dp",
        "--tp",
        "--attention-sink-size",
        "--sliding-window-size",
        "--max-loras-per-batch",
        "--max-lora-rank",
        "--lora-target-modules",
        "--max-loaded-loras",
    ]


def runtime_config_of(argv: list[str]) -> RuntimeConfig:
    args = parse(*argv)
    return RuntimeConfig.of_call("Runtime", (args.model,), backend_options(args))


def test_cli_round_trip_equals_the_keyword_form():
    assert runtime_config_of([]) == RuntimeConfig()
    argv = ["--model", "m.gguf", "--device", "cpu", "--max-total-tokens", "4096"]
    argv += ["--max-running-requests", "8", "--num-threads", "2", "--quantization", "int4"]
    argv += ["--kv-cache-dtype", "fp8", "--host-kv-cache-bytes", "1000", "--dp", "2"]
    argv += ["--disk-kv-cache-bytes", "2000", "--disk-kv-cache-dir", "/tmp/x"]
    argv += ["--attention-sink-size", "4", "--sliding-window-size", "64"]
    assert runtime_config_of(argv) == RuntimeConfig(
        model="m.gguf",
        device="cpu",
        max_total_tokens=4096,
        max_running_requests=8,
        num_threads=2,
        quantization="int4",
        kv_cache_dtype="fp8",
        host_kv_cache_bytes=1000,
        disk_kv_cache_bytes=2000,
        disk_kv_cache_dir="/tmp/x",
        dp_size=2,
        attention_sink_size=4,
        sliding_window_size=64,
    )
    lora = ["--lora-paths", "a=/x", "/y", "--max-loras-per-batch", "4", "--max-lora-rank", "8"]
    lora += ["--lora-target-modules", "q_proj", "v_proj", "--max-loaded-loras", "3"]
    assert runtime_config_of(lora) == RuntimeConfig(
        lora_paths={"a": "/x", "/y": "/y"},
        max_loras_per_batch=4,
        max_lora_rank=8,
        lora_target_modules=["q_proj", "v_proj"],
        max_loaded_loras=3,
    )
    assert runtime_config_of(["--enable-lora", "--tp", "2"]) == RuntimeConfig(
        enable_lora=True, tp_size=2
    )


def test_llamacpp_flags_fill_its_config():
    args = parse("--backend", "llamacpp", "--device", "cpu", "--max-total-tokens", "999")
    args.backend = "llamacpp"
    opts = backend_options(args)
    assert LlamaCppConfig.of_call("LlamaCpp", (None,), opts) == LlamaCppConfig(
        n_ctx=999, n_gpu_layers=0
    )


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"page_size": 0}, ValueError, "page_size must be >= 1"),
        ({"eviction": "mru"}, ValueError, "eviction must be one of"),
        ({"kv_cache_dtype": "int8"}, ValueError, "kv_cache_dtype must be one of"),
        ({"max_running_requests": 0}, ValueError, "max_running_requests must be >= 1"),
        ({"max_num_batched_tokens": 8}, ValueError, r"max_num_batched_tokens \(8\) must be >="),
        ({"schedule_policy": "random"}, ValueError, "schedule_policy must be one of"),
        ({"hybrid_batching": 1}, TypeError, "hybrid_batching must be a bool"),
        ({"jump_forward": "yes"}, TypeError, "jump_forward must be a bool"),
        ({"overlap": 1}, TypeError, "overlap must be a bool or None"),
        ({"dp_size": 0}, ValueError, "dp_size must be an int >= 1"),
        ({"tp_size": 1.5}, ValueError, "tp_size must be an int >= 1"),
        ({"host_kv_cache_bytes": -1}, ValueError, "host_kv_cache_bytes must be >= 0"),
        ({"disk_kv_cache_bytes": 10}, ValueError, "disk_kv_cache_bytes needs host_kv_cache"),
        ({"speculative": "magic"}, ValueError, "speculative method must be one of"),
        ({"speculative": {"num_tokenz": 3}}, ValueError, "unknown speculative option"),
        ({"sliding_window_size": 64}, ValueError, "sliding_window_size needs attention_sink"),
        ({"attention_sink_size": -1}, ValueError, "attention_sink_size must be >= 0"),
        ({"attention_sink_size": 4, "tp_size": 2}, ValueError, "attention_sink_size does not"),
        ({"lora_paths": ["a=/x"], "enable_lora": False}, ValueError, "lora_paths with enable"),
        ({"lora_paths": ["a=/x", "a=/y"]}, ValueError, "names an adapter twice"),
        ({"enable_lora": True, "max_lora_rank": 0}, ValueError, "max_lora_rank must be >= 1"),
        ({"enable_lora": True, "lora_target_modules": ["qkv"]}, ValueError, "lora_target_mod"),
    ],
)
def test_runtime_validation_names_the_knob(kwargs, error, match):
    with pytest.raises(error, match=match):
        RuntimeConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"n_ctx": 8}, ValueError, "n_ctx must be >= 16"),
        ({"n_gpu_layers": -2}, ValueError, "n_gpu_layers must be >= -1"),
        ({"n_parallel": 0}, ValueError, "n_parallel must be >= 1"),
        ({"n_threads": 0}, ValueError, "n_threads must be >= 1"),
        ({"main_gpu": -1}, ValueError, "main_gpu must be >= 0"),
        ({"n_batch": True}, TypeError, "n_batch must be an int"),
        ({"state_cache_bytes": -1}, ValueError, "state_cache_bytes must be >= 0"),
        ({"min_save_tokens": 0}, ValueError, "min_save_tokens must be >= 1"),
        ({"jump_forward": None}, TypeError, "jump_forward must be a bool"),
    ],
)
def test_llamacpp_validation_names_the_knob(kwargs, error, match):
    with pytest.raises(error, match=match):
        LlamaCppConfig(**kwargs)
    with pytest.raises(error, match=match):  # before any model file is looked at
        lp.LlamaCpp("no-such-model.gguf", **kwargs)


def test_unknown_keywords_are_a_clear_type_error():
    with pytest.raises(TypeError, match=r"Runtime\(\) got an unexpected keyword argument "
                       r"'max_tokenz'; did you mean 'max_total_tokens'\?"):  # fmt: skip
        lp.Runtime(max_tokenz=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'mem_fraction_static'"):
        lp.Runtime(mem_fraction_static=0.8)
    with pytest.raises(TypeError, match=r"LlamaCpp\(\) got an unexpected keyword argument 'nctx'"):
        lp.LlamaCpp(nctx=512)
    with pytest.raises(TypeError, match="at most 7 positional arguments"):
        lp.Runtime(None, "cpu", "auto", None, True, "lru", "auto", "extra")
    with pytest.raises(TypeError, match="multiple values for argument 'device'"):
        lp.Runtime(None, "cpu", device="cpu")
    with pytest.raises(TypeError, match="model=... or model_path=..., not both"):
        lp.Runtime("a", model_path="b")
    with pytest.raises(TypeError, match="config must be a RuntimeConfig"):
        lp.Runtime(config=LlamaCppConfig())


def test_the_keyword_signatures_are_kept():
    runtime = inspect.signature(lp.Runtime).parameters
    positional = ["model", "device", "dtype", "max_total_tokens", "radix_cache", "eviction"]
    assert [n for n, p in runtime.items() if p.kind is p.POSITIONAL_OR_KEYWORD] == [
        *positional,
        "load_format",
    ]
    assert runtime["model_path"].kind is inspect.Parameter.KEYWORD_ONLY
    assert runtime["max_running_requests"].default == 64 and runtime["config"].default is None
    assert {f.name for f in fields(RuntimeConfig)} | {"model_path", "config"} == set(runtime)
    llama = inspect.signature(lp.LlamaCpp).parameters
    assert list(llama)[0] == "model" and llama["n_ctx"].default == 4096
    assert llama["n_ctx"].kind is inspect.Parameter.KEYWORD_ONLY
    inspect.signature(lp.Runtime).bind(None, "cpu", page_size=2, model_path=None)


def test_config_form_and_aliases_fill_the_same_config():
    of = RuntimeConfig.of_call
    base = RuntimeConfig(model="m", page_size=4)
    assert of("Runtime", (), {}, base) is base
    assert of("Runtime", (), {"page_size": 8}, base) == RuntimeConfig(model="m", page_size=8)
    assert of("Runtime", (), {"model_path": "m", "page_size": 4}) == base
    assert of("Runtime", ("m",), {"model_path": None, "page_size": 4}) == base
    assert RuntimeConfig(speculative="ngram") == RuntimeConfig(
        speculative=SpeculativeConfig(method="ngram")
    )


def test_split_configs_equal_what_runtime_built_before():
    """The configs lp.Runtime's __init__ built from its keywords before RuntimeConfig."""
    kw = dict(
        page_size=2,
        radix_cache=False,
        eviction="lfu",
        kv_cache_dtype="fp8_e4m3",
        max_num_batched_tokens=512,
        max_running_requests=16,
        schedule_policy="fcfs",
        hybrid_batching=False,
        jump_forward=False,
        check_integrity=True,
        overlap=False,
        speculative={"method": "ngram", "num_tokens": 4},
        attention_sink_size=4,
        sliding_window_size=60,
        lora_paths={"a": "/x"},
        max_loras_per_batch=2,
        max_lora_rank=8,
        lora_target_modules="all",
        max_loaded_loras=5,
    )
    cfg = RuntimeConfig(**kw)
    assert cfg.cache_config() == CacheConfig(
        page_size=2, radix_cache=False, eviction="lfu", kv_cache_dtype="fp8_e4m3"
    )
    assert cfg.scheduler_config() == SchedulerConfig(
        max_num_batched_tokens=512,
        max_running_requests=16,
        schedule_policy="fcfs",
        hybrid_batching=False,
    )
    assert cfg.engine_config() == EngineConfig(
        jump_forward=False, check_integrity=True, overlap=False
    )
    assert cfg.speculative_config() == SpeculativeConfig.coerce(kw["speculative"])
    assert cfg.attention_sink_config() == AttentionSinkConfig(4, 60)
    assert cfg.lora_config() == LoraConfig(
        max_loras_per_batch=2, max_lora_rank=8, lora_target_modules="all", max_loaded_loras=5
    )
    assert cfg.lora_paths == (("a", "/x"),)
    tiers = RuntimeConfig(host_kv_cache_bytes=10, host_kv_staging=True, disk_kv_cache_bytes=20)
    assert tiers.cache_config() == CacheConfig(
        host_kv_cache_bytes=10, host_kv_staging=True, disk_kv_cache_bytes=20
    )
    default = RuntimeConfig()
    assert (default.cache_config(), default.scheduler_config()) == (
        CacheConfig(),
        SchedulerConfig(),
    )
    assert default.engine_config() == EngineConfig()
    assert default.speculative_config() is None and default.attention_sink_config() is None
    assert default.lora_config() is None
    assert RuntimeConfig(enable_lora=True).lora_config() == LoraConfig()
    # adapters combine with both parallelisms (each rank a shard, each replica all of them)
    assert RuntimeConfig(enable_lora=True, dp_size=2, tp_size=2).lora_config() == LoraConfig()


def test_computed_values_stay_out_of_the_config():
    """KV slots and the context length are computed at start-up, next to the config."""
    cfg = RuntimeConfig()
    assert cfg.max_total_tokens is None and cfg.context_length is None
    with pytest.raises(AttributeError):
        cfg.max_total_tokens = 4096  # type: ignore[misc]


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["LlamaCpp", "Runtime"])
def test_the_reference_examples_run(backend):
    """docs/reference.md's example of each backend's options runs as printed."""
    import importlib.util
    from pathlib import Path

    pytest.importorskip("llama_cpp" if backend == "LlamaCpp" else "torch")
    path = Path(__file__).resolve().parents[2] / "docs" / "gen_reference.py"
    spec = importlib.util.spec_from_file_location("gen_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    exec(compile(module.BACKEND_EXAMPLES[backend], f"<{backend} example>", "exec"), {})
