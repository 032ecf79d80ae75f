"""The llama.cpp backend: CPU inference through llama-cpp-python, sampling in lmprog.

llama.cpp only evaluates tokens and hands back logits; everything else is lmprog's own and
shared with the in-process runtime: the HF tokenizer (so token ids agree with constraint
indexes), the batched sampler (every SamplingParams field) and the per-request decode state
(`lmprog.decoding`: finish rules, stop strings, constrained decoding with
jump-forward, logprobs, the result). Concurrent requests run together: one engine thread
decodes them in one llama.cpp batch per step, each in its own sequence of one context
(`llamacpp_engine.py`). Prefix reuse: a sequence keeps the common prefix of what it last
held or shares another sequence's, and a bytes-bounded LRU of saved states serves few-shot
headers, forks and multi-turn histories that other requests displaced.

    LlamaCpp(model=None, n_ctx=4096, n_threads=None, n_gpu_layers=0, ...)  # bundled SmolLM2-135M
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from lmprog.backends.checks import (
    check_generate_request,
    check_images,
    check_score_request,
    check_stop_token_ids,
)
from lmprog.backends.config import LlamaCppConfig
from lmprog.backends.context_pool import SequencePool
from lmprog.backends.llamacpp_engine import GenSpec, Job, LlamaCppEngine
from lmprog.backends.llamacpp_lora import LlamaCppAdapters
from lmprog.backends.llamacpp_native import NativeContext, NativeModel, supports_gpu_offload
from lmprog.backends.llamacpp_vision import ImageRun, NativeVision
from lmprog.backends.scoring import choice_scores, choice_spans
from lmprog.backends.shared import Counters
from lmprog.backends.state_cache import StateCache, common_prefix_len
from lmprog.core.chat import ChatTemplate, template_from_tokenizer
from lmprog.core.errors import BackendError, ConstraintError, ContextLengthError
from lmprog.core.models import (
    load_tokenizer,
    looks_like_hub_id,
    resolve_model,
    tokenizer_cache_path,
)
from lmprog.core.prompt import Prompt, control_spans, encode_prompt
from lmprog.core.protocol import (
    Backend,
    GenerateRequest,
    GenerateResult,
    ScoreRequest,
    ScoreResult,
    StreamCallback,
    TokenLogprob,
    TopLogprob,
)
from lmprog.core.text import check_text
from lmprog.core.tokenizer import META_FILE
from lmprog.decoding.arrays import NUMPY
from lmprog.decoding.decode_state import DecodeState
from lmprog.fsm import warmup

# torch is never imported here (1 s or more to import): the decoding package samples the
# llama.cpp logits as numpy arrays (DecodeState device=None), scores go through numpy too.

_log = logging.getLogger(__name__)

_TOKENIZER_SAMPLES = (
    "Hello, world!",
    " The capital of France is Paris.\n",
    "<|im_start|>user\n2+2=?<|im_end|>\n",
)


class LlamaCpp(Backend):
    """A GGUF model on llama.cpp. Thread-safe; up to `n_parallel` requests decode together.

    Its options are the fields of `lmprog.backends.config.LlamaCppConfig` (n_ctx, n_threads,
    n_gpu_layers, n_parallel, state_cache_bytes, ...; the table in docs/reference.md), by
    name (the model also first by position) or as `config=LlamaCppConfig(...)`; each is
    validated before the model loads, and an unknown name is a TypeError naming it.
    `self.config` is the LlamaCppConfig it runs with.
    """

    def __init__(self, *args: Any, config: Any = None, **options: Any):
        self.config = cfg = LlamaCppConfig.of_call("LlamaCpp", args, options, config)
        model, n_gpu_layers, main_gpu = cfg.model, cfg.n_gpu_layers, cfg.main_gpu
        _check_model_file(model)
        self._source = resolve_model(model)
        if self._source.kind != "gguf":
            raise BackendError(
                f"LlamaCpp needs a GGUF model; {self._source.path} is a Hugging Face folder (use Runtime)"
            )
        _check_gguf(self._source.path)
        mmproj = _mmproj_path(cfg.mmproj)
        _log.info("model %s resolved: %s", self._source.name, self._source.path)
        if (n_gpu_layers != 0 or main_gpu is not None) and not supports_gpu_offload():
            what = f"n_gpu_layers={n_gpu_layers}" if n_gpu_layers else f"main_gpu={main_gpu}"
            raise BackendError(
                f"{what} asks llama.cpp to put {self._source.path} on a GPU, but the installed "
                "llama-cpp-python is a CPU-only build (no GPU offload support): use "
                "n_gpu_layers=0, or reinstall llama-cpp-python with GPU support, e.g. "
                "CMAKE_ARGS='-DGGML_CUDA=on' (or -DGGML_METAL=on) pip install --force-reinstall "
                "--no-cache-dir llama-cpp-python"
            )
        # llama-cpp-python's defaults (llama_cpp.Llama): half the cores, all for prompts.
        cores = os.cpu_count() or 1
        self.n_threads = cfg.n_threads or max(cores // 2, 1)
        self.n_threads_batch = cfg.n_threads_batch or cores
        # The model first: a file llama.cpp cannot load fails here with llama.cpp's reason,
        # before a tokenizer is built from it. A tokenizer cached earlier is read meanwhile, on
        # a thread (llama.cpp loads the weights with the GIL released).
        cached_tokenizer = _read_cached_tokenizer(self._source)
        started = time.perf_counter()
        _log.info(
            "loading weights with llama.cpp (%d MiB, n_gpu_layers=%d)",
            self._source.path.stat().st_size // 2**20,
            n_gpu_layers,
        )
        self._model = NativeModel(self._source.path, n_gpu_layers=n_gpu_layers, main_gpu=main_gpu)
        _log.info("weights loaded in %.2f s", time.perf_counter() - started)
        ctx: NativeContext | None = None
        self._vision: NativeVision | None = None
        try:
            t = time.perf_counter()
            if cached_tokenizer is not None:
                self._tokenizer = cached_tokenizer.result()  # its constraint set-up started
            else:
                self._tokenizer = load_tokenizer(self._source)
                warmup.start(self._tokenizer)  # the constraint set-up, off this thread
            _log.info(
                "tokenizer %s loaded in %.2f s",
                type(self._tokenizer).__name__,
                time.perf_counter() - t,
            )
            self._chat_template = template_from_tokenizer(self._tokenizer, cfg.chat_template)
            ctx = NativeContext(
                self._model,
                n_ctx=cfg.n_ctx,
                n_batch=cfg.n_batch,
                n_seq=cfg.n_parallel,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads_batch,
            )
            if mmproj is not None:
                self._vision = NativeVision(
                    mmproj, self._model, n_threads=self.n_threads_batch, use_gpu=n_gpu_layers != 0
                )
                _log.info("vision projector %s loaded", mmproj)
            self._adapters = LlamaCppAdapters(self._model, self._source.path)
            for name, path in cfg.lora_paths:
                self._adapters.load(name, path)
        except BaseException:
            _release(ctx, self._model, self._vision)
            raise
        self._pool = SequencePool(
            ctx,
            StateCache(cfg.state_cache_bytes, cfg.state_cache_disk_bytes, cfg.state_cache_disk_dir),
            min_save_tokens=cfg.min_save_tokens,
        )
        self.n_ctx = ctx.n_ctx
        self.n_parallel = ctx.n_seq
        self.n_vocab = self._model.n_vocab
        eos = getattr(self._tokenizer, "eos_token_id", None)
        self._eos_ids = tuple(
            sorted(set(self._model.eog_token_ids) | ({eos} if eos is not None else set()))
        )
        bos = self._model.bos_token_id
        self._start_id = bos if bos >= 0 else self._eos_ids[0]
        self._jump_forward = cfg.jump_forward
        self._decoding = _Decoding(self._tokenizer, self._eos_ids, self.n_vocab)
        self._stats = Counters(_COUNTERS)
        self._closed = False
        self._check_tokenizer()
        # The engine thread frees the native memory when it ends: at shutdown, when the
        # backend is garbage-collected, and at interpreter exit (an atexit hook, before
        # finalization: see Engine.close), where requests still in flight are cancelled.
        vision = self._vision
        self._engine = LlamaCppEngine(
            self._pool,
            self._decoding.new_state,
            self._eos_ids,
            self._stats,
            on_exit=lambda model=self._model: _release(ctx, model, vision),
            evaluate_media=None if vision is None else partial(vision.evaluate, ctx),
            adapters=self._adapters,
        )
        self._finalizer = weakref.finalize(self, self._engine.close, _CLOSED_UNDER_REQUEST)
        _log.info(
            "llama.cpp backend ready in %.2f s: %d sequences over %d KV cells, %d/%d threads",
            time.perf_counter() - started,
            self.n_parallel,
            self.n_ctx,
            self.n_threads,
            self.n_threads_batch,
        )

    # ---- Backend protocol ----------------------------------------------------------------------
    @property
    def chat_template(self) -> ChatTemplate:
        return self._chat_template

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def model_name(self) -> str:
        return self._source.name

    @property
    def image_token(self) -> str | None:
        """llama.cpp's media marker (<__media__>) with an mmproj projector; else None."""
        return None if self._vision is None else self._vision.marker

    def generate(
        self, request: GenerateRequest, stream: StreamCallback | None = None
    ) -> GenerateResult:
        self._check_open()
        check_generate_request(request, stream)
        lora = self._adapters.resolve(request.params.lora_path)
        check_stop_token_ids(request.params, self.n_vocab)
        check_images(request, self.image_token, f"LlamaCpp({self._source.name!r}) without mmproj")
        media: dict[int, ImageRun] = {}
        if request.images:
            prompt, media = self._image_prompt(request.prompt, request.images)
        else:
            prompt = self._prompt_ids(request.prompt)
        self._check_fits(len(prompt), "prompt")
        index = _constraint_index(request.constraint, self._tokenizer)  # built during the prefill
        gen = GenSpec(request.params, index, stream is not None, self._jump_forward)
        job = self._engine.submit(Job(prompt, len(prompt) - 1, gen=gen, media=media, lora=lora))
        try:
            if stream is not None:
                for piece in job.pieces():
                    stream(piece)
            return job.outcome()
        except BaseException:  # the stream callback raised (a cancelled caller): abort
            self._engine.abort(job)
            raise

    def score(self, request: ScoreRequest) -> ScoreResult:
        """Logprobs of each choice's tokens after the prompt, with token healing.

        `prompt + choice` is tokenized as one text and scored from the first token that
        differs from the prompt's own tokenization. Unconditional scores condition on the
        start token alone (BOS, else EOS): they score `choice` tokenized by itself.
        """
        self._check_open()
        check_score_request(request)
        lora = self._adapters.resolve(request.lora_path)
        if request.images:
            raise BackendError(
                "LlamaCpp scores select choices over text prompts only; after lp.image() use "
                "gen(json_schema={'enum': [...]}) (or regex=) instead of select"
            )
        prompt = self._tokenize(request.prompt)
        spans, uncond = choice_spans(request, prompt, self._tokenize, self._start_id)
        for tokens, _ in spans + uncond:
            self._check_fits(len(tokens), "prompt + choice")
        # Evaluate the prompt once (up to the first scored position of any choice); every
        # span then shares it (copied between sequences) and costs only its own tokens,
        # all spans in one batch.
        shared = min(start for _, start in spans) - 1
        reused = 0
        if shared > 0:
            prefill = self._engine.submit(Job(prompt[:shared], None, lora=lora))
            prefill.outcome()
            reused = prefill.reused
        jobs = [
            self._engine.submit(Job(t[:-1], s - 1, lora=lora))
            for t, s in spans + uncond
            if s < len(t)
        ]
        rows = iter([job.outcome() for job in jobs])
        scored = [
            _logprobs(next(rows), tokens[start:]) if start < len(tokens) else ()
            for tokens, start in spans + uncond
        ]
        self._stats.add(
            score_requests=1,
            prompt_tokens=len(prompt),
            cached_tokens=reused,
            prefix_hits=int(reused > 0),
        )
        choices = choice_scores(spans, uncond, scored)
        return ScoreResult(choices=choices, prompt_tokens=len(prompt), cached_tokens=reused)

    def prompt_logprobs(
        self, prompt_ids: Sequence[int], start: int, top_logprobs_num: int = 0
    ) -> tuple[TokenLogprob, ...]:
        """Logprobs of the prompt's tokens from position `start` on (see Backend): one
        evaluation of the prompt, its logits kept from `start - 1`, sharing cached prefixes
        as a generation does."""
        self._check_open()
        ids = [int(t) for t in prompt_ids]
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            raise ValueError(f"start must be an int >= 1, got {start!r}")
        if any(not 0 <= t < self.n_vocab for t in ids):
            raise ValueError(
                f"prompt_ids holds a token id outside the vocabulary [0, {self.n_vocab})"
            )
        if start >= len(ids):
            return ()
        self._check_fits(len(ids), "prompt")
        rows = self._engine.submit(Job(ids[:-1], start - 1)).outcome()
        return _prompt_logprobs(rows, ids[start:], top_logprobs_num, self._decoding.token_text)

    def cache_prefix(self, prompt: str) -> None:
        """Evaluate `prompt` and save its state so later requests sharing it start there."""
        self._check_open()
        if not isinstance(prompt, str):
            raise TypeError(f"cache_prefix takes a str, got {type(prompt).__name__}")
        tokens = self._tokenize(prompt)
        if not tokens:
            return
        self._check_fits(len(tokens), "prefix")
        self._engine.submit(Job(tokens, None, save=True)).outcome()
        self._stats.add(cache_prefix_calls=1)

    def flush_cache(self) -> bool:
        """Empty the saved prefix states (`cache_prefix`'s and those saved before a slot's
        work was dropped); False, nothing emptied, while requests run or wait. The idle
        sequence slots keep their tokens' KV (the engine thread's), so a prompt that starts
        like a recent one still reuses it."""
        self._check_open()
        load = self._engine.load()
        if load["num_running"] or load["num_waiting"]:
            return False
        self._pool.cache.clear()
        return True

    # ---- LoRA adapters ---------------------------------------------------------------------
    def load_lora_adapter(self, name: str, path: str) -> dict[str, Any]:
        """Load the GGUF LoRA file or PEFT adapter folder `path` under `name` (as
        lp.Runtime's); its description (name, path, uid). LoraError when it does not fit the
        model (llama.cpp's reason); the adapters already loaded are untouched."""
        self._check_open()
        return self._adapters.load(name, path)

    def unload_lora_adapter(self, name: str) -> None:
        """Unload adapter `name`; requests using it finish with it. LoraError when unknown."""
        self._check_open()
        self._adapters.unload(name)

    def lora_adapters(self) -> list[dict[str, Any]]:
        """The loaded adapters (name, path, uid)."""
        return self._adapters.adapters()

    def stats(self) -> dict[str, Any]:
        from lmprog.fsm.index import lexer_renewals

        out: dict[str, Any] = self._stats.snapshot()
        out["prefix_misses"] = out["requests"] + out["score_requests"] - out["prefix_hits"]
        out.update(self._pool.stats())
        out["state_cache"] = self._pool.cache.stats()
        out.update(_tier_stats(out["state_cache"], out))
        out["n_ctx"] = self.n_ctx
        out["lora_adapters"] = len(self._adapters.adapters())
        out["n_parallel"] = self.n_parallel
        out["peak_sequences"] = self._engine.peak_sequences
        out["constraint_lexer_renewals"] = lexer_renewals()  # the process's, as the runtime's
        out.update(self._engine.load())
        out.update(_gauges(out, self._pool.ctx.tokens, self.n_ctx))
        return out

    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self) -> None:
        """Free the context and the model (waits for requests in flight). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._engine.close()  # the requests in flight finish first
        self._finalizer()

    # ---- helpers ---------------------------------------------------------------------------------
    def _tokenize(self, text: str) -> list[int]:
        check_text(text, "the prompt")
        ids = encode_prompt(self._tokenizer, text)
        bos = self._model.bos_token_id
        if self._model.add_bos and bos >= 0 and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    def _prompt_ids(self, prompt: str | tuple[int, ...]) -> list[int]:
        if isinstance(prompt, str):
            ids = self._tokenize(prompt)
        elif isinstance(prompt, (tuple, list)):
            ids = list(prompt)
            for t in ids:
                if (
                    isinstance(t, bool)
                    or not isinstance(t, (int, np.integer))
                    or not 0 <= t < self.n_vocab
                ):
                    raise ValueError(
                        f"prompt token ids must be ints in [0, {self.n_vocab}), got {t!r}"
                    )
            ids = [int(t) for t in ids]
        else:
            raise TypeError(
                f"prompt must be a str or a tuple of token ids, got {type(prompt).__name__}"
            )
        return ids or [self._start_id]  # an empty prompt continues from the start token

    def _image_prompt(
        self, prompt: str | tuple[int, ...], images: Sequence[Any]
    ) -> tuple[list[int], dict[int, ImageRun]]:
        """The prompt's ids with each image's run in place of its marker, and where each
        image's placeholders start. ValueError for an image llama.cpp cannot decode."""
        assert self._vision is not None and isinstance(prompt, str)
        runs = [self._vision.image_run(image) for image in images]
        segments = _split(prompt, self._vision.marker)
        if not segments[-1]:
            raise ValueError(
                "a prompt with images needs text after its last image (llama.cpp reads the "
                "next token's logits from text)"
            )
        ids = self._tokenize(segments[0]) if segments[0] else self._tokenize_start()
        media: dict[int, ImageRun] = {}
        for run, segment in zip(runs, segments[1:]):
            ids += run.before
            media[len(ids)] = run
            ids += [*run.ids, *run.after]
            if segment:
                check_text(segment, "the prompt")
                ids += encode_prompt(self._tokenizer, segment)
        return ids, media

    def _tokenize_start(self) -> list[int]:
        bos = self._model.bos_token_id
        return [bos] if self._model.add_bos and bos >= 0 else []

    def _check_fits(self, n_tokens: int, what: str) -> None:
        if n_tokens >= self.n_ctx:
            raise ContextLengthError(
                f"the {what} has {n_tokens} tokens but the context holds {self.n_ctx} "
                f"(at least one more is needed to generate): shorten it or create LlamaCpp(n_ctx=...) larger",
                prompt_tokens=n_tokens,
                limit=self.n_ctx,
                setting="n_ctx",
            )

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError("this LlamaCpp backend was shut down; create a new one")

    def _check_tokenizer(self) -> None:
        for sample in _TOKENIZER_SAMPLES:
            ours = list(self._tokenizer.encode(sample, add_special_tokens=False))
            theirs = self._model.tokenize(sample)
            if ours != theirs:
                warnings.warn(
                    f"the Hugging Face tokenizer of {self._source.name} disagrees with llama.cpp on "
                    f"{sample!r} ({ours} vs {theirs}); outputs may differ from llama.cpp's own",
                    stacklevel=3,
                )
                return

    def __repr__(self) -> str:
        return f"LlamaCpp(model={self._source.name!r}, n_ctx={self.n_ctx})"


def _check_model_file(model: Any) -> None:
    """A model given as a path that is missing or not a GGUF: an error naming the file."""
    if not isinstance(model, (str, os.PathLike)):
        return  # None (the default) or a wrong type, which resolve_model reports
    key = os.fspath(model)
    path = Path(key).expanduser()
    if path.is_file() and path.suffix != ".gguf":
        raise ValueError(
            f"{path.resolve()} is not a GGUF file (its name does not end in .gguf): LlamaCpp "
            "loads GGUF models; convert a Hugging Face model with llama.cpp's "
            "convert_hf_to_gguf.py, or use lp.Runtime for a Hugging Face folder"
        )
    if not path.exists() and (path.suffix == ".gguf" or os.sep in key or "/" in key):
        if looks_like_hub_id(key) and path.suffix != ".gguf":
            return  # an `org/name` id: resolve_model looks in the Hugging Face cache
        raise ValueError(
            f"model file {path.absolute()} does not exist: check the path (relative paths are "
            f"from {Path.cwd()}), or pass a bundled model name"
        )


def _check_gguf(path: Path) -> None:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ValueError(f"cannot read the model file {path}: {exc}") from exc
    if magic != b"GGUF":
        raise ValueError(
            f"{path} is not a GGUF file (it does not start with the GGUF magic bytes; "
            f"starts with {magic!r}): re-download it, or convert the model with llama.cpp's "
            "convert_hf_to_gguf.py"
        )


def _read_cached_tokenizer(source: Any) -> Future | None:
    """A Future of `load_tokenizer(source)` read on a thread where the tokenizer cache holds
    it (milliseconds of file reading), which then starts its constraint set-up
    (`fsm.warmup`); else None (a first run builds it with transformers)."""
    if not (tokenizer_cache_path(source) / META_FILE).is_file():
        return None
    future: Future = Future()

    def read() -> None:
        try:
            tokenizer = load_tokenizer(source)
        except BaseException as exc:  # noqa: BLE001 - raised by the constructor's result()
            future.set_exception(exc)
            return
        warmup.start(tokenizer)
        future.set_result(tokenizer)

    threading.Thread(target=read, name="lmprog-tokenizer", daemon=True).start()
    return future


def _release(
    ctx: NativeContext | None, model: NativeModel, vision: NativeVision | None = None
) -> None:
    if vision is not None:
        vision.close()
    if ctx is not None:
        ctx.close()
    model.close()


def _mmproj_path(mmproj: str | None) -> Path | None:
    """The projector GGUF named by `mmproj=` (checked before the model loads), or None."""
    if mmproj is None:
        return None
    path = Path(mmproj).expanduser()
    if not path.is_file():
        raise ValueError(
            f"mmproj file {path.absolute()} does not exist: give the projector GGUF of the "
            "model (llama.cpp's mmproj-*.gguf)"
        )
    _check_gguf(path)
    return path


def _split(prompt: str, marker: str) -> list[str]:
    """`prompt` cut at each `marker`, a `Prompt`'s pieces keeping their control spans."""
    spans = control_spans(prompt)
    text = str(prompt)
    pieces, start = [], 0
    while True:
        end = text.find(marker, start)
        stop = len(text) if end == -1 else end
        piece = text[start:stop]
        if spans is not None:
            piece = Prompt(
                piece, [(a - start, b - start) for a, b in spans if b > start and a < stop]
            )
        pieces.append(piece)
        if end == -1:
            return pieces
        start = end + len(marker)


class _Decoding:
    """What each request's DecodeState is built from. The engine thread holds it, so it
    holds nothing of the backend (which stays collectable)."""

    def __init__(self, tokenizer: Any, eos_ids: Sequence[int], n_vocab: int):
        self._tokenizer, self._eos_ids, self._n_vocab = tokenizer, eos_ids, n_vocab
        self._texts: dict[int, str] = {}

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._tokenizer.decode([token_id])
        return text

    def new_state(self, gen: GenSpec, prompt: Sequence[int], guide: Any, emit: Any) -> Any:
        return DecodeState(
            gen.params,
            tokenizer=self._tokenizer,
            prompt_ids=prompt,
            eos_token_ids=self._eos_ids,
            vocab_size=self._n_vocab,
            token_text=self.token_text,
            emit=emit,
            guide=guide,
            jump_forward=gen.jump_forward,
            device=None,  # numpy arrays
        )


def _logprobs(rows: np.ndarray, targets: Sequence[int]) -> tuple[float, ...]:
    """The logprob of targets[i] under the logits rows[i] (the sampler's log_softmax)."""
    logprobs = NUMPY.log_softmax(rows.astype(np.float32, copy=False))
    return tuple(logprobs[np.arange(len(targets)), list(targets)].tolist())


def _prompt_logprobs(
    rows: np.ndarray, targets: Sequence[int], top: int, text: Any
) -> tuple[TokenLogprob, ...]:
    """TokenLogprobs of targets[i] under the logits rows[i], each with its `top` alternatives."""
    logprobs = NUMPY.log_softmax(rows.astype(np.float32, copy=False))
    out = []
    for row, token in zip(logprobs, targets):
        alts: tuple[TopLogprob, ...] = ()
        if top:
            best = np.argpartition(-row, min(top, len(row) - 1))[:top]
            best = best[np.argsort(-row[best], kind="stable")]
            alts = tuple(TopLogprob(int(t), text(int(t)), float(row[t])) for t in best)
        out.append(TokenLogprob(int(token), text(int(token)), float(row[token]), alts))
    return tuple(out)


def _constraint_index(constraint: Any, tokenizer: Any) -> Any:
    """A future of the constraint's token index (built off-thread during the prefill), or None."""
    if constraint is None:
        return None
    try:
        from lmprog.fsm.index import TokenIndex
    except ImportError as exc:
        raise ConstraintError(
            f"constrained decoding needs lmprog.fsm, which is not available: {exc}"
        ) from exc
    future = TokenIndex.prefetch(constraint, tokenizer)
    if future.done():
        future.result()  # raise a ConstraintError now, before any token is spent
    return future


_CLOSED_UNDER_REQUEST = (
    "the LlamaCpp backend was closed before this request finished (it was garbage-collected, "
    "or the interpreter is exiting)"
)

_COUNTERS = (
    "requests",
    "score_requests",
    "cache_prefix_calls",
    "prompt_tokens",
    "cached_tokens",
    "prefix_hits",
    "generated_tokens",  # counted each engine step, as they are made
    "aborted",  # generations stopped by their caller (the stream callback raised)
    "busy_us",  # engine steps' time (stats() reports busy_seconds)
)


def _tier_stats(cache: dict[str, int], counts: dict[str, Any]) -> dict[str, int]:
    """The saved-state cache under the runtime's names for its KV tiers (which /metrics and
    the server's engine line read): its memory is the host tier, its files the disk tier;
    hits are the tokens restored states spared evaluating (the disk's counted in both)."""
    if not cache["max_bytes"]:
        return {}
    out = {
        "host_kv_used_bytes": cache["bytes"],
        "host_kv_capacity_bytes": cache["max_bytes"],
        "host_kv_hit_tokens": counts["restored_tokens"],
    }
    if "disk_max_bytes" in cache:
        out.update(
            disk_kv_used_bytes=cache["disk_bytes"],
            disk_kv_capacity_bytes=cache["disk_max_bytes"],
            disk_kv_hit_tokens=counts["disk_restored_tokens"],
            disk_kv_write_failures=cache["disk_write_failures"],
            host_kv_load_failures=cache["disk_failures"],  # damaged files: evaluated instead
        )
    return out


def _gauges(counts: dict[str, Any], sequences: list[list[int]], n_ctx: int) -> dict[str, Any]:
    """stats()'s keys that the runtime reports too (and /metrics and the server's engine line
    read): cache hit rate, KV cells held, throughput over the engine's busy time."""
    seqs = sorted(tuple(s) for s in list(sequences))
    held, previous = 0, ()  # a prefix shared between sequences holds its cells once (seq_cp)
    for s in seqs:
        held += len(s) - common_prefix_len(previous, s)
        previous = s
    busy = counts.pop("busy_us") / 1e6
    prompt = counts["prompt_tokens"]
    return {
        "cache_hit_rate": counts["cached_tokens"] / prompt if prompt else 0.0,
        "kv_capacity": n_ctx,
        "kv_used": held,
        "kv_usage": held / n_ctx,
        "busy_seconds": busy,
        "gen_tokens_per_s": counts["generated_tokens"] / busy if busy else 0.0,
    }


# help(lp.LlamaCpp) and inspect show every option by name, from LlamaCppConfig's fields.
LlamaCpp.__init__.__signature__ = LlamaCppConfig.signature()  # type: ignore[attr-defined]
