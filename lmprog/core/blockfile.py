"""Checked block files, the disk tiers of the KV caches (the runtime's host tier,
lmprog.runtime.executor.host_kv, and llama.cpp's saved states, lmprog.backends.state_cache).

    blocks = BlockDir(parent)
    ref = blocks.write(payload); payload = blocks.read(ref)   # BlockFileError: recompute

A file is whole or absent, and read back only if its size, header and checksum match.
Design: docs/design/foundations.md.
"""

from __future__ import annotations

import itertools
import os
import shutil
import struct
import tempfile
import weakref
import zlib
from dataclasses import dataclass

MAGIC = b"LPBLK001"
_HEAD = struct.Struct("<8sQI")  # magic, payload bytes, CRC-32
_PREFIX = "lmprog-kv-"


class BlockFileError(OSError):
    """A block file is missing, truncated or corrupt."""


@dataclass(frozen=True)
class BlockRef:
    """A written block: its file and the payload it must hold."""

    path: str
    nbytes: int
    crc: int


class BlockDir:
    """This process's block files under `parent` (None or "": the system's temporary
    folder)."""

    def __init__(self, parent: str | None = None) -> None:
        base = parent or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        remove_stale(base)
        self.path = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base)
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, True)
        self._names = itertools.count()

    def write(self, payload: bytes | memoryview) -> BlockRef:
        """Write one block; OSError (a full disk, say) leaves no file behind."""
        crc = zlib.crc32(payload)
        path = os.path.join(self.path, f"{next(self._names)}.blk")
        try:
            with open(path + ".tmp", "wb") as f:
                f.write(_HEAD.pack(MAGIC, len(payload), crc))
                f.write(payload)
            os.replace(path + ".tmp", path)
        except OSError:
            _unlink(path + ".tmp")
            raise
        return BlockRef(path, len(payload), crc)

    def read(self, ref: BlockRef) -> bytes:
        """The block's payload, checked (BlockFileError unless it is exactly what was
        written)."""
        try:
            with open(ref.path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise BlockFileError(f"KV block {ref.path} cannot be read: {e}") from e
        if len(raw) != _HEAD.size + ref.nbytes:
            raise BlockFileError(
                f"KV block {ref.path} holds {len(raw)} bytes, not {_HEAD.size + ref.nbytes} "
                "(truncated?)"
            )
        payload = raw[_HEAD.size :]
        if _HEAD.unpack_from(raw) != (MAGIC, ref.nbytes, ref.crc) or zlib.crc32(payload) != ref.crc:
            raise BlockFileError(f"KV block {ref.path} is corrupt (header or checksum)")
        return payload

    def discard(self, ref: BlockRef) -> None:
        _unlink(ref.path)

    def close(self) -> None:
        """Remove the folder and every block in it now."""
        self._finalizer()


def remove_stale(parent: str) -> None:
    """Remove the block folders in `parent` of processes that are gone."""
    for name in os.listdir(parent):
        pid = name[len(_PREFIX) :].split("-", 1)[0]
        if not name.startswith(_PREFIX) or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        except (PermissionError, OverflowError):
            pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
