"""HostKVMover: copies a KV pool's token rows to host memory and back (the host tier of
cache/hiradix.py, which holds the handles this returns).

On CUDA, saves go through pinned memory on the current stream and loads run layer by layer
on a side stream, each forward pass waiting for a layer's copies only when it reaches that
layer (`LayerLoads`); on the CPU both are plain copies.
Design: docs/design/kv-cache.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lmprog.core.blockfile import BlockDir, BlockRef

from .kv_pool import KVPool
from .layer_loads import LayerLoads

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY = {
    torch.uint8: np.uint8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
}


@dataclass(frozen=True)
class DiskBlock:
    """A disk-tier handle: the checked block file (lmprog.core.blockfile) and its shape."""

    ref: BlockRef
    shape: tuple[int, ...]


class HostKVMover:
    """The KVMover of `pool` (cache.hiradix.KVMover)."""

    def __init__(self, pool: KVPool, disk_dir: str | None = None) -> None:
        """disk_dir: the disk tier's parent folder ("" the system's temporary one; None: no
        disk tier); this mover's block files go in a folder of its own there
        (lmprog.core.blockfile.BlockDir), removed with it."""
        buffer = pool._buffer
        self._rows = buffer.view(_BITS[buffer.element_size()])  # copies move bits only
        self._axis = buffer.dim() - 3  # the slot axis: [L, 2, S, H, D] or [L, S, 1, W]
        self.device = buffer.device
        self.bytes_per_token = buffer.element_size() * buffer.numel() // buffer.shape[self._axis]
        self._cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._loads: LayerLoads | None = None
        if self._cuda:  # the pool's forward passes wait per layer (KVPool.wait_layer)
            current = torch.cuda.current_stream
            if pool.loads is None:  # (a second mover of the pool shares the first's)
                pool.loads = LayerLoads(
                    pool.num_slots, lambda event: current(self.device).wait_event(event)
                )
            self._loads = pool.loads
        self.disk = None if disk_dir is None else BlockDir(disk_dir)

    def save(self, slots: np.ndarray) -> torch.Tensor:
        if self._loads is not None:  # a load into these slots may still be copying
            self._loads.fence(slots)
        rows = self._rows.index_select(self._axis, self._index(slots))
        if not self._cuda:
            return rows
        host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
        host.copy_(rows, non_blocking=True)
        return host

    def load(self, handle: Any, slots: np.ndarray, ahead: bool = False) -> None:
        """ahead: a staged load (no forward pass reads it before the next step's)."""
        if not self._cuda:
            self._rows.index_copy_(self._axis, self._index(slots), handle)
            return
        current = torch.cuda.current_stream(self.device)
        side, loads = self._stream, self._loads
        assert side is not None and loads is not None
        # after everything queued so far: the saves that wrote this handle, and the step in
        # flight that may still use these slots (freed by the requests it ends)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            index = self._index(slots)
            for layer in range(handle.shape[0]):  # layer by layer, an event after each
                rows = handle[layer].to(self.device, non_blocking=True)
                self._rows[layer].index_copy_(self._axis - 1, index, rows)
                event = torch.cuda.Event()
                event.record(side)
                loads.record(layer, event, ahead)
        loads.add_slots(np.asarray(slots), ahead)

    def split(self, handle: Any, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each part its own copy, so dropping one frees its memory (the tier counts them
        apart)."""
        if self._cuda:  # the copy into this pinned handle may still be under way
            torch.cuda.current_stream(self.device).synchronize()
        n = handle.shape[self._axis]
        parts = handle.narrow(self._axis, 0, k), handle.narrow(self._axis, k, n - k)
        return tuple(  # type: ignore[return-value]
            torch.empty(p.shape, dtype=p.dtype, pin_memory=self._cuda).copy_(p) for p in parts
        )

    def _index(self, slots: np.ndarray) -> torch.Tensor:
        index = torch.from_numpy(np.asarray(slots, dtype=np.int64))
        return index.to(self.device, non_blocking=True) if self._cuda else index

    # -- the disk tier ---------------------------------------------------------------------
    def spill(self, handle: Any) -> DiskBlock:
        """Write a host handle to a block file of its own; OSError when it cannot be
        written (nothing is left behind)."""
        assert self.disk is not None, "no disk tier"
        if self._cuda:  # the copy into this pinned handle may still be under way
            torch.cuda.current_stream(self.device).synchronize()
        ref = self.disk.write(handle.contiguous().numpy().tobytes())
        return DiskBlock(ref, tuple(handle.shape))

    def load_disk(self, block: DiskBlock, slots: np.ndarray, ahead: bool = False) -> None:
        """BlockFileError (nothing written) unless the file holds exactly the block."""
        self.load(self._read(block), slots, ahead)

    def split_disk(self, block: DiskBlock, k: int) -> tuple[DiskBlock, DiskBlock]:
        upper, lower = self.split(self._read(block), k)
        first = self.spill(upper)
        try:
            second = self.spill(lower)
        except BaseException:  # nothing left behind: the block stays as it was
            self.discard(first)
            raise
        self.discard(block)
        return first, second

    def discard(self, block: DiskBlock) -> None:
        assert self.disk is not None
        self.disk.discard(block.ref)

    def _read(self, block: DiskBlock) -> torch.Tensor:
        assert self.disk is not None
        data = self.disk.read(block.ref)
        rows = np.frombuffer(data, dtype=_NUMPY[self._rows.dtype]).reshape(block.shape)
        host = torch.from_numpy(rows.copy())
        return host.pin_memory() if self._cuda else host
