"""The in-process runtime as a backend: lmprog's own engine (paged KV, radix cache, hybrid
batching) behind the `Backend` protocol, plus an offline batch API.

    rt = Runtime()                                  # bundled SmolLM2-135M GGUF; CUDA if present
    rt.generate(GenerateRequest(...), stream=cb)    # the Backend protocol (the DSL uses this)
    rt.generate(["Hi", [1, 2, 3]], {"max_tokens": 8, "temperature": 0})   # offline batch
    rt.stats(); rt.flush_cache(); rt.shutdown()     # or: with Runtime() as rt: ...

Every call is thread-safe; concurrent calls are batched together by the engine thread.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Sequence
from typing import Any

from lmprog.backends.checks import check_score_request, check_stop_token_ids, check_stream
from lmprog.backends.scoring import choice_scores, choice_spans
from lmprog.core.chat import ChatTemplate, template_from_tokenizer
from lmprog.core.errors import BackendError, ConstraintError, LoraError
from lmprog.core.models import ModelSource, load_tokenizer, resolve_model
from lmprog.core.prompt import encode_prompt
from lmprog.core.protocol import (
    Backend,
    GenerateRequest,
    GenerateResult,
    ScoreRequest,
    ScoreResult,
    StreamCallback,
    TokenLogprob,
)
from lmprog.core.sampling import SamplingParams
from lmprog.core.text import check_text
from lmprog.fsm import warmup

# Special tokens that end a turn in common chat formats (llama.cpp treats them as end of
# generation too, so the two backends stop at the same place).
_END_OF_TURN = (
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "</s>",
)
_PREFILL_ONLY = SamplingParams(max_tokens=0)
_log = logging.getLogger(__name__)


class Runtime(Backend):
    """lmprog's engine on this machine.

    Args:
        model: bundled model name, .gguf path or Hugging Face folder (None: the default model);
            with load_format="dummy" also an architecture preset such as "llama-3.1-8b".
            `model_path=` is SGLang's name for it (`lp.Runtime(model_path=...)`).
        device: "auto" (CUDA if available, else CPU), "cpu", "cuda", "cuda:N".
        dtype: "auto" (bf16 on a GPU, fp32 on a CPU), "float32", "bfloat16", "float16".
        max_total_tokens: KV pool size in tokens (default: from the memory budget).
        radix_cache: share the KV of common prefixes between requests.
        eviction: "lru" or "lfu" eviction of cached prefixes.
        load_format: "auto" (from the files) or "dummy" (random weights, for benchmarks).
        chat_template: a named template or jinja2 source overriding the model's own.
        tokenizer: a HF tokenizer (needed for text prompts with an architecture preset).
        context_length: longest sequence (default: the model's).
        max_running_requests, max_num_batched_tokens, schedule_policy ("lpm"/"fcfs"),
            page_size: scheduler and cache knobs (see lmprog.runtime.config).
        hybrid_batching: mix decodes and prefill chunks in one step (default); False runs
            prefill-first (decodes wait while prompts are pending), for comparison.
        jump_forward: append constraint-forced text in one step (default on).
        overlap: overlap scheduling, the next step prepared and launched while the device
            runs the current one (None: on a GPU; see lmprog.runtime.engine.engine).
        quantization: None, or "int4": 4-bit weight-only matmuls on the CPU for layers whose
            weights are exact 4-bit groups (a Q4_1 GGUF): decode reads fewer bytes; computes in
            bf16 (see lmprog.runtime.layers.int4); or "fp8": e4m3 weights (per output channel) and
            per-token activations, torch._scaled_mm on an Ada/Hopper GPU, a PyTorch reference
            on the CPU (see lmprog.runtime.layers.fp8_linear). An FP8 checkpoint (vLLM's and
            SGLang's layout) loads as FP8 without it.
        kv_cache_dtype: "auto" (the model's dtype) or "fp8_e4m3" ("fp8"): the KV pool stores
            e4m3 keys and values, twice the tokens in the same memory (lmprog.runtime.executor.kv_pool).
        host_kv_cache_bytes: a host-memory tier of this many bytes under the radix cache
            (pinned on CUDA; 0: off): prefixes evicted from the KV pool are kept there and
            loaded back when a request returns to them, instead of being recomputed
            (lmprog.runtime.cache.hiradix). stats() reports its usage and hits (host_kv_*).
        host_kv_staging: with the host tier, load the host-tier prefixes of queued requests
            into the KV pool ahead of their admission (predictive staging; default off: see docs/serving.md).
        disk_kv_cache_bytes, disk_kv_cache_dir: a disk tier of this many bytes under the host
            tier (0: off), its files in a folder of this process's own under
            disk_kv_cache_dir (default: the system's temporary folder): what the host tier
            evicts is written there and read back, checked, when a request returns to it.
        attention: "auto", "torch" or "triton".
        cuda_graphs: replay CUDA graphs for decode steps (GPU with Triton attention only).
        num_threads: torch CPU threads (process-wide; default: leave torch's setting).
        seed: seed of the random weights of load_format="dummy".
        check_integrity: verify the cache bookkeeping after every step (slow; for tests).
        speculative: speculative decoding, verified inside the hybrid batch: None (off), a
            `lmprog.runtime.speculative.SpeculativeConfig`, a dict of its fields, or a method
            name ("ngram": prompt lookup; "draft": a draft model, with draft_model=...).
            Greedy outputs are unchanged; sampled outputs keep the model's distribution.
        dp_size: data parallelism, that many engine replicas behind this one backend, each
            request routed to the replica whose prefix cache likely holds most of it unless
            that one is much busier (lmprog.runtime.data_parallel.replicas, lmprog.runtime.data_parallel.router);
            replicas on one device share its weights. max_total_tokens is per replica.
        tp_size: tensor parallelism over that many processes, one per device (rank r on
            cuda:r, or all on the CPU with gloo): workers are spawned here, or are the other
            processes of a `torchrun` launch, whose non-zero ranks never return from this
            call (they serve rank 0, then exit); see lmprog.runtime.parallel. With dp_size,
            each replica is such a group (replica i's ranks on cuda:(i * tp_size + r)), its
            workers spawned here (not under torchrun).
        attention_sink_size: attention sinks (StreamingLLM): keep each request's first
            this many tokens plus a recent window of its KV, evicting the tokens between in
            chunks (the kept keys re-rotated), so generation runs past the context length
            and max_total_tokens with flat memory (None: off; requests are cut at the
            context length). Llama-family models only; not with tp_size > 1.
        sliding_window_size: the recent window kept after the sinks (default: the context
            length, or the KV pool when smaller, minus the sinks); see
            lmprog.runtime.config.AttentionSinkConfig.
        lora_paths: LoRA adapters to serve (SGLang's name): {name: PEFT adapter folder}, or
            a list of "name=path" strings or of folders (named by their path). A request
            picks one by name (`SamplingParams.lora_path`, the DSL's `run(lora_path=...)`,
            `gen(..., lora_path=...)`), or none (the base model); requests of different
            adapters run in one batch (lmprog.runtime.lora). More can be loaded later
            (`load_lora_adapter`). A malformed or mismatched folder is a LoraError.
        enable_lora: serve adapters loaded later even when lora_paths is empty (None: when
            lora_paths is given).
        max_loras_per_batch, max_lora_rank, lora_target_modules, max_loaded_loras: the
            adapter pool (lmprog.runtime.config.LoraConfig). Not with tp_size > 1, dp_size
            > 1 or attention sinks yet; with speculative decoding the target verifies each
            request's drafts under its adapter (a draft model drafts without it).

    Each engine knob keeps its name down to the config that owns and validates it:
    SchedulerConfig, CacheConfig and AttentionSinkConfig (lmprog.runtime.config),
    EngineConfig (lmprog.runtime.engine.engine), SpeculativeConfig.
    """

    def __init__(
        self,
        model: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        max_total_tokens: int | None = None,
        radix_cache: bool = True,
        eviction: str = "lru",
        load_format: str = "auto",
        *,
        model_path: str | None = None,
        chat_template: str | None = None,
        tokenizer: Any = None,
        context_length: int | None = None,
        max_running_requests: int = 64,
        max_num_batched_tokens: int = 2048,
        schedule_policy: str = "lpm",
        hybrid_batching: bool = True,
        overlap: bool | None = None,
        page_size: int = 1,
        jump_forward: bool = True,
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
        host_kv_cache_bytes: int = 0,
        host_kv_staging: bool = False,
        disk_kv_cache_bytes: int = 0,
        disk_kv_cache_dir: str | None = None,
        attention: str = "auto",
        cuda_graphs: bool = True,
        num_threads: int | None = None,
        seed: int = 0,
        check_integrity: bool = False,
        speculative: Any = None,
        dp_size: int = 1,
        tp_size: int = 1,
        attention_sink_size: int | None = None,
        sliding_window_size: int | None = None,
        lora_paths: Any = None,
        enable_lora: bool | None = None,
        max_loras_per_batch: int = 8,
        max_lora_rank: int | None = None,
        lora_target_modules: Any = None,
        max_loaded_loras: int | None = None,
    ) -> None:
        import torch

        from lmprog.runtime.assemble import assemble_model, quantization_of
        from lmprog.runtime.config import AttentionSinkConfig, CacheConfig, SchedulerConfig
        from lmprog.runtime.data_parallel.replicas import check_dp_size, launch_replicas
        from lmprog.runtime.engine.engine import EngineConfig
        from lmprog.runtime.engine.launch import launch_engine
        from lmprog.runtime.parallel.start import check_tp_size, start_groups
        from lmprog.runtime.speculative.config import SpeculativeConfig

        if model_path is not None:  # SGLang's name for the model
            if model is not None:
                raise TypeError("give the model once: model=... or model_path=..., not both")
            model = model_path
        # Every knob is validated by the config that owns it, before any weight is loaded.
        spec_config = SpeculativeConfig.coerce(speculative)
        check_dp_size(dp_size)
        check_tp_size(tp_size, dp_size)
        cache_config = CacheConfig(
            page_size=page_size,
            radix_cache=radix_cache,
            eviction=eviction,
            kv_cache_dtype=kv_cache_dtype,
            host_kv_cache_bytes=host_kv_cache_bytes,
            host_kv_staging=host_kv_staging,
            disk_kv_cache_bytes=disk_kv_cache_bytes,
            disk_kv_cache_dir=disk_kv_cache_dir,
        )
        scheduler_config = SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens,
            max_running_requests=max_running_requests,
            schedule_policy=schedule_policy,
            hybrid_batching=hybrid_batching,
        )
        engine_config = EngineConfig(
            jump_forward=jump_forward, check_integrity=check_integrity, overlap=overlap
        )
        sinks = None
        if attention_sink_size is not None:
            sinks = AttentionSinkConfig(attention_sink_size, sliding_window_size)
            if tp_size > 1:
                raise ValueError("attention_sink_size does not support tp_size > 1 yet")
        elif sliding_window_size is not None:
            raise ValueError("sliding_window_size needs attention_sink_size (attention sinks)")
        lora_named = lora_path_items(lora_paths)
        lora_config = None
        if enable_lora or (enable_lora is None and lora_named):
            from lmprog.runtime.config import LoraConfig

            lora_config = LoraConfig(
                max_loras_per_batch=max_loras_per_batch,
                max_lora_rank=max_lora_rank,
                lora_target_modules=lora_target_modules,
                max_loaded_loras=max_loaded_loras,
            )
            if dp_size > 1:
                raise LoraError("LoRA adapters do not work with dp_size > 1 yet; use dp_size=1")
        elif lora_named:
            raise ValueError("lora_paths with enable_lora=False: drop one of them")
        self._source = _source_of(model, load_format)
        started = time.perf_counter()
        if self._source is not None:
            _log.info(
                "model %s resolved: %s (%s)",
                self._source.name,
                self._source.path,
                self._source.kind,
            )
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        _log.info("loading weights (device %s, dtype %s)", device, dtype)
        weights = dict(
            dtype=dtype,
            load_format=load_format,
            attention=attention,
            quantization=quantization,
            seed=seed,
        )
        groups = []  # tensor parallelism: this process is rank 0 of each replica's group
        if tp_size > 1:
            build_args = {"model": self._source or model, **weights}
            groups = start_groups(dp_size, tp_size, build_args, device=device)
        tp = groups[0] if groups else None

        def build(on: str, tp: Any = tp) -> Any:
            return assemble_model(self._source or model, device=on, tp=tp, **weights)

        net = build(device)
        self.quantization = quantization_of(net)  # an FP8 checkpoint's too
        self.kv_cache_dtype = kv_cache_dtype
        self.model_config = net.config
        self.device, self.dtype = next(net.parameters()).device, next(net.parameters()).dtype
        _log.info(
            "weights loaded on %s (%s) in %.1f s",
            self.device,
            self.dtype,
            time.perf_counter() - started,
        )
        self._setup_tokens(net.config, tokenizer, chat_template)
        _log.info("tokenizer %s", type(self._tokenizer).__name__)

        adapters = []
        if lora_config is not None:
            from lmprog.runtime.lora import read_adapter

            adapters = [read_adapter(p, net.config, name=n) for n, p in lora_named]

        def launch(net: Any, **kw: Any) -> Any:
            return launch_engine(
                net,
                self._tokenizer,
                eos_token_ids=self._eos_ids,
                max_total_tokens=max_total_tokens,
                context_length=context_length,
                cache_config=cache_config,
                scheduler_config=scheduler_config,
                engine_config=engine_config,
                cuda_graphs=cuda_graphs,
                speculative=spec_config,
                attention_sinks=sinks,
                lora=lora_config,
                lora_adapters=adapters,
                **kw,
            )

        self._engine = (
            launch(net, tp=tp)
            if dp_size == 1
            else launch_replicas(
                dp_size, net, device=device, build=build, launch=launch, groups=groups
            )
        )
        self._radix = radix_cache
        _log.info("runtime backend ready in %.1f s", time.perf_counter() - started)
        weakref.finalize(self, self._engine.shutdown)

    def _setup_tokens(self, config: Any, tokenizer: Any, chat_template: str | None) -> None:
        """Tokenizer, chat template source, end-of-sequence ids, BOS and start token."""
        if tokenizer is None and self._source is not None:
            tokenizer = load_tokenizer(self._source)
        if tokenizer is not None:
            warmup.start(tokenizer)  # the constraint set-up, off this thread
        self._tokenizer = tokenizer
        self._template_override = chat_template
        self._template: ChatTemplate | None = None
        self._vocab = config.vocab_size
        self._eos_ids = _eos_ids(config, tokenizer)
        bos = config.bos_token_id
        if bos is None and tokenizer is not None:
            bos = getattr(tokenizer, "bos_token_id", None)
        self._bos = bos
        self._add_bos = bool(getattr(tokenizer, "add_bos_token", False)) and bos is not None
        self._start_id = bos if bos is not None else self._eos_ids[0]

    # ---- Backend protocol -----------------------------------------------------------------
    @property
    def chat_template(self) -> ChatTemplate:
        if self._template is None:  # built on first use: a preset without tokenizer has none
            self._template = template_from_tokenizer(
                self._need_tokenizer(), self._template_override
            )
        return self._template

    @property
    def tokenizer(self) -> Any:
        return self._need_tokenizer()

    @property
    def engine(self) -> Any:
        """The lmprog.runtime.engine.engine.Engine (submit/abort/check_integrity/flush_cache); with
        dp_size > 1 a lmprog.runtime.data_parallel.replicas.ReplicaGroup (submit, stats, flush_cache,
        check_integrity; each engine in `.replicas`)."""
        return self._engine

    @property
    def model_name(self) -> str:
        return self._source.name if self._source is not None else "dummy"

    def generate(
        self,
        request: Any,
        sampling_params: Any = None,
        *,
        stream: StreamCallback | None = None,
        logprob_start_len: int | None = None,
    ) -> Any:
        """Two forms.

        generate(GenerateRequest, stream=None) -> GenerateResult: the Backend protocol.
        generate(prompts, sampling_params=None, *, logprob_start_len=None): offline. A prompt
            is a str or a list of token ids; `prompts` one prompt or a list of them;
            `sampling_params` a SamplingParams or dict, or a list with one per prompt.
            Returns an EngineResult (a GenerateResult with `prompt_logprobs` when
            logprob_start_len is given), or a list of them for a list of prompts.
        """
        if isinstance(request, GenerateRequest):
            if stream is None and callable(sampling_params):
                stream = sampling_params
            elif sampling_params is not None:
                raise TypeError("generate(GenerateRequest) takes its parameters from the request")
            return self._generate_one(request, stream)
        if stream is not None:
            raise TypeError(
                "stream= goes with generate(GenerateRequest); offline generate "
                "returns whole results"
            )
        return self._generate_offline(request, sampling_params, logprob_start_len)

    def score(self, request: ScoreRequest) -> ScoreResult:
        """Logprobs of each choice after the prompt (token healing as in ScoreRequest): the
        shared prompt is prefilled once into the radix cache, then every choice (and its
        unconditional twin) is scored in one batched prefill from prompt logprobs."""
        check_score_request(request)
        prompt = self._encode(request.prompt)
        spans, uncond = choice_spans(request, prompt, self._encode, self._start_id)
        shared = min(start for _, start in spans) - 1
        cached = 0
        prefill = _PREFILL_ONLY
        if request.lora_path is not None:
            prefill = SamplingParams(max_tokens=0, lora_path=request.lora_path)
        if self._radix and shared > 0:
            cached = self._run(spans[0][0][:shared], prefill).cached_tokens
        choices = choice_scores(spans, uncond, self._score_spans(spans + uncond, prefill))
        return ScoreResult(choices=choices, prompt_tokens=len(prompt), cached_tokens=cached)

    def prompt_logprobs(
        self, prompt_ids: Sequence[int], start: int, top_logprobs_num: int = 0
    ) -> tuple[TokenLogprob, ...]:
        """Logprobs of the prompt's tokens from position `start` on (see Backend): a
        prefill with zero output tokens recording them (`generate(logprob_start_len=)`)."""
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            raise ValueError(f"start must be an int >= 1, got {start!r}")
        ids = list(prompt_ids)
        if start >= len(ids):
            return ()
        params = SamplingParams(max_tokens=0, top_logprobs_num=top_logprobs_num)
        result = self.generate([ids], params, logprob_start_len=start - 1)[0]
        return tuple(result.prompt_logprobs or ())

    def cache_prefix(self, prompt: str) -> None:
        """Prefill `prompt` with zero output tokens; its KV stays in the radix cache."""
        if not isinstance(prompt, str):
            raise TypeError(f"cache_prefix takes a str, got {type(prompt).__name__}")
        ids = self._encode(prompt)
        if ids and self._radix:
            self._run(ids, _PREFILL_ONLY)

    def stats(self) -> dict[str, Any]:
        """Engine metrics: cache_hit_rate, gen_tokens_per_s, num_running/num_waiting,
        kv_usage, requests_finished by reason, ... (see lmprog.runtime.engine.metrics), and the
        process's constraint lexer renewals (`lmprog.fsm.index.lexer_renewals`)."""
        from lmprog.fsm.index import lexer_renewals

        out = self._engine.stats()
        out.update(
            model=self.model_name,
            device=str(self.device),
            dtype=str(self.dtype),
            quantization=self.quantization,
            kv_cache_dtype=self.kv_cache_dtype,
            constraint_lexer_renewals=lexer_renewals(),
        )
        return out

    # ---- LoRA adapters ---------------------------------------------------------------------
    def load_lora_adapter(self, name: str, path: str) -> dict[str, Any]:
        """Load the PEFT adapter folder `path` as `name` (SGLang's and vLLM's
        load_lora_adapter); its description (name, path, rank, target_modules). LoraError
        when it cannot be served; the loaded adapters keep serving either way."""
        return self._engine.load_lora_adapter(name, path)

    def unload_lora_adapter(self, name: str) -> None:
        """Unload adapter `name`; requests using it finish with it. LoraError when unknown."""
        self._engine.unload_lora_adapter(name)

    def lora_adapters(self) -> list[dict[str, Any]]:
        """The loaded adapters (name, path, rank, target_modules); [] without LoRA."""
        lister = getattr(self._engine, "lora_adapters", None)
        return [] if lister is None else lister()

    def flush_cache(self) -> bool:
        """Empty the radix cache (e.g. between benchmark phases); False while requests run."""
        return self._engine.flush_cache()

    def shutdown(self) -> None:
        self._engine.shutdown()

    # ---- internals ------------------------------------------------------------------------
    def _generate_one(
        self, request: GenerateRequest, stream: StreamCallback | None
    ) -> GenerateResult:
        check_stream(stream)
        ids = self._prompt_ids(request.prompt)
        self._check_params(request.params)
        guide = self._guide(request.constraint)
        return self._run(ids, request.params, guide=guide, stream=stream)

    def _generate_offline(
        self, prompts: Any, sampling_params: Any, logprob_start_len: int | None
    ) -> Any:
        single = isinstance(prompts, str) or (
            isinstance(prompts, (list, tuple))
            and prompts
            and not isinstance(prompts[0], (str, list, tuple))
        )
        batch = [prompts] if single else list(prompts)
        if not batch:
            raise ValueError("generate needs at least one prompt")
        params = _params_list(sampling_params, len(batch))
        from lmprog.runtime.engine.io import EngineRequest

        requests = []
        for prompt, p in zip(batch, params):
            ids = self._prompt_ids(prompt)
            self._check_params(p)
            start = None
            if logprob_start_len is not None:
                start = min(max(0, logprob_start_len), len(ids) - 1)
            requests.append(
                EngineRequest(tuple(ids), p, prompt_logprob_start=start, lora=p.lora_path)
            )
        results = self._wait_all(self._submit_all(requests))
        return results[0] if single else results

    def _submit_all(self, requests: list[Any]) -> list[Any]:
        """Submit every request, or none: if one is rejected the others are aborted."""
        handles: list[Any] = []
        try:
            for r in requests:
                handles.append(None if r is None else self._engine.submit(r, stream=False))
        except BaseException:
            _abort_unfinished(handles)
            raise
        return handles

    @staticmethod
    def _wait_all(handles: list[Any]) -> list[Any]:
        """Every result (None for a None handle); the first error is raised once all ended."""
        results, error = [], None
        try:
            for h in handles:
                try:
                    results.append(None if h is None else h.result())
                except Exception as exc:  # noqa: BLE001 - raised below, after the others
                    error = error or exc
                    results.append(None)
        finally:
            _abort_unfinished(handles)  # interrupted while waiting
        if error is not None:
            raise error
        return results

    def _run(
        self,
        ids: Sequence[int],
        params: SamplingParams,
        *,
        guide: Any = None,
        stream: StreamCallback | None = None,
        prompt_logprob_start: int | None = None,
    ) -> Any:
        from lmprog.runtime.engine.io import EngineRequest

        handle = self._engine.submit(
            EngineRequest(tuple(ids), params, guide, prompt_logprob_start, params.lora_path),
            stream=stream is not None,
        )
        try:
            if stream is not None:
                for piece in handle.pieces():
                    stream(piece)
            return handle.result()
        finally:
            if not handle.done:  # the stream callback raised, or the caller was interrupted
                handle.abort()

    def _score_spans(
        self, spans: list[tuple[list[int], int]], params: SamplingParams = _PREFILL_ONLY
    ) -> list[tuple[float, ...]]:
        """Logprobs of tokens[start:] for every (tokens, start), all submitted at once."""
        from lmprog.runtime.engine.io import EngineRequest

        requests = [
            EngineRequest(tuple(t), params, None, s - 1, params.lora_path) if s < len(t) else None
            for t, s in spans
        ]
        results = self._wait_all(self._submit_all(requests))
        return [
            tuple(lp.logprob for lp in r.prompt_logprobs) if r is not None else () for r in results
        ]

    def _encode(self, text: str) -> list[int]:
        check_text(text, "the prompt")
        ids = encode_prompt(self._need_tokenizer(), text)
        if self._add_bos and (not ids or ids[0] != self._bos):
            ids.insert(0, self._bos)
        return ids

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            ids = self._encode(prompt)
        elif isinstance(prompt, (tuple, list)):
            ids = list(prompt)
            for t in ids:
                if isinstance(t, bool) or not hasattr(t, "__index__") or not 0 <= t < self._vocab:
                    raise ValueError(
                        f"prompt token ids must be ints in [0, {self._vocab}), got {t!r}"
                    )
            ids = [int(t) for t in ids]
        else:
            raise TypeError(
                f"a prompt is a str or a list of token ids, got {type(prompt).__name__}"
            )
        return ids or [self._start_id]  # an empty prompt continues from the start token

    def _check_params(self, params: Any) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(
                f"sampling parameters must be a SamplingParams, got {type(params).__name__}"
            )
        if params.stop and self._tokenizer is None:
            raise BackendError(
                "stop strings need a tokenizer; pass tokenizer=... or use stop_token_ids"
            )
        check_stop_token_ids(params, self._vocab)

    def _guide(self, constraint: Any) -> Any:
        if constraint is None:
            return None
        try:
            from lmprog.fsm.index import TokenIndex
        except ImportError as exc:
            raise ConstraintError(f"constrained decoding needs lmprog.fsm: {exc}") from exc
        return TokenIndex.get(constraint, self._need_tokenizer()).new_guide()

    def _need_tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise BackendError(
                "this Runtime has no tokenizer (a dummy architecture preset); "
                "pass tokenizer=... or use token-id prompts"
            )
        return self._tokenizer

    def __repr__(self) -> str:
        return (
            f"Runtime(model={self.model_name!r}, device={str(self.device)!r}, "
            f"radix_cache={self._radix})"
        )


def lora_path_items(lora_paths: Any) -> list[tuple[str, str]]:
    """(name, path) pairs of `lora_paths`: a dict {name: path}, or a list of "name=path"
    strings or of paths (named by the path, as SGLang names them), or None."""
    if lora_paths is None:
        return []
    if isinstance(lora_paths, str):
        lora_paths = [lora_paths]
    if isinstance(lora_paths, dict):
        items = list(lora_paths.items())
    elif isinstance(lora_paths, (list, tuple)):
        items = []
        for entry in lora_paths:
            if not isinstance(entry, str):
                raise TypeError(f"lora_paths entries are 'name=path' strings, got {entry!r}")
            name, eq, path = entry.partition("=")
            items.append((name, path) if eq else (entry, entry))
    else:
        raise TypeError(
            f"lora_paths must be a dict {{name: path}} or a list of 'name=path', got "
            f"{type(lora_paths).__name__}"
        )
    names = [n for n, _ in items]
    for name, path in items:
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ValueError(f"a LoRA adapter needs a name and a path, got {name!r}={path!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"lora_paths names an adapter twice: {names}")
    return items


def _source_of(model: Any, load_format: str) -> ModelSource | None:
    """The model's files, or None for an architecture preset with random weights."""
    if isinstance(model, ModelSource):
        return model
    if load_format == "dummy" and isinstance(model, str):
        from lmprog.runtime.models import PRESETS

        if model.lower() in PRESETS:
            return None
    return resolve_model(model)


def _eos_ids(config: Any, tokenizer: Any) -> tuple[int, ...]:
    ids = set(config.eos_token_ids)
    if tokenizer is not None:
        if getattr(tokenizer, "eos_token_id", None) is not None:
            ids.add(tokenizer.eos_token_id)
        vocab = tokenizer.get_vocab()
        special = set(getattr(tokenizer, "all_special_ids", ()))
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        special |= {i for i, t in added.items() if getattr(t, "special", False)}
        ids |= {vocab[t] for t in _END_OF_TURN if t in vocab and vocab[t] in special}
    if not ids:
        raise BackendError("the model declares no end-of-sequence token; pass a tokenizer")
    return tuple(sorted(ids))


def _abort_unfinished(handles: list[Any]) -> None:
    for h in handles:
        if h is not None and not h.done:
            h.abort()


def _params_list(sampling_params: Any, n: int) -> list[SamplingParams]:
    def one(p: Any) -> SamplingParams:
        if p is None:
            return SamplingParams()
        if isinstance(p, SamplingParams):
            return p
        if isinstance(p, dict):
            return SamplingParams().merged(p)
        raise TypeError(f"sampling_params must be a SamplingParams or dict, got {type(p).__name__}")

    if isinstance(sampling_params, (list, tuple)):
        if len(sampling_params) != n:
            raise ValueError(f"got {len(sampling_params)} sampling_params for {n} prompts")
        return [one(p) for p in sampling_params]
    return [one(sampling_params)] * n
