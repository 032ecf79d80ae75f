"""The in-process runtime as a backend: lmprog's own engine (paged KV, radix cache, hybrid
batching) behind the `Backend` protocol, plus an offline batch API.

    rt = Runtime()                                  # bundled SmolLM2-135M GGUF; CUDA if present
    rt.generate(GenerateRequest(...), stream=cb)    # the Backend protocol (the DSL uses this)
    rt.generate_offline(["Hi", [1, 2, 3]], {"max_tokens": 8, "temperature": 0})   # offline batch
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
from lmprog.backends.runtime_config import RuntimeConfig, lora_path_items  # noqa: F401 (re-exported)
from lmprog.backends.scoring import choice_scores, choice_spans
from lmprog.core.chat import ChatTemplate, template_from_tokenizer
from lmprog.core.errors import BackendError, ConstraintError
from lmprog.core.models import ModelSource, load_tokenizer, resolve_model
from lmprog.core.prompt import encode_prompt
from lmprog.core.protocol import (
    Backend,
    GenerateRequest,
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

        lp.Runtime("smollm2-135m-instruct", max_running_requests=8)   # or model_path=...
        lp.Runtime(config=RuntimeConfig(model="smollm2-135m-instruct", max_running_requests=8))

    Its options are the fields of `lmprog.backends.runtime_config.RuntimeConfig`, each with its
    default, SGLang's name and help (the table in docs/reference.md): the model and its
    weights, the KV cache, the scheduler, the engine, speculative decoding, data and tensor
    parallelism, attention sinks and LoRA adapters. Every option is validated by the config
    that owns it before any weight is loaded; an unknown name is a TypeError naming it.
    `self.config` is the RuntimeConfig it runs with.
    """

    def __init__(self, *args: Any, config: Any = None, **options: Any) -> None:
        self.config = cfg = RuntimeConfig.of_call("Runtime", args, options, config)
        from lmprog.runtime.assemble import quantization_of
        from lmprog.runtime.parallel.start import check_tp_size

        check_tp_size(cfg.tp_size, cfg.dp_size)  # under torchrun, one group
        self._source = _source_of(cfg.model, cfg.load_format)
        if cfg.tp_size > 1:
            _check_tp_model(self._source, cfg.mmproj)
        started = time.perf_counter()
        if self._source is not None:
            _log.info(
                "model %s resolved: %s (%s)",
                self._source.name,
                self._source.path,
                self._source.kind,
            )
        build, groups = self._weights(cfg)
        net = build(cfg.device)
        self.quantization = quantization_of(net)  # an FP8 checkpoint's too
        self.kv_cache_dtype = cfg.kv_cache_dtype
        self.model_config = net.config
        self.device, self.dtype = next(net.parameters()).device, next(net.parameters()).dtype
        _log.info(
            "weights loaded on %s (%s) in %.1f s",
            self.device,
            self.dtype,
            time.perf_counter() - started,
        )
        self._setup_tokens(net.config, cfg.tokenizer, cfg.chat_template)
        _log.info("tokenizer %s", type(self._tokenizer).__name__)
        self._images = self._image_processor(net.config)
        self._engine = self._launch(cfg, net, build, groups)
        self._radix = cfg.radix_cache
        _log.info("runtime backend ready in %.1f s", time.perf_counter() - started)
        weakref.finalize(self, self._engine.shutdown)

    def _weights(self, cfg: RuntimeConfig) -> tuple[Any, list[Any]]:
        """build(device) -> the model, and the tensor-parallel groups started for it (this
        process is rank 0 of each replica's group; [] without tensor parallelism)."""
        import torch

        from lmprog.runtime.assemble import assemble_model
        from lmprog.runtime.parallel.start import start_groups

        if cfg.num_threads is not None:
            torch.set_num_threads(cfg.num_threads)
        _log.info("loading weights (device %s, dtype %s)", cfg.device, cfg.dtype)
        weights = dict(
            dtype=cfg.dtype,
            load_format=cfg.load_format,
            attention=cfg.attention,
            quantization=cfg.quantization,
            seed=cfg.seed,
            mmproj=cfg.mmproj,
        )
        model = self._source or cfg.model
        groups = []
        if cfg.tp_size > 1:
            build_args = {"model": model, **weights}
            groups = start_groups(cfg.dp_size, cfg.tp_size, build_args, device=cfg.device)
        tp = groups[0] if groups else None

        def build(on: str, tp: Any = tp) -> Any:
            return assemble_model(model, device=on, tp=tp, **weights)

        return build, groups

    def _launch(self, cfg: RuntimeConfig, net: Any, build: Any, groups: list[Any]) -> Any:
        """The engine over `net` (with dp_size > 1, a ReplicaGroup of them), fed the
        config's subsystem configs and the values computed at start-up."""
        from lmprog.runtime.data_parallel.replicas import launch_replicas
        from lmprog.runtime.engine.launch import launch_engine

        lora_config = cfg.lora_config()
        adapters = []
        if lora_config is not None:
            from lmprog.runtime.lora import read_adapter

            adapters = [read_adapter(p, net.config, name=n) for n, p in cfg.lora_paths]
        engine_args = {
            "eos_token_ids": self._eos_ids,
            "max_total_tokens": cfg.max_total_tokens,
            "context_length": cfg.context_length,
            "cache_config": cfg.cache_config(),
            "scheduler_config": cfg.scheduler_config(),
            "engine_config": cfg.engine_config(),
            "cuda_graphs": cfg.cuda_graphs,
            "speculative": cfg.speculative_config(),
            "attention_sinks": cfg.attention_sink_config(),
            "lora": lora_config,
            "lora_adapters": adapters,
        }

        def launch(net: Any, **kw: Any) -> Any:
            return launch_engine(net, self._tokenizer, **engine_args, **kw)

        if cfg.dp_size == 1:
            return launch(net, tp=groups[0] if groups else None)
        return launch_replicas(
            cfg.dp_size, net, device=cfg.device, build=build, launch=launch, groups=groups
        )

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

    def _image_processor(self, config: Any) -> Any:
        """A vision-language model's image processing (None for a text-only model, and for
        a VLM without a checkpoint folder: random weights of a preset)."""
        if getattr(config, "vision", None) is None or self._source is None:
            return None
        from lmprog.runtime.models.image_processing import ImageProcessor

        if self.config.mmproj is not None:  # GGUF + mmproj: the projector's metadata
            return ImageProcessor.for_mmproj(config, self.config.mmproj, self._tokenizer)
        if self._source.kind != "hf":
            raise ValueError(
                f"{self._source.path}: a vision-language model loads from its Hugging Face "
                "folder (safetensors, config.json, preprocessor_config.json), or from its "
                "GGUF with mmproj= (llama.cpp's projector file)"
            )
        return ImageProcessor.for_model(config, self._source.path, self._tokenizer)

    # ---- Backend protocol -----------------------------------------------------------------
    @property
    def image_token(self) -> str | None:
        """The model's image token text ("<image>" for LLaVA and SmolVLM): one per image in a
        prompt; None for a text-only model."""
        return None if self._images is None else str(self._images.image_token)

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
        self, request: GenerateRequest, stream: StreamCallback | None = None, **offline: Any
    ) -> Any:
        """The Backend protocol: one continuation of `request`; `stream` receives its text
        pieces as they are final.

        `generate(prompts, sampling_params, logprob_start_len=...)`, SGLang's offline Engine
        form, is `generate_offline` (given here anything but a GenerateRequest)."""
        if not isinstance(request, GenerateRequest):
            if callable(stream):
                raise TypeError(
                    "stream= goes with generate(GenerateRequest); offline generate "
                    "returns whole results"
                )
            return self.generate_offline(request, stream, **offline)
        if offline:
            raise TypeError(f"generate(GenerateRequest) takes no {sorted(offline)}")
        if stream is not None and not callable(stream):
            raise TypeError("generate(GenerateRequest) takes its parameters from the request")
        check_stream(stream)
        ids = self._prompt_ids(request.prompt)
        images: tuple[Any, ...] = ()
        if request.images or self._images is not None:  # a VLM checks the count: 0 == 0
            ids, images = self._image_prompt(ids, request.images)
        self._check_params(request.params)
        guide = self._guide(request.constraint)
        return self._run(ids, request.params, guide=guide, stream=stream, images=images)

    def generate_offline(
        self,
        prompts: Any,
        sampling_params: Any = None,
        *,
        logprob_start_len: int | None = None,
    ) -> Any:
        """Offline batch generation, as SGLang's Engine.generate: a prompt is a str or a list
        of token ids; `prompts` one prompt or a list of them; `sampling_params` a
        SamplingParams or dict, or a list with one per prompt. Returns an EngineResult (a
        GenerateResult with `prompt_logprobs` when logprob_start_len is given), or a list of
        them for a list of prompts. Every request is submitted at once and batched."""
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

    def score(self, request: ScoreRequest) -> ScoreResult:
        """Logprobs of each choice after the prompt (token healing as in ScoreRequest): the
        shared prompt is prefilled once into the radix cache, then every choice (and its
        unconditional twin) is scored in one batched prefill from prompt logprobs."""
        check_score_request(request)
        if request.images:  # scoring reads prompt logprobs, which no image prompt gives
            raise BackendError(
                "select() after an image cannot be scored by the runtime (prompt logprobs over "
                "image positions); constrain a gen instead, e.g. gen(regex='yes|no')"
            )
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
        prefill with zero output tokens recording them (`generate_offline(logprob_start_len=)`)."""
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            raise ValueError(f"start must be an int >= 1, got {start!r}")
        ids = list(prompt_ids)
        if start >= len(ids):
            return ()
        params = SamplingParams(max_tokens=0, top_logprobs_num=top_logprobs_num)
        result = self.generate_offline([ids], params, logprob_start_len=start - 1)[0]
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
        images: tuple[Any, ...] = (),
    ) -> Any:
        from lmprog.runtime.engine.io import EngineRequest

        request = EngineRequest(
            tuple(ids), params, guide, prompt_logprob_start, params.lora_path, images
        )
        handle = self._engine.submit(request, stream=stream is not None)
        try:
            if stream is not None:
                for piece in handle.pieces():
                    stream(piece)
            return handle.result()
        finally:
            if not handle.done:  # the stream callback raised, or the caller was interrupted
                handle.abort()

    def _image_prompt(
        self, ids: list[int], images: Sequence[Any]
    ) -> tuple[list[int], tuple[Any, ...]]:
        """The prompt's ids with each image token expanded to its image's tokens, and the
        images' runs (their pixels preprocessed here, in the caller's thread). ValueError for
        a text-only model, a count of image tokens that is not the images', an image that
        does not decode."""
        from lmprog.core.images import ImageInput

        if self._images is None:
            what = (
                "takes no images" if self.model_config.vision is None else "has no image processor"
            )
            raise ValueError(
                f"the model {self.model_name!r} {what} (Runtime.image_token is None); a request "
                "with images needs a vision-language model (LLaVA, Idefics3 / SmolVLM)"
            )
        for image in images:
            if not isinstance(image, ImageInput):
                raise TypeError(
                    f"GenerateRequest.images holds ImageInput, got {type(image).__name__}"
                )
        from lmprog.runtime.images import ImageRun

        prepared = [self._images.prepare(image) for image in images]
        expanded, positions = self._images.expand(ids, prepared)
        return expanded, tuple(ImageRun(p, pos) for p, pos in zip(prepared, positions))

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


# help(lp.Runtime) and inspect show every option by name, from RuntimeConfig's fields.
Runtime.__init__.__signature__ = RuntimeConfig.signature()  # type: ignore[attr-defined]


def _source_of(model: Any, load_format: str) -> ModelSource | None:
    """The model's files, or None for an architecture preset with random weights."""
    if isinstance(model, ModelSource):
        return model
    if load_format == "dummy" and isinstance(model, str):
        from lmprog.runtime.models import PRESETS

        if model.lower() in PRESETS:
            return None
    return resolve_model(model)


def _check_tp_model(source: ModelSource | None, mmproj: str | None = None) -> None:
    """ValueError before any tensor-parallel group starts for a model that cannot be sharded:
    a vision-language model (its step's image embeddings are not broadcast to the ranks)."""
    if source is None or (source.kind != "hf" and mmproj is None):
        return
    from lmprog.runtime.models import load_config

    if mmproj is not None or load_config(source).vision is not None:
        raise ValueError(
            f"{source.name} is a vision-language model, which does not run under tensor "
            "parallelism yet: use tp_size=1 (dp_size for more GPUs)"
        )


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
