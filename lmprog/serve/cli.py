"""The `lmprog` command line: `lmprog serve --model NAME_OR_PATH [--host --port --api-key ...]`
and `lmprog --version`.

Also `python -m lmprog serve ...` and `python -m lmprog.serve --model ...`. The model is chosen
here, once, at start-up; a server that cannot start prints one line on stderr and exits 1
(`--log-level debug` adds the traceback). Flags: docs/serving.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence

from lmprog import __version__
from lmprog.backends.runtime_config import RuntimeConfig
from lmprog.core.errors import LmprogError
from lmprog.core.logs import ENV_VAR, LEVELS, configure_logging, parse_level
from lmprog.core.reasoning import named_format

from .limits import ServerLimits

log = logging.getLogger("lmprog.serve")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lmprog", description="lmprog command line")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_arguments(commands.add_parser("serve", help="run the OpenAI-compatible server"))
    args = parser.parse_args(argv)
    try:
        parse_level(args.log_level)
    except ValueError as exc:  # a bad $LMPROG_LOG_LEVEL (the flag's choices are checked above)
        parser.error(f"${ENV_VAR}: {exc}")
    args.backend, args.backend_reason = choose_backend(args)
    try:
        backend_options(args)
        server_limits(args)
        if not args.stats_interval >= 0:
            raise ValueError(f"--stats-interval must be >= 0, got {args.stats_interval}")
    except ValueError as exc:  # a flag that does not apply to the chosen backend, a bad limit
        parser.error(str(exc))
    try:
        return serve(args)
    except KeyboardInterrupt:  # Ctrl-C while the model loads
        return 130


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="bundled model name, .gguf file or HF folder "
        "(default: the bundled SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "runtime", "llamacpp"),
        default="auto",
        help="lmprog's engine or llama.cpp; auto (default): the runtime on a CUDA GPU or "
        "when a runtime-only flag is given, llama.cpp for a GGUF model on a CPU (where it "
        "decodes several times faster; docs/benchmarks.md)",
    )
    p.add_argument(
        "--log-level",
        type=str.lower,
        choices=LEVELS,
        default=os.environ.get(ENV_VAR, "info"),
        help=f"verbosity of the lmprog logger: start-up steps and access lines at info "
        f"(default: ${ENV_VAR}, else info)",
    )
    p.add_argument(
        "--mmproj",
        default=None,
        help="a vision-language GGUF model's projector (llama.cpp's mmproj file): the model "
        "then takes images (llama.cpp, which auto picks on a CPU, or --backend runtime: "
        "LLaVA-1.5 and SmolVLM / Idefics3 projectors)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=os.environ.get("LMPROG_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $LMPROG_API_KEY, else none)",
    )
    p.add_argument("--served-model-name", default=None, help="the name clients use for the model")
    RuntimeConfig.add_flags(p)  # the backend's knobs (lmprog.backends.config)
    defaults = ServerLimits()
    for name in INT_LIMITS:
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=int,
            default=getattr(defaults, name),
            help=f"request limit (default {getattr(defaults, name)})",
        )
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=None,
        help="max_tokens of a chat completion or Responses request that sets none (default: "
        f"the --max-tokens limit, {defaults.max_tokens}); /v1/completions keeps OpenAI's 16, "
        "/generate SGLang's 128",
    )
    p.add_argument(
        "--constraint-timeout",
        dest="constraint_timeout_s",
        type=float,
        default=defaults.constraint_timeout_s,
        help="seconds a request's regex/schema/tools may take to compile "
        f"(default {defaults.constraint_timeout_s:g}; 400 constraint_timeout after it)",
    )
    p.add_argument(
        "--stats-interval",
        type=float,
        default=10.0,
        help="seconds between the engine lines logged at info while requests run (running "
        "and queued requests, generation and prompt tokens/s, prefix cache hit rate, KV "
        "cache usage); 0: none (default 10)",
    )
    p.add_argument(
        "--allow-special-tokens",
        action="store_true",
        help="read special-token strings in chat messages (<|im_start|>, ...) as control "
        "tokens (default: text; only the chat template's markers are control tokens)",
    )
    p.add_argument(
        "--reasoning-parser",
        default="auto",
        help="how a reasoning model's output splits into thinking (reasoning_content) and "
        "answer: auto (from the chat template, the default), none, deepseek-r1, qwen3, "
        "gpt-oss, magistral (SGLang's and vLLM's names work too: deepseek_r1, ...)",
    )
    p.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch http(s) image URLs in requests (image_url parts, Anthropic url sources, "
        "image_data), within --max-image-bytes and --image-fetch-timeout (default: a 400; "
        "the server then fetches any URL a client names: enable it only where that is fine)",
    )
    p.add_argument(
        "--image-fetch-timeout",
        dest="image_fetch_timeout_s",
        type=float,
        default=defaults.image_fetch_timeout_s,
        help="seconds one image URL's download may take (default "
        f"{defaults.image_fetch_timeout_s:g})",
    )
    p.add_argument(
        "--allowed-image-folders",
        nargs="+",
        default=[],
        metavar="DIR",
        help="folders whose files requests may name as images (file:// URLs, SGLang's "
        "image_data paths); default: none, a local path is a 400",
    )
    p.add_argument(
        "--strict-requests",
        action="store_true",
        help="answer request fields this server does not know with a 400 unknown_parameter, "
        "as OpenAI does (default: drop them, with a warning in the log once per name)",
    )


# the integer ServerLimits with a flag each (--max-n, ...)
INT_LIMITS = (
    "max_n",
    "max_choices",
    "max_tokens",
    "max_stop",
    "max_stop_chars",
    "max_tools",
    "max_body_bytes",
    "max_json_depth",
    "max_concurrency",
    "max_images",
    "max_image_bytes",
    "max_image_pixels",
)


# Flags only the runtime takes: (flag, lp.Runtime's keyword = the flag's dest, its default,
# why llama.cpp refuses it). Given one, `--backend auto` picks the runtime, and
# `--backend llamacpp` is an error naming the first.
RUNTIME_ONLY = RuntimeConfig.runtime_only_flags()


def _runtime_only_given(args: argparse.Namespace) -> list[tuple[str, str, object, str]]:
    return [flag for flag in RUNTIME_ONLY if getattr(args, flag[1]) != flag[2]]


def choose_backend(args: argparse.Namespace) -> tuple[str, str]:
    """`--backend auto` made concrete: (backend, why), for the start-up log."""
    if args.backend != "auto":
        return args.backend, "--backend " + args.backend
    runtime_only = [flag for flag, *_ in _runtime_only_given(args)]
    if runtime_only:
        return "runtime", f"auto: {', '.join(runtime_only)} need the runtime"
    if getattr(args, "mmproj", None):
        return "llamacpp", "auto: --mmproj is a llama.cpp projector"
    if (args.device or "auto").lower() not in ("auto", "cpu"):
        return "runtime", f"auto: --device {args.device}"
    if (args.device or "auto").lower() == "auto" and _has_cuda():
        return "runtime", "auto: a CUDA GPU is present"
    try:
        from lmprog.core.models import resolve_model

        source = resolve_model(args.model)
    except Exception:  # noqa: BLE001 - the chosen backend reports a bad model clearly
        return "runtime", "auto: the model did not resolve here"
    if source.kind != "gguf":
        return "runtime", "auto: a Hugging Face folder (llama.cpp reads GGUF files)"
    if importlib.util.find_spec("llama_cpp") is None:
        return "runtime", "auto: llama-cpp-python is not installed"
    return "llamacpp", "auto: a GGUF model on a CPU, where llama.cpp decodes faster"


def _has_cuda() -> bool:
    """Whether torch sees a CUDA GPU; torch is imported only where an NVIDIA driver is."""
    if not os.path.exists("/proc/driver/nvidia/version") and shutil.which("nvidia-smi") is None:
        return False
    import torch

    return torch.cuda.is_available()


def backend_options(args: argparse.Namespace) -> dict:
    """The backend's keyword arguments from the flags; ValueError for a flag that does not
    apply to the chosen backend (never silently ignored)."""
    given = _runtime_only_given(args)
    mmproj = getattr(args, "mmproj", None)
    if args.backend != "llamacpp":
        options = {
            "device": args.device,
            "max_total_tokens": args.max_total_tokens,
            "quantization": args.quantization,
            "num_threads": args.num_threads,
        }
        if args.max_running_requests is not None:
            options["max_running_requests"] = args.max_running_requests
        if args.disk_kv_cache_bytes:
            options["disk_kv_cache_bytes"] = args.disk_kv_cache_bytes
            options["disk_kv_cache_dir"] = args.disk_kv_cache_dir
        if mmproj:  # the runtime reads a GGUF decoder's projector too
            options["mmproj"] = mmproj
        if args.lora_paths:
            options["lora_paths"] = args.lora_paths
        if args.enable_lora:
            options["enable_lora"] = True
        options.update((dest, getattr(args, dest)) for _, dest, _, _ in given)
        return options
    if given:
        flag, dest, _, why = given[0]
        raise ValueError(
            f"{flag} {getattr(args, dest)} applies to --backend runtime only"
            + (f": {why}" if why else "")
        )
    out: dict = {}
    if mmproj:
        out["mmproj"] = mmproj
    if args.lora_paths:  # GGUF LoRA files or PEFT folders (--enable-lora: always on)
        out["lora_paths"] = args.lora_paths
    if args.disk_kv_cache_bytes:  # the saved states' disk tier
        out["state_cache_disk_bytes"] = args.disk_kv_cache_bytes
        out["state_cache_disk_dir"] = args.disk_kv_cache_dir
    if args.num_threads is not None:
        out["n_threads"] = args.num_threads
    if args.max_running_requests is not None:
        out["n_parallel"] = args.max_running_requests  # llama.cpp sequences decoded together
    if args.max_total_tokens is not None:
        out["n_ctx"] = args.max_total_tokens  # llama.cpp's KV cache holds n_ctx tokens
    device = (args.device or "auto").lower()
    kind, _, index = device.partition(":")
    if device == "auto":
        from lmprog.backends.llamacpp_native import supports_gpu_offload

        out["n_gpu_layers"] = -1 if supports_gpu_offload() else 0
    elif device == "cpu":
        out["n_gpu_layers"] = 0
    elif kind in ("cuda", "gpu", "metal") and (not index or index.isdigit()):
        out["n_gpu_layers"] = -1
        if index:
            out["main_gpu"] = int(index)
    else:
        raise ValueError(
            f"--device {args.device!r} is not a llama.cpp device: use auto, cpu, cuda, "
            "cuda:N, gpu, gpu:N or metal"
        )
    return out


def server_limits(args: argparse.Namespace) -> ServerLimits:
    """The flags' ServerLimits; ValueError naming a bad one (checked before the model loads)."""
    return ServerLimits(
        constraint_timeout_s=args.constraint_timeout_s,
        allow_special_tokens=args.allow_special_tokens,
        strict_requests=args.strict_requests,
        default_max_tokens=args.default_max_tokens,
        allow_image_urls=args.allow_image_urls,
        image_fetch_timeout_s=args.image_fetch_timeout_s,
        allowed_image_folders=tuple(args.allowed_image_folders),
        **{name: getattr(args, name) for name in INT_LIMITS},
    )


def make_backend(args: argparse.Namespace):  # an lmprog Backend
    options = backend_options(args)
    if args.backend == "llamacpp":
        from lmprog.backends.llamacpp import LlamaCpp

        return LlamaCpp(args.model, **options)
    from lmprog.backends.runtime import Runtime

    return Runtime(args.model, **options)


# What keeps the server from starting, told in one line: a model that does not resolve or
# load (ValueError, BackendError), a busy port or a bad host (OSError), a missing extra.
STARTUP_ERRORS = (LmprogError, ValueError, OSError, ImportError)
SERVE_EXTRA = ("fastapi", "uvicorn", "prometheus_client")


def serve(args: argparse.Namespace) -> int:
    from .server import Server, bind_socket

    configure_logging(args.log_level)
    started = time.perf_counter()
    log.info(
        "starting: backend %s (%s), --model %s",
        args.backend,
        getattr(args, "backend_reason", "--backend " + args.backend),
        args.model or "(the default)",
    )
    try:  # what fails in a moment fails before the model loads
        check_serve_extra()
        if args.reasoning_parser != "auto":
            named_format(args.reasoning_parser)  # an unknown name fails before the model loads
        if args.port:
            bind_socket(args.host, args.port).close()
        backend = make_backend(args)
    except STARTUP_ERRORS as exc:
        return cannot_start(exc)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    limits = server_limits(args)
    server = Server(
        backend,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        model_name=args.served_model_name,
        stats_interval_s=args.stats_interval or None,
        reasoning_parser=args.reasoning_parser,
        **{f.name: getattr(limits, f.name) for f in dataclasses.fields(limits)},
    )
    try:
        try:
            server.start()
        except (*STARTUP_ERRORS, RuntimeError) as exc:
            return cannot_start(exc)
        log.info(
            "listening on %s/v1, serving %r%s (ready in %.1f s)",
            server.url,
            server.model_name,
            " (API key required)" if args.api_key else "",
            time.perf_counter() - started,
        )
        stop.wait()
    finally:
        server.stop()
        backend.shutdown()
    return 0


def check_serve_extra() -> None:
    missing = [name for name in SERVE_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"lmprog serve needs {', '.join(missing)}: install the serve extra, "
            'pip install ".[serve]" from the checkout (or "lmprog[serve]")'
        )


def cannot_start(exc: BaseException) -> int:
    """One line on stderr for what kept the server from starting; its traceback at debug."""
    print(f"lmprog serve: error: {exc}", file=sys.stderr)
    log.debug("the server did not start", exc_info=exc)
    return 1
