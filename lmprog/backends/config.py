"""One typed configuration per backend: `RuntimeConfig` (lp.Runtime, runtime_config.py) and
`LlamaCppConfig` (lp.LlamaCpp, here). A field is a knob, listed once: its type, default and
help, SGLang's name where SGLang has the knob, and its `lmprog serve` flag if it has one. A
config validates itself at construction (an error naming the knob), splits into the frozen
configs of the subsystems it feeds (`cache_config()`, ...), and builds its serve flags
(`add_flags`); the backend fills it by field name from its keywords (`of_call`).

    cfg = LlamaCppConfig(model="smollm2-135m-instruct", n_parallel=4)
    lp.LlamaCpp(config=cfg)  # = lp.LlamaCpp("smollm2-135m-instruct", n_parallel=4)

Values computed at start-up (KV slots, the context length) are never written back into it.
Nothing of the runtime (nor torch) is imported here: the llama.cpp backend needs neither.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar


class _KnobDefault:
    def __repr__(self) -> str:
        return "KNOB_DEFAULT"


KNOB_DEFAULT: Any = _KnobDefault()  # a Flag's default: the knob's own


@dataclass(frozen=True)
class Flag:
    """A knob's `lmprog serve` flag.

    names: the flag and its aliases (SGLang's spelling first); the dest is the knob's name.
    default: the flag's default where it is not the knob's (None on a flag both backends
        take: each backend's own default).
    llamacpp: what the flag sets on llama.cpp, for a flag both backends take.
    runtime_only: for a flag only the runtime takes, why llama.cpp refuses it ("": no
        reason given); None: both backends take it.
    """

    names: tuple[str, ...]
    default: Any = KNOB_DEFAULT
    llamacpp: str | None = None
    runtime_only: str | None = None
    nargs: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None


def knob(
    default: Any,
    help: str,
    *,
    sglang: str | None = None,
    flag: Flag | None = None,
    alias: str | None = None,
    serve: str | None = None,
) -> Any:
    """A config field: help (what the knob does), SGLang's name for it, its serve flag, an
    alias the constructor also takes, the serve flag that feeds it (`serve`, llama.cpp)."""
    metadata = {"help": help, "sglang": sglang, "flag": flag, "alias": alias, "serve": serve}
    return field(default=default, metadata=metadata)


class BackendConfig:
    """What both configs share: built from a backend's call, split, documented."""

    POSITIONAL: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def of_call(
        cls, owner: str, args: tuple[Any, ...], kwargs: dict[str, Any], config: Any = None
    ) -> Any:
        """The config of `owner(*args, config=config, **kwargs)`: fields filled by name (the
        first ones also by position), over `config` when given. TypeError for a name the
        backend does not take, naming it."""
        names = cls.POSITIONAL
        if len(args) > len(names):
            raise TypeError(
                f"{owner}() takes at most {len(names)} positional arguments "
                f"({', '.join(names)}), got {len(args)}; give the others by name"
            )
        given = dict(zip(names, args))
        kwargs = dict(kwargs)
        for f in fields(cls):  # type: ignore[arg-type]
            alias = f.metadata.get("alias")
            if alias is not None and alias in kwargs:
                value = kwargs.pop(alias)
                if value is None:
                    continue
                if given.get(f.name) is not None or kwargs.get(f.name) is not None:
                    raise TypeError(
                        f"give the {f.name} once: {f.name}=... or {alias}=..., not both"
                    )
                kwargs[f.name] = value
        known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        for name in kwargs:
            if name not in known:
                near = difflib.get_close_matches(name, known, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise TypeError(
                    f"{owner}() got an unexpected keyword argument {name!r}{hint} "
                    f"(its options are the fields of {cls.__name__})"
                )
            if name in given:
                raise TypeError(f"{owner}() got multiple values for argument {name!r}")
        given.update(kwargs)
        if config is None:
            return cls(**given)
        if not isinstance(config, cls):
            raise TypeError(f"config must be a {cls.__name__}, got {type(config).__name__}")
        return replace(config, **given) if given else config  # type: ignore[type-var]

    @classmethod
    def signature(cls) -> inspect.Signature:
        """The backend's __init__ signature: self, the positional fields, then every other
        field (and alias) by name, and config=."""
        P = inspect.Parameter
        params = [P("self", P.POSITIONAL_OR_KEYWORD)]
        rest = []
        for f in fields(cls):  # type: ignore[arg-type]
            kind = P.POSITIONAL_OR_KEYWORD if f.name in cls.POSITIONAL else P.KEYWORD_ONLY
            param = P(f.name, kind, default=f.default, annotation=f.type)
            (params if kind is P.POSITIONAL_OR_KEYWORD else rest).append(param)
            if f.metadata.get("alias"):
                rest.append(P(f.metadata["alias"], P.KEYWORD_ONLY, default=None, annotation=f.type))
        params.sort(key=lambda p: ("self", *cls.POSITIONAL).index(p.name))
        rest.append(P("config", P.KEYWORD_ONLY, default=None, annotation=f"{cls.__name__} | None"))
        return inspect.Signature(params + rest)

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        """The knobs' `lmprog serve` flags, in field order, each with its help."""
        for f in fields(cls):  # type: ignore[arg-type]
            flag: Flag | None = f.metadata.get("flag")
            if flag is None:
                continue
            default = f.default if flag.default is KNOB_DEFAULT else flag.default
            kw: dict[str, Any] = {"dest": f.name, "default": default, "help": flag_help(f)}
            if f.type == "bool | None":
                kw["action"] = "store_true"
            else:
                kw["type"] = {"int": int, "float": float}.get(f.type.split(" ")[0])
                kw.update(nargs=flag.nargs, metavar=flag.metavar, choices=flag.choices)
            parser.add_argument(*flag.names, **kw)

    @classmethod
    def runtime_only_flags(cls) -> tuple[tuple[str, str, Any, str], ...]:
        """(flag, knob, the flag's default, why llama.cpp refuses it) of each flag only the
        runtime takes."""
        out = []
        for f in fields(cls):  # type: ignore[arg-type]
            flag = f.metadata.get("flag")
            if flag is not None and flag.runtime_only is not None:
                default = f.default if flag.default is KNOB_DEFAULT else flag.default
                out.append((flag.names[0], f.name, default, flag.runtime_only))
        return tuple(out)

    @classmethod
    def table(cls) -> str:
        """The options as a markdown table (docs/reference.md)."""
        rows = [
            "| option | default | SGLang's name | `lmprog serve` | what it does |",
            "|---|---|---|---|---|",
        ]
        for f in fields(cls):  # type: ignore[arg-type]
            meta = f.metadata
            sglang = f"`{meta['sglang']}`" if meta["sglang"] else ""
            serve = f"from `{meta['serve']}`" if meta["serve"] else ""
            if meta["flag"] is not None:
                serve = " ".join(f"`{n}`" for n in meta["flag"].names)
            text = meta["help"].replace("|", "\\|")
            if meta["alias"]:
                text += f" (also `{meta['alias']}=`)"
            rows.append(f"| `{f.name}` | `{f.default!r}` | {sglang} | {serve} | {text} |")
        return "\n".join(rows)


def flag_help(f: Any) -> str:
    """A flag's help: the knob's, its default, and what llama.cpp does with it."""
    flag: Flag = f.metadata["flag"]
    text = f.metadata["help"]
    if f.default is None:  # "None: x" reads "default: x" on a command line
        text = text.replace("None: ", "default: ")
    if flag.runtime_only is not None:
        text = "runtime: " + text
    said = f"({f.default}: " in text  # "(0: off)" says the default already
    if f.default is not None and not isinstance(f.default, bool) and not said:
        text += f" (default {f.default})"
    if flag.llamacpp:
        text += f"; llamacpp: {flag.llamacpp}"
    return text


@dataclass(frozen=True)
class LlamaCppConfig(BackendConfig):
    """lp.LlamaCpp's options: a GGUF model on llama.cpp (docs/reference.md lists them).
    `lmprog serve --backend llamacpp` fills them from its flags (the `serve` column)."""

    POSITIONAL: ClassVar[tuple[str, ...]] = ("model",)

    model: Any = knob(
        None, "a bundled model name, a .gguf path, or None for the default model", serve="--model"
    )
    n_ctx: int = knob(
        4096,
        "KV cache cells, shared by the requests running together; one request may use them "
        "all (prompt + output)",
        serve="--max-total-tokens",
    )
    n_threads: int | None = knob(
        None,
        "CPU threads while generating (also for a batch of several requests' next tokens); "
        "None: llama-cpp-python's choice, half the cores",
        serve="--num-threads",
    )
    n_threads_batch: int | None = knob(
        None, "CPU threads while evaluating a prompt; None: llama-cpp-python's choice, all cores"
    )
    n_gpu_layers: int = knob(
        0,
        "layers to offload to a GPU (-1: all) on a llama.cpp build with GPU or Metal support; "
        "0 runs on the CPU; a CPU-only build refuses others",
        serve="--device",
    )
    main_gpu: int | None = knob(
        None,
        "the GPU index that holds the whole model; None lets llama.cpp split the layers over "
        "every GPU it sees",
        serve="--device",
    )
    n_batch: int = knob(
        512,
        "tokens per llama.cpp decode call (every request's next token, then chunks of prompts)",
    )
    n_parallel: int = knob(
        16,
        "requests decoded together (llama.cpp sequences), more wait their turn; sequences that "
        "finished keep their tokens as a prefix cache",
        serve="--max-running-requests",
    )
    chat_template: str | None = knob(
        None,
        "a named template or jinja2 source overriding the model's own",
        sglang="chat_template",
    )
    state_cache_bytes: int = knob(
        256 * 2**20, "memory bound of saved prefix states (0 disables saving)"
    )
    state_cache_disk_bytes: int = knob(
        0,
        "a disk tier under the saved states, in bytes (0: off): states evicted from memory "
        "are written to checked files and read back when a request shares their prefix",
        serve="--disk-kv-cache-bytes",
    )
    state_cache_disk_dir: str | None = knob(
        None,
        "where the disk tier's files go, in a folder of this process's own (None: the "
        "system's temporary folder)",
        serve="--disk-kv-cache-dir",
    )
    min_save_tokens: int = knob(
        64, "save a sequence's state before it discards at least this many tokens"
    )
    jump_forward: bool = knob(
        True, "append text a constraint forces in one step (off with logprobs)"
    )
    mmproj: str | None = knob(
        None,
        "a vision-language model's projector GGUF (llama.cpp's mmproj file, from the same "
        "model): with it the model takes images (lp.image, image_url parts)",
        serve="--mmproj",
    )
    lora_paths: Any = knob(
        None,
        "LoRA adapters to serve: {name: GGUF LoRA file or PEFT adapter folder (converted on "
        "loading)}, or 'name=path' strings; a request picks one by name (SamplingParams."
        "lora_path; over HTTP model=NAME or lora_path), more with load_lora_adapter; a step "
        "runs one llama.cpp batch per adapter in it",
        sglang="lora_paths",
        serve="--lora-paths",
    )

    def __post_init__(self) -> None:
        for name, lo in (
            ("n_ctx", 16),
            ("n_gpu_layers", -1),
            ("n_batch", 1),
            ("n_parallel", 1),
            ("state_cache_bytes", 0),
            ("state_cache_disk_bytes", 0),
            ("min_save_tokens", 1),
        ):
            _check_int(name, getattr(self, name), lo)
        for name, lo in (("n_threads", 1), ("n_threads_batch", 1), ("main_gpu", 0)):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), lo)
        if not isinstance(self.jump_forward, bool):
            raise TypeError(f"jump_forward must be a bool, got {self.jump_forward!r}")
        if self.mmproj is not None:
            if not isinstance(self.mmproj, (str, os.PathLike)) or not os.fspath(self.mmproj):
                raise TypeError(
                    f"mmproj must be a path to a .gguf file or None, got {self.mmproj!r}"
                )
            object.__setattr__(self, "mmproj", os.fspath(self.mmproj))
        object.__setattr__(self, "lora_paths", tuple(lora_path_items(self.lora_paths)))


def _check_int(name: str, value: object, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")


def lora_path_items(lora_paths: Any) -> list[tuple[str, str]]:
    """(name, path) pairs of `lora_paths`: a dict {name: path}, or a list of "name=path"
    strings or of paths (named by the path, as SGLang names them), pairs, or None."""
    if lora_paths is None:
        return []
    if isinstance(lora_paths, str):
        lora_paths = [lora_paths]
    if isinstance(lora_paths, dict):
        items = list(lora_paths.items())
    elif isinstance(lora_paths, (list, tuple)):
        items = []
        for entry in lora_paths:
            if isinstance(entry, tuple) and len(entry) == 2:  # a pair, as stored here
                items.append(entry)
                continue
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
