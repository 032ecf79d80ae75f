"""The LoRA adapters a llama.cpp backend serves, by name: GGUF LoRA files, or PEFT folders
converted to one on loading (gguf_lora). Each gets a fresh uid (0 is the base model); the
engine runs a step's requests in one llama_decode per adapter and keys prefixes by uid.

    adapters = LlamaCppAdapters(model, model_path)
    adapters.load("sql", "sql.gguf")       # any thread; LoraError: what is wrong, others serve
    uid = adapters.resolve("sql")           # a request's adapter
    adapters.pointer(uid)                   # engine thread: what NativeContext.set_adapter takes
    adapters.unload("sql"); adapters.collect(in_use, ctx)  # freed once no request uses it

Design: docs/design/llamacpp-backend.md.
"""

from __future__ import annotations

import itertools
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmprog.backends.llamacpp_native import NativeContext, NativeModel
from lmprog.core.errors import BackendError, LoraError


@dataclass(frozen=True)
class _Adapter:
    name: str
    path: str
    uid: int
    ptr: Any  # llama_adapter_lora *


class LlamaCppAdapters:
    """Contract: `load`, `unload`, `resolve` and `adapters` are safe from any thread;
    `pointer` and `collect` run on the engine thread (a retired adapter is freed there, once
    no request uses it and the context no longer applies it)."""

    def __init__(self, model: NativeModel, model_path: Path) -> None:
        self._model = model
        self._model_path = model_path
        self._lock = threading.Lock()
        self._by_name: dict[str, _Adapter] = {}
        self._by_uid: dict[int, _Adapter] = {}  # loaded and retired ones
        self._retired: set[int] = set()
        self._uids = itertools.count(1)

    def load(self, name: str, path: str) -> dict[str, Any]:
        """Load the GGUF LoRA file (or PEFT adapter folder) `path` under `name`; its
        description. LoraError when the name is taken or the adapter does not fit the model
        (llama.cpp's reason); the adapters already loaded are untouched."""
        _check_name(name)
        with self._lock:
            self._check_free(name)
        ptr = self._open(name, str(path))
        with self._lock:
            try:
                self._check_free(name)  # another thread may have loaded it meanwhile
            except LoraError:
                self._model.free_adapter(ptr)
                raise
            entry = _Adapter(name, str(path), next(self._uids), ptr)
            self._by_name[name] = self._by_uid[entry.uid] = entry
        return _describe(entry)

    def unload(self, name: str) -> None:
        """New requests cannot name it; requests using it finish with it (then it is freed).
        LoraError (unknown) when none has that name."""
        with self._lock:
            entry = self._by_name.pop(name, None) if isinstance(name, str) else None
            if entry is None:
                raise self._unknown(name)
            self._retired.add(entry.uid)

    def resolve(self, name: Any) -> int:
        """The uid of adapter `name` (None: 0, the base model); LoraError (unknown) else."""
        if name is None:
            return 0
        with self._lock:
            entry = self._by_name.get(name) if isinstance(name, str) else None
            if entry is None:
                raise self._unknown(name)
            return entry.uid

    def adapters(self) -> list[dict[str, Any]]:
        with self._lock:
            return [_describe(e) for e in self._by_name.values()]

    def known(self, uid: int) -> bool:
        """Whether uid can run: the base model, or an adapter not yet freed."""
        return uid == 0 or uid in self._by_uid

    def gone(self, uid: int) -> LoraError:
        """The error of a request whose adapter was unloaded and freed before it started."""
        return LoraError(f"the LoRA adapter this request named (uid {uid}) was unloaded")

    def pointer(self, uid: int) -> Any:
        """The adapter of uid (None for 0); a retired one stays until `collect` frees it."""
        return None if uid == 0 else self._by_uid[uid].ptr

    def collect(self, in_use: set[int], ctx: NativeContext) -> None:
        """Free the retired adapters no request in `in_use` (uids) runs under."""
        if not self._retired:
            return
        with self._lock:
            done = [uid for uid in self._retired if uid not in in_use]
            for uid in done:
                self._retired.discard(uid)
                entry = self._by_uid.pop(uid)
                if ctx.adapter is entry.ptr:
                    ctx.set_adapter(None)
                self._model.free_adapter(entry.ptr)

    # ---- helpers -------------------------------------------------------------------------
    def _check_free(self, name: str) -> None:
        if name in self._by_name:
            raise LoraError(
                f"a LoRA adapter named {name!r} is already loaded; unload it first", adapter=name
            )

    def _unknown(self, name: Any) -> LoraError:
        loaded = ", ".join(sorted(self._by_name)) or "none"
        return LoraError(
            f"no LoRA adapter named {name!r} is loaded (loaded: {loaded})",
            adapter=name if isinstance(name, str) else None,
            unknown=True,
        )

    def _open(self, name: str, path: str) -> Any:
        """llama.cpp's adapter for a GGUF LoRA file, or for a PEFT folder converted first."""
        file = Path(path).expanduser()
        if file.is_dir():
            from lmprog.backends.gguf_lora import write_gguf_lora

            with tempfile.TemporaryDirectory(prefix="lmprog-lora-") as tmp:
                converted = write_gguf_lora(file, self._model_path, Path(tmp) / "lora.gguf",
                                            name=name)  # fmt: skip
                return self._init(name, converted)  # llama.cpp copies the weights in
        if not file.is_file():
            raise LoraError(
                f"LoRA adapter {name!r}: {file} does not exist; give a GGUF LoRA file (llama.cpp's "
                "convert_lora_to_gguf.py) or a PEFT adapter folder",
                adapter=name,
            )
        with open(file, "rb") as f:
            if f.read(4) != b"GGUF":
                raise LoraError(
                    f"LoRA adapter {name!r}: {file} is not a GGUF file; give a GGUF LoRA file or "
                    "a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)",
                    adapter=name,
                )
        return self._init(name, file)

    def _init(self, name: str, file: Path) -> Any:
        try:
            return self._model.load_adapter(file)
        except BackendError as exc:
            raise LoraError(
                f"LoRA adapter {name!r} does not fit {self._model_path.name}: {exc}",
                adapter=name,
            ) from None


def _describe(entry: _Adapter) -> dict[str, Any]:
    return {"name": entry.name, "path": entry.path, "uid": entry.uid}


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name or name != name.strip() or len(name) > 256:
        raise LoraError(f"a LoRA adapter's name must be a non-empty string, got {name!r}")
