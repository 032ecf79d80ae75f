"""A GGUF's dequantized weights cached as safetensors: a warm start reads them back instead of
dequantizing (about a second for the default model here, minutes for a large one).

    weights = cached_gguf_weights(index)   # what gguf_weights(index) yields, cached

The entry is `cache_dir()/weights/<stem>-<digest>/` (lmprog.core.cache_files: the digest of
the GGUF's path, size and mtime) holding `model.safetensors` (fp32 in HF names, exactly what
`gguf_weights` yields) and `lmprog_weights.json`, its description: the GGUF's identity, the
format version, the data file's size and each tensor's name, shape and CRC-32. The first load
writes the data as it dequantizes (the header is known from the GGUF's tensor table, so the
tensors stream to disk and no second copy is held), renames it into place, then writes the
description, then removes the entries of earlier versions of the same file. A later load
reads the entry only if the description matches the GGUF as it is now, the file has its
size and header, and every tensor its CRC-32 (checked before the tensor is handed on);
anything else (stale, truncated, a flipped byte) is rebuilt from the GGUF, never loaded.

`$LMPROG_WEIGHT_CACHE_GIB` (default 4) bounds what is cached: fp32 takes 4-8x the GGUF's
size on disk; 0 turns the cache off.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch

from lmprog.core.cache_files import derived_path, read_description, write_description

from .gguf import _SKIP, GGUFIndex, gguf_weights, hf_name

log = logging.getLogger(__name__)

VERSION = 1
DATA, DESCRIPTION = "model.safetensors", "lmprog_weights.json"
ENV_VAR, DEFAULT_GIB = "LMPROG_WEIGHT_CACHE_GIB", 4.0

Layout = list[tuple[str, tuple[int, ...]]]


class _Damaged(Exception):
    pass


def cached_gguf_weights(index: GGUFIndex) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, fp32 tensor) for every weight of the GGUF, from its cache entry when that
    is current and sound, else dequantized (and cached on the way)."""
    arch = index.config.architecture
    layout = [(hf_name(t.name, arch), t.shape) for t in index.tensors if t.name not in _SKIP]
    size = 4 * sum(math.prod(shape) for _, shape in layout)
    if size > _limit_bytes():
        yield from gguf_weights(index)
        return
    try:
        entry = derived_path("weights", index.path, version=VERSION)
    except OSError:
        yield from gguf_weights(index)
        return
    meta = read_description(entry / DESCRIPTION, index.path, version=VERSION)
    if meta is not None:
        try:
            log.info("weights of %s from the cache %s", Path(index.path).name, entry)
            yield from _read(entry, meta, layout)
            return
        except _Damaged as e:  # the tensors handed on so far passed their checks
            log.warning("the weight cache %s is damaged (%s); rebuilding it", entry, e)
            (entry / DESCRIPTION).unlink(missing_ok=True)
    yield from _write_through(index, entry, layout)


def _limit_bytes() -> float:
    raw = os.environ.get(ENV_VAR)
    try:
        gib = float(raw) if raw else DEFAULT_GIB
    except ValueError:
        log.warning("ignoring $%s=%r (not a number of GiB)", ENV_VAR, raw)
        gib = DEFAULT_GIB
    return gib * 2**30


def _read(entry: Path, meta: dict, layout: Layout) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    data = entry / DATA
    try:
        described = [(t["name"], tuple(t["shape"])) for t in meta["tensors"]]
        crcs = [int(t["crc32"]) for t in meta["tensors"]]
        if described != layout:
            raise _Damaged("it describes other tensors than the GGUF holds")
        if data.stat().st_size != meta["bytes"]:
            raise _Damaged(f"{DATA} is not {meta['bytes']} bytes")
        with safe_open(str(data), framework="pt") as f:
            if sorted(f.keys()) != sorted(name for name, _ in layout):
                raise _Damaged(f"{DATA} holds other tensors than described")
            for (name, shape), crc in zip(layout, crcs):
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != shape or tensor.dtype != torch.float32:
                    raise _Damaged(f"{name} is not fp32 {list(shape)}")
                if zlib.crc32(tensor.numpy()) != crc:
                    raise _Damaged(f"{name} fails its CRC-32")
                yield name, tensor
    except _Damaged:
        raise
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise _Damaged(f"{type(e).__name__}: {e}") from e
    except Exception as e:  # safetensors' own error for a header it cannot parse
        if type(e).__name__ != "SafetensorError":
            raise
        raise _Damaged(str(e)) from e


def _write_through(
    index: GGUFIndex, entry: Path, layout: Layout
) -> Iterator[tuple[str, torch.Tensor]]:
    """gguf_weights(index), each tensor also streamed into a new entry (completed, then
    described, once the last one is written). A cache that cannot be written costs nothing
    but the next start its dequantization."""
    tmp = entry / f"{DATA}.tmp{os.getpid()}-{threading.get_ident()}"
    log.info("the dequantized weights go to the cache %s (once)", entry)
    out = None
    try:
        entry.mkdir(parents=True, exist_ok=True)
        out = open(tmp, "wb")  # closed below, also when the caller stops early
        out.write(_header(layout))
    except OSError as e:
        log.warning(
            "cannot write the weight cache %s (%s); the next start dequantizes too", entry, e
        )
        out = None
    crcs: list[int] = []
    try:
        for (name, tensor), (want, shape) in zip(gguf_weights(index), layout):
            if out is not None:
                try:
                    if name != want or tuple(tensor.shape) != shape:
                        raise ValueError(f"{name} {tuple(tensor.shape)} came for {want} {shape}")
                    array = tensor.numpy()
                    out.write(array.data)
                    crcs.append(zlib.crc32(array))
                except (OSError, ValueError) as e:
                    log.warning("cannot write the weight cache %s (%s)", entry, e)
                    out.close()
                    out = None
            yield name, tensor
        if out is not None:
            out.close()
            os.replace(tmp, entry / DATA)
            tensors = [
                {"name": name, "shape": list(shape), "crc32": crc}
                for (name, shape), crc in zip(layout, crcs)
            ]
            data = {"bytes": (entry / DATA).stat().st_size, "tensors": tensors}
            write_description(entry / DESCRIPTION, index.path, data, version=VERSION)
            log.info("cached the dequantized weights in %s", entry)
            _remove_older(entry, index.path)
    except OSError as e:
        log.warning("cannot write the weight cache %s (%s)", entry, e)
    finally:
        if out is not None:
            out.close()
        tmp.unlink(missing_ok=True)


def _header(layout: Layout) -> bytes:
    """safetensors' header: little-endian u64 length, then JSON padded to 8 bytes."""
    header, at = {}, 0
    for name, shape in layout:
        end = at + 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, end]}
        at = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _remove_older(entry: Path, source: Path) -> None:
    """Other entries cached from the same GGUF path (the file was replaced since)."""
    for other in entry.parent.glob(f"{Path(source).stem}-*"):
        if other == entry or not other.is_dir():
            continue
        try:
            meta = json.loads((other / DESCRIPTION).read_text(encoding="utf-8"))
            stale = meta["source"]["path"] == str(Path(source).absolute())
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours to judge (another process may be writing it)
        if stale:
            shutil.rmtree(other, ignore_errors=True)
