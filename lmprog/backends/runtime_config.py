"""RuntimeConfig: lp.Runtime's options, one typed field per knob (lmprog.backends.config
says how a field carries its help, SGLang's name and its `lmprog serve` flag).

    cfg = RuntimeConfig(model="smollm2-135m-instruct", max_running_requests=8)
    lp.Runtime(config=cfg)  # = lp.Runtime(model="smollm2-135m-instruct", max_running_requests=8)
    cfg.cache_config(), cfg.scheduler_config(), cfg.engine_config(), ...  # what it feeds

Imports the runtime's frozen subsystem configs only (no torch): the serve command line
builds its flags from it without loading the engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

from lmprog.backends.config import BackendConfig, Flag, knob, lora_path_items
from lmprog.runtime.config import (
    KV_CACHE_DTYPES,
    AttentionSinkConfig,
    CacheConfig,
    EngineConfig,
    LoraConfig,
    SchedulerConfig,
)
from lmprog.runtime.speculative.config import SpeculativeConfig

_LORA = "LoRA adapters are the runtime's"


@dataclass(frozen=True)
class RuntimeConfig(BackendConfig):
    """lp.Runtime's options: lmprog's engine on this machine (docs/reference.md lists them).

    Each one is validated here by the subsystem config that owns it (SchedulerConfig,
    CacheConfig, EngineConfig, AttentionSinkConfig, LoraConfig in lmprog.runtime.config,
    SpeculativeConfig), before any weight is loaded.
    """

    POSITIONAL: ClassVar[tuple[str, ...]] = (
        "model",
        "device",
        "dtype",
        "max_total_tokens",
        "radix_cache",
        "eviction",
        "load_format",
    )

    # ---- the model and its weights ----
    model: Any = knob(
        None,
        "bundled model name, .gguf path or Hugging Face folder (None: the bundled "
        "SmolLM2-135M-Instruct); with load_format='dummy' also an architecture preset such "
        "as 'llama-3.1-8b'",
        sglang="model_path",
        alias="model_path",
        serve="--model",
    )
    device: str = knob(
        "auto",
        "auto (CUDA if available, else CPU), cpu, cuda, cuda:N",
        sglang="device",
        flag=Flag(
            ("--device",),
            llamacpp="cuda/gpu/metal offloads every layer, auto does when llama.cpp has GPU "
            "support",
        ),
    )
    dtype: str = knob(
        "auto", "auto (bf16 on a GPU, fp32 on a CPU), float32, bfloat16, float16", sglang="dtype"
    )
    load_format: str = knob(
        "auto",
        "auto (from the files) or dummy (random weights, for benchmarks)",
        sglang="load_format",
    )
    quantization: str | None = knob(
        None,
        "weights: int4 (4-bit weight-only matmuls on the CPU, for a Q4_1 GGUF; "
        "lmprog.runtime.layers.int4) or fp8 (e4m3 weights and per-token activations, "
        "torch._scaled_mm on an Ada/Hopper GPU; lmprog.runtime.layers.fp8_linear); an FP8 "
        "checkpoint loads as FP8 without it",
        sglang="quantization",
        flag=Flag(
            ("--quantization",),
            choices=("int4", "fp8"),
            runtime_only="llama.cpp runs the GGUF file's own quantization; pick a quantized "
            "GGUF (e.g. Q4_K_M) instead",
        ),
    )
    mmproj: str | None = knob(
        None,
        "a vision-language model's projector GGUF (llama.cpp's mmproj file) beside model= "
        "(its decoder's GGUF): the ViT and projector are read from it (LLaVA-1.5 'mlp', "
        "SmolVLM / Idefics3 'idefics3')",
    )
    seed: int = knob(0, "seed of the random weights of load_format='dummy'")
    tokenizer: Any = knob(
        None, "a Hugging Face tokenizer (needed for text prompts with an architecture preset)"
    )
    chat_template: str | None = knob(
        None,
        "a named template or jinja2 source overriding the model's own",
        sglang="chat_template",
    )
    context_length: int | None = knob(
        None, "longest sequence (None: the model's)", sglang="context_length"
    )
    attention: str = knob("auto", "attention kernels: auto, torch or triton")
    cuda_graphs: bool = knob(
        True, "replay CUDA graphs for decode steps (GPU with Triton attention only)"
    )
    num_threads: int | None = knob(
        None,
        "CPU threads (torch's, process-wide; None: leave torch's setting)",
        flag=Flag(("--num-threads",), llamacpp="n_threads, default half the cores"),
    )
    # ---- the KV cache (CacheConfig) ----
    max_total_tokens: int | None = knob(
        None,
        "KV cache size in tokens, per replica (None: from the memory budget)",
        sglang="max_total_tokens",
        flag=Flag(("--max-total-tokens",), llamacpp="the context size n_ctx"),
    )
    page_size: int = knob(
        1,
        "KV slots are allocated in pages of this many tokens; prefix matches round down to "
        "whole pages",
        sglang="page_size",
    )
    radix_cache: bool = knob(
        True, "share the KV of common prefixes between requests (RadixAttention)"
    )
    eviction: str = knob("lru", "which cached prefixes are evicted first: lru or lfu")
    kv_cache_dtype: str = knob(
        "auto",
        "KV cache: auto (the model's dtype) or fp8_e4m3 (fp8), half the bytes per token of "
        "bf16 (lmprog.runtime.executor.kv_pool)",
        sglang="kv_cache_dtype",
        flag=Flag(("--kv-cache-dtype",), choices=KV_CACHE_DTYPES, runtime_only=""),
    )
    host_kv_cache_bytes: int = knob(
        0,
        "a host-memory tier under the prefix cache, in bytes (pinned on CUDA): prefixes "
        "evicted from the KV pool are kept there and loaded back when a request returns to "
        "them (0: off, recomputed; lmprog.runtime.cache.hiradix; stats() reports host_kv_*)",
        flag=Flag(
            ("--host-kv-cache-bytes",),
            runtime_only="llama.cpp keeps saved states in its own RAM cache",
        ),
    )
    host_kv_staging: bool = knob(
        False,
        "with the host tier, load the host-tier prefixes of queued requests into the KV pool "
        "ahead of their admission (predictive staging; see docs/serving.md)",
    )
    disk_kv_cache_bytes: int = knob(
        0,
        "a disk tier of the KV cache, in bytes, under the host tier: what the host tier "
        "evicts, written to checked files and read back when a request returns to it (0: off)",
        flag=Flag(
            ("--disk-kv-cache-bytes",),
            llamacpp="the disk tier of the saved states evicted from memory "
            "(state_cache_disk_bytes)",
        ),
    )
    disk_kv_cache_dir: str | None = knob(
        None,
        "where the disk tier's files go, in a folder of this process's own (None: the "
        "system's temporary folder)",
        flag=Flag(("--disk-kv-cache-dir",), llamacpp="state_cache_disk_dir"),
    )
    # ---- the scheduler (SchedulerConfig) ----
    max_running_requests: int = knob(
        64,
        "requests decoded together, more wait",
        sglang="max_running_requests",
        flag=Flag(
            ("--max-running-requests",),
            default=None,
            llamacpp="n_parallel, default 16; 1 makes greedy outputs independent of load there",
        ),
    )
    max_num_batched_tokens: int = knob(
        2048,
        "tokens per step, shared by decodes and prefill chunks (>= max_running_requests)",
    )
    schedule_policy: str = knob(
        "lpm",
        "lpm (longest cached prefix first) or fcfs (arrival order)",
        sglang="schedule_policy",
    )
    hybrid_batching: bool = knob(
        True,
        "mix decodes and prefill chunks in one step; False runs prefill-first (decodes wait "
        "while prompts are pending), for comparison",
    )
    # ---- the engine (EngineConfig) ----
    jump_forward: bool = knob(True, "append constraint-forced text in one step")
    overlap: bool | None = knob(
        None,
        "overlap scheduling: the next step prepared and launched while the device runs the "
        "current one (None: on a GPU; lmprog.runtime.engine.engine)",
    )
    check_integrity: bool = knob(
        False, "verify the cache bookkeeping after every step (slow; for tests)"
    )
    # ---- speculative decoding (SpeculativeConfig) ----
    speculative: Any = knob(
        None,
        "speculative decoding, verified inside the hybrid batch: None (off), a "
        "SpeculativeConfig, a dict of its fields, or a method name (ngram: prompt lookup; "
        "draft: a draft model, with draft_model=...; eagle: an EAGLE-3 head, the one shipped "
        "for the bundled model unless draft_model names a head's folder; medusa: Medusa heads, "
        "draft_model=...); greedy outputs are unchanged, sampled ones keep the model's "
        "distribution",
    )
    # ---- parallelism ----
    dp_size: int = knob(
        1,
        "data parallelism: engine replicas behind this one backend, each request routed to the "
        "replica whose prefix cache likely holds most of it unless that one is much busier; "
        "replicas on one device share its weights (lmprog.runtime.data_parallel; see "
        "docs/serving.md)",
        sglang="dp_size",
        flag=Flag(
            ("--dp", "--dp-size"),
            runtime_only="llama.cpp runs one context per server; start several servers "
            "behind a load balancer instead",
        ),
    )
    tp_size: int = knob(
        1,
        "tensor parallelism: the model sharded over that many processes, one per device (rank "
        "r on cuda:r, or all on the CPU with gloo), spawned here or the other ranks of a "
        "torchrun launch (its world size), which serve rank 0 and never return; with dp_size, "
        "replica i's ranks on cuda:(i * tp_size + r) (lmprog.runtime.parallel, "
        "docs/serving.md)",
        sglang="tp_size",
        flag=Flag(
            ("--tp", "--tp-size"),
            runtime_only="llama.cpp splits a model over GPUs itself (its tensor_split), not "
            "through lmprog",
        ),
    )
    # ---- attention sinks (AttentionSinkConfig) ----
    attention_sink_size: int | None = knob(
        None,
        "attention sinks (StreamingLLM): each request keeps its first N tokens and a recent "
        "window of its KV, evicting the tokens between, so it generates past the context "
        "length with flat memory (None: off; Llama-family models, not with tp_size > 1 or "
        "LoRA adapters)",
        flag=Flag(
            ("--attention-sink-size",),
            runtime_only="lmprog's llama.cpp backend has no attention sinks: its requests end "
            "at the context size (n_ctx)",
        ),
    )
    sliding_window_size: int | None = knob(
        None,
        "with attention_sink_size: the recent window kept after the sinks (None: the context "
        "length, or the KV pool when smaller, minus the sinks)",
        flag=Flag(
            ("--sliding-window-size",),
            runtime_only="it is the attention sinks' window, and lmprog's llama.cpp backend "
            "has no attention sinks",
        ),
    )
    # ---- LoRA adapters (LoraConfig) ----
    lora_paths: Any = knob(
        None,
        "LoRA adapters to serve: {name: PEFT adapter folder}, or 'name=path' strings or "
        "folders (named by their path); a request picks one by name (SamplingParams.lora_path; "
        "over HTTP model=NAME or lora_path), more with load_lora_adapter; a malformed or "
        "mismatched folder is a LoraError; with tp_size > 1 each rank holds its shard of every "
        "adapter, with dp_size > 1 every replica serves them all; not with attention sinks "
        "yet (lmprog.runtime.lora)",
        sglang="lora_paths",
        flag=Flag(
            ("--lora-paths",),
            nargs="+",
            metavar="NAME=PATH",
            llamacpp="GGUF LoRA files or PEFT folders (lp.LlamaCpp's lora_paths)",
        ),
    )
    enable_lora: bool | None = knob(
        None,
        "serve LoRA adapters loaded later even without lora_paths (None: when lora_paths is given)",
        sglang="enable_lora",
        flag=Flag(("--enable-lora",), llamacpp="always on: adapters load at any time"),
    )
    max_loras_per_batch: int = knob(
        8,
        "LoRA adapters resident on the device at once",
        sglang="max_loras_per_batch",
        flag=Flag(("--max-loras-per-batch",), runtime_only=_LORA),
    )
    max_lora_rank: int | None = knob(
        None,
        "the adapter pool's rank (None: the largest of lora_paths, else 16)",
        sglang="max_lora_rank",
        flag=Flag(("--max-lora-rank",), runtime_only=_LORA),
    )
    lora_target_modules: Any = knob(
        None,
        "the projections adapters may adapt (q_proj ... down_proj, or all; None: those of "
        "lora_paths, else all)",
        sglang="lora_target_modules",
        flag=Flag(("--lora-target-modules",), nargs="+", runtime_only=_LORA),
    )
    max_loaded_loras: int | None = knob(
        None,
        "LoRA adapters loaded at once (None: no limit)",
        sglang="max_loaded_loras",
        flag=Flag(("--max-loaded-loras",), runtime_only=_LORA),
    )

    def __post_init__(self) -> None:
        # Normal forms, so that equal options give equal configs.
        set_ = object.__setattr__
        set_(self, "speculative", SpeculativeConfig.coerce(self.speculative))
        if self.mmproj is not None:
            if not isinstance(self.mmproj, (str, os.PathLike)) or not os.fspath(self.mmproj):
                raise TypeError(
                    f"mmproj must be a path to a .gguf file or None, got {self.mmproj!r}"
                )
            set_(self, "mmproj", os.fspath(self.mmproj))
        for name in ("dp_size", "tp_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        # Each knob validated by the config that owns it, before any weight is loaded.
        self.cache_config()
        self.scheduler_config()
        self.engine_config()
        self.attention_sink_config()
        set_(self, "lora_paths", tuple(lora_path_items(self.lora_paths)))
        if isinstance(self.lora_target_modules, list):
            set_(self, "lora_target_modules", tuple(self.lora_target_modules))
        self.lora_config()

    def cache_config(self) -> CacheConfig:
        return CacheConfig(
            page_size=self.page_size,
            radix_cache=self.radix_cache,
            eviction=self.eviction,  # type: ignore[arg-type]
            kv_cache_dtype=self.kv_cache_dtype,
            host_kv_cache_bytes=self.host_kv_cache_bytes,
            host_kv_staging=self.host_kv_staging,
            disk_kv_cache_bytes=self.disk_kv_cache_bytes,
            disk_kv_cache_dir=self.disk_kv_cache_dir,
        )

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_running_requests=self.max_running_requests,
            schedule_policy=self.schedule_policy,  # type: ignore[arg-type]
            hybrid_batching=self.hybrid_batching,
        )

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            jump_forward=self.jump_forward,
            check_integrity=self.check_integrity,
            overlap=self.overlap,
        )

    def speculative_config(self) -> SpeculativeConfig | None:
        return self.speculative

    def attention_sink_config(self) -> AttentionSinkConfig | None:
        """The attention sinks (None: off)."""
        if self.attention_sink_size is None:
            if self.sliding_window_size is not None:
                raise ValueError("sliding_window_size needs attention_sink_size (attention sinks)")
            return None
        sinks = AttentionSinkConfig(self.attention_sink_size, self.sliding_window_size)
        if self.tp_size > 1:
            raise ValueError("attention_sink_size does not support tp_size > 1 yet")
        return sinks

    def lora_config(self) -> LoraConfig | None:
        """The adapter pool (None: no LoRA)."""
        if self.enable_lora or (self.enable_lora is None and self.lora_paths):
            config = LoraConfig(
                max_loras_per_batch=self.max_loras_per_batch,
                max_lora_rank=self.max_lora_rank,
                lora_target_modules=self.lora_target_modules,
                max_loaded_loras=self.max_loaded_loras,
            )
            return config
        if self.lora_paths:
            raise ValueError("lora_paths with enable_lora=False: drop one of them")
        return None
