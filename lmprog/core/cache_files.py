"""Files derived from a model file, cached on disk keyed by that file's identity.

    entry = derived_path("weights", gguf, version=1)    # cache_dir()/weights/<stem>-<digest>
    meta = read_description(entry / "x.json", gguf, version=1)   # None: build the entry
    write_description(entry / "x.json", gguf, {...}, version=1)  # last, once the data is in

The digest is of the file's path, size, mtime and the format version; a description missing,
unreadable or naming another file means: rebuild. Design: docs/design/foundations.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    return Path(os.environ.get("LMPROG_CACHE_DIR", Path.home() / ".cache" / "lmprog"))


def file_identity(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The absolute path, size and mtime of a file as it is now (OSError if it is gone)."""
    path = Path(path).absolute()
    stat = path.stat()
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def derived_path(
    kind: str, source: str | os.PathLike[str], *, version: int | None = None, suffix: str = ""
) -> Path:
    """Where what is derived from `source` (of this `kind` and format version) is cached."""
    ident = file_identity(source)
    key = f"{ident['path']}|{ident['size']}|{ident['mtime_ns']}"
    if version is not None:
        key = f"{version}|{key}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / kind / f"{Path(ident['path']).stem}-{digest}{suffix}"


def write_json(path: Path, data: Any) -> None:
    """`data` as JSON at `path`, atomically (OSError if the folder is not writable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}-{threading.get_ident()}")
    try:
        tmp.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_description(
    path: Path, source: str | os.PathLike[str], data: dict[str, Any], *, version: int
) -> None:
    """The description of a cache entry derived from `source`: `data` plus its identity."""
    write_json(path, {**data, "version": version, "source": file_identity(source)})


def read_description(
    path: Path, source: str | os.PathLike[str], *, version: int
) -> dict[str, Any] | None:
    """The description at `path` if it is readable, of this format version and derived from
    `source` as that file is now; else None (absent, damaged, stale: rebuild the entry)."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        current = file_identity(source)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("version") != version:
        return None
    return meta if meta.get("source") == current else None
