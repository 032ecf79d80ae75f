"""A GGUF's dequantized weights cached as safetensors: a warm start reads them back instead of
dequantizing.

    weights = cached_gguf_weights(index, torch.bfloat16)   # gguf_weights(index) in bf16, cached

Entries are checked (identity, size, CRC-32 per tensor) and rebuilt when anything differs;
`$LMPROG_WEIGHT_CACHE_GIB` (default 4, 0: off) bounds them. Design: docs/design/models.md.
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
from typing import Any

import torch
from safetensors import safe_open

from lmprog.core.cache_files import derived_path, read_description, write_description

from .gguf import _SKIP, GGUFIndex, gguf_weights, hf_name

log = logging.getLogger(__name__)

VERSION = 1
DATA, DESCRIPTION = "model.safetensors", "lmprog_weights.json"
ENV_VAR, DEFAULT_GIB = "LMPROG_WEIGHT_CACHE_GIB", 4.0

Layout = list[tuple[str, tuple[int, ...]]]
# dtype -> (safetensors name, entry suffix); fp32 entries keep the name they always had
_FORMATS = {
    torch.float32: ("F32", ""),
    torch.bfloat16: ("BF16", "-bf16"),
    torch.float16: ("F16", "-fp16"),
}


class _Damaged(Exception):
    pass


def cached_gguf_weights(
    index: GGUFIndex, dtype: torch.dtype = torch.float32
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor in `dtype`: fp32, bf16 or fp16) for every weight of the GGUF, from
    its cache entry of that dtype when it is current and sound, else dequantized (and cached
    on the way)."""
    if dtype not in _FORMATS:
        raise ValueError(f"the weight cache holds float32, bfloat16 or float16, not {dtype}")
    arch = index.config.architecture
    layout = [(hf_name(t.name, arch), t.shape) for t in index.tensors if t.name not in _SKIP]
    size = dtype.itemsize * sum(math.prod(shape) for _, shape in layout)
    if size > _limit_bytes():
        yield from _converted(gguf_weights(index), dtype)
        return
    try:
        entry = derived_path("weights", index.path, version=VERSION, suffix=_FORMATS[dtype][1])
    except OSError:
        yield from _converted(gguf_weights(index), dtype)
        return
    meta = read_description(entry / DESCRIPTION, index.path, version=VERSION)
    if meta is not None:
        try:
            log.info("weights of %s from the cache %s", Path(index.path).name, entry)
            yield from _read(entry, meta, layout, dtype)
            return
        except _Damaged as e:  # the tensors handed on so far passed their checks
            log.warning("the weight cache %s is damaged (%s); rebuilding it", entry, e)
            (entry / DESCRIPTION).unlink(missing_ok=True)
    yield from _write_through(index, entry, layout, dtype)


def _converted(
    weights: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        yield name, tensor.to(dtype)


def _crc32(tensor: torch.Tensor) -> int:
    """CRC-32 of a tensor's bytes (any dtype; numpy has no bf16)."""
    # numpy declares ndarray's buffer protocol (__buffer__) for Python >= 3.12 only
    return zlib.crc32(tensor.contiguous().view(torch.uint8).numpy())  # type: ignore[arg-type]


def _limit_bytes() -> float:
    raw = os.environ.get(ENV_VAR)
    try:
        gib = float(raw) if raw else DEFAULT_GIB
    except ValueError:
        log.warning("ignoring $%s=%r (not a number of GiB)", ENV_VAR, raw)
        gib = DEFAULT_GIB
    return gib * 2**30


def _read(
    entry: Path, meta: dict[str, Any], layout: Layout, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:

    data = entry / DATA
    try:
        if meta.get("dtype", "F32") != _FORMATS[dtype][0]:
            raise _Damaged(f"it holds {meta.get('dtype')} tensors, not {_FORMATS[dtype][0]}")
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
                if tuple(tensor.shape) != shape or tensor.dtype != dtype:
                    raise _Damaged(f"{name} is not {dtype} {list(shape)}")
                if _crc32(tensor) != crc:
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
    index: GGUFIndex, entry: Path, layout: Layout, dtype: torch.dtype
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
        out.write(_header(layout, dtype))
    except OSError as e:
        log.warning(
            "cannot write the weight cache %s (%s); the next start dequantizes too", entry, e
        )
        out = None
    crcs: list[int] = []
    try:
        for (name, tensor), (want, shape) in zip(_converted(gguf_weights(index), dtype), layout):
            if out is not None:
                try:
                    if name != want or tuple(tensor.shape) != shape:
                        raise ValueError(f"{name} {tuple(tensor.shape)} came for {want} {shape}")
                    raw = tensor.contiguous().view(torch.uint8).numpy()
                    out.write(raw.data)
                    crcs.append(zlib.crc32(raw))  # type: ignore[arg-type]  # as in _crc32
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
            data = {
                "bytes": (entry / DATA).stat().st_size,
                "dtype": _FORMATS[dtype][0],
                "tensors": tensors,
            }
            write_description(entry / DESCRIPTION, index.path, data, version=VERSION)
            log.info("cached the dequantized weights in %s", entry)
            _remove_older(entry, index.path, _FORMATS[dtype][0])
    except OSError as e:
        log.warning("cannot write the weight cache %s (%s)", entry, e)
    finally:
        if out is not None:
            out.close()
        tmp.unlink(missing_ok=True)


def _header(layout: Layout, dtype: torch.dtype) -> bytes:
    """safetensors' header: little-endian u64 length, then JSON padded to 8 bytes."""
    header, at = {}, 0
    for name, shape in layout:
        end = at + dtype.itemsize * math.prod(shape)
        header[name] = {
            "dtype": _FORMATS[dtype][0],
            "shape": list(shape),
            "data_offsets": [at, end],
        }
        at = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _remove_older(entry: Path, source: Path, dtype: str) -> None:
    """Other entries of this dtype cached from the same GGUF path (the file was replaced)."""
    for other in entry.parent.glob(f"{Path(source).stem}-*"):
        if other == entry or not other.is_dir():
            continue
        try:
            meta = json.loads((other / DESCRIPTION).read_text(encoding="utf-8"))
            stale = meta["source"]["path"] == str(Path(source).absolute())
            stale = stale and meta.get("dtype", "F32") == dtype
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours to judge (another process may be writing it)
        if stale:
            shutil.rmtree(other, ignore_errors=True)
