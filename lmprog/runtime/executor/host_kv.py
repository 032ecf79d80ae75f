"""HostKVMover: copies a KV pool's token rows to host memory and back (the host tier of
cache/hiradix.py, which holds the handles this returns).

On CUDA, saves go through pinned memory on the current stream and loads run layer by layer
on a side stream, each forward pass waiting for a layer's copies only when it reaches that
layer (`LayerLoads`); on the CPU both are plain copies. Given the tier's size (host_bytes),
copies go into one host buffer allocated (and pinned) once, in runs of its token slots
(`HostArena`), as SGLang's HiCache keeps a host pool: pinning memory per save costs more
than the copy, and the slot indices go to the device from pinned memory, so that no copy
waits for the step in flight.
Design: docs/design/kv-cache.md.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections import deque
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


Run = tuple[int, int]  # (first slot, tokens) of a HostArena


class HostArena:
    """Token slots of host memory for the host tier, allocated (pinned on CUDA) once:
    `buffer` [layers, tokens, *row], so one layer's rows of a run of slots are contiguous
    (a copy each). take(n) gives runs of free slots (one where a free run fits, else the
    first ones in address order); give(runs, event) frees them once `event` (the copies
    queued before it) is done."""

    def __init__(self, tokens: int, like: torch.Tensor, pinned: bool) -> None:
        """like: one token's rows of every layer, [layers, 1, *row]. pinned: page-locked
        in place (cudaHostRegister: the caching pinned allocator would round the size up to
        a power of two)."""
        shape = (like.shape[0], tokens, *like.shape[2:])
        self.buffer = torch.empty(shape, dtype=like.dtype)
        if pinned and _register(self.buffer):  # unlocked with the arena
            weakref.finalize(self, torch.cuda.cudart().cudaHostUnregister, self.buffer.data_ptr())
        self.tokens = self.free_tokens = tokens
        self._free: list[Run] = [(0, tokens)]  # sorted by slot, none adjacent
        self._pending: deque[tuple[Any, list[Run]]] = deque()  # (event, runs), in order
        self._lock = threading.Lock()  # give() runs where a handle's last reference drops

    def take(self, n: int) -> list[Run] | None:
        """Runs of n free slots in all, or None when fewer are free (nothing taken)."""
        with self._lock:
            self._reclaim(n)
            if self.free_tokens < n:
                return None
            self.free_tokens -= n
            for i, (start, length) in enumerate(self._free):
                if length >= n:
                    self._free[i : i + 1] = [(start + n, length - n)] if length > n else []
                    return [(start, n)]
            runs, need = [], n
            while need:
                start, length = self._free[0]
                use = min(length, need)
                runs.append((start, use))
                need -= use
                self._free[0:1] = [(start + use, length - use)] if use < length else []
            return runs

    def give(self, runs: list[Run], event: Any = None) -> None:
        """Free `runs`; with a CUDA event, only once it has completed."""
        with self._lock:
            if event is None:
                self._merge(runs)
            else:
                self._pending.append((event, runs))

    def _reclaim(self, need: int) -> None:
        while self._pending and (
            self._pending[0][0].query() or self.free_tokens < need
        ):  # completed, or waited for while short of slots
            event, runs = self._pending.popleft()
            event.synchronize()
            self._merge(runs)

    def _merge(self, runs: list[Run]) -> None:
        self.free_tokens += sum(n for _, n in runs)
        merged: list[Run] = []
        for start, n in sorted(self._free + runs):
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((start, n))
        self._free = merged


def _register(buffer: torch.Tensor) -> bool:
    """Page-lock `buffer` for asynchronous copies; False (it stays pageable: synchronous
    copies) where the driver refuses, with a warning."""
    cudart = torch.cuda.cudart()
    ptr, size = buffer.data_ptr(), buffer.numel() * buffer.element_size()
    status = cudart.cudaHostRegister(ptr, size, 0)
    if int(status) != 0:
        warnings.warn(
            f"could not pin the host KV tier's {size / 2**30:.1f} GiB (CUDA error "
            f"{int(status)}): its copies will be synchronous",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


class HostBlock:
    """A host-tier copy of `n` tokens: `runs` of `buffer` ([layers, tokens, *row]), the
    mover's arena or a tensor of its own (the arena full); the arena's runs are freed when
    the block's last reference drops."""

    __slots__ = ("buffer", "runs", "n", "release", "__weakref__")

    def __init__(self, buffer: torch.Tensor, runs: list[Run]) -> None:
        self.buffer, self.runs = buffer, runs
        self.n = sum(n for _, n in runs)
        self.release: weakref.finalize[Any, Any] | None = None  # an arena block's: frees its runs

    def parts(self) -> list[torch.Tensor]:
        """Each run's rows, [layers, run tokens, *row] (views)."""
        return [self.buffer[:, start : start + n] for start, n in self.runs]


class HostKVMover:
    """The KVMover of `pool` (cache.hiradix.KVMover)."""

    def __init__(self, pool: KVPool, disk_dir: str | None = None, host_bytes: int = 0) -> None:
        """disk_dir: the disk tier's parent folder ("" the system's temporary one; None: no
        disk tier); this mover's block files go in a folder of its own there
        (lmprog.core.blockfile.BlockDir), removed with it. host_bytes: the host tier's
        size, allocated at once as the HostArena its copies go to (0: a tensor each)."""
        buffer = pool._buffer
        self._rows = buffer.view(_BITS[buffer.element_size()])  # copies move bits only
        self._axis = buffer.dim() - 3  # the slot axis: [L, 2, S, H, D] or [L, S, 1, W]
        self.device = buffer.device
        self.bytes_per_token = buffer.element_size() * buffer.numel() // buffer.shape[self._axis]
        self._cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self.arena: HostArena | None = None
        if host_bytes >= self.bytes_per_token:
            like = self._rows.narrow(self._axis, 0, 1).movedim(self._axis, 1)
            self.arena = HostArena(host_bytes // self.bytes_per_token, like, self._cuda)
        self._loads: LayerLoads | None = None
        if self._cuda:  # the pool's forward passes wait per layer (KVPool.wait_layer)
            current = torch.cuda.current_stream
            if pool.loads is None:  # (a second mover of the pool shares the first's)
                pool.loads = LayerLoads(
                    pool.num_slots, lambda event: current(self.device).wait_event(event)
                )
            self._loads = pool.loads
        self.disk = None if disk_dir is None else BlockDir(disk_dir)

    def save(self, slots: np.ndarray) -> HostBlock:
        if self._loads is not None:  # a load into these slots may still be copying
            self._loads.fence(slots)
        rows = self._rows.index_select(self._axis, self._index(slots)).movedim(self._axis, 1)
        runs = None if self.arena is None else self.arena.take(len(slots))
        if runs is None:  # a tensor of its own
            host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=self._cuda)
            host.copy_(rows, non_blocking=self._cuda)
            return HostBlock(host, [(0, len(slots))])
        assert self.arena is not None
        block = self._arena_block(runs)
        if self._cuda:  # one contiguous copy per layer and run
            rows = rows.contiguous()
        offset = 0
        for part in block.parts():
            n = part.shape[1]
            if self._cuda:
                for layer in range(part.shape[0]):
                    part[layer].copy_(rows[layer, offset : offset + n], non_blocking=True)
            else:
                part.copy_(rows[:, offset : offset + n])
            offset += n
        return block

    def load(self, handle: HostBlock, slots: np.ndarray, ahead: bool = False) -> None:
        """ahead: a staged load (no forward pass reads it before the next step's)."""
        parts = handle.parts()
        if not self._cuda:
            rows = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
            self._rows.index_copy_(self._axis, self._index(slots), rows.movedim(1, self._axis))
            return
        current = torch.cuda.current_stream(self.device)
        side, loads = self._stream, self._loads
        assert side is not None and loads is not None
        # after everything queued so far: the saves that wrote this handle, and the step in
        # flight that may still use these slots (freed by the requests it ends)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            index = self._index(slots)
            layer_rows = torch.empty(
                (handle.n, *parts[0].shape[2:]), dtype=self._rows.dtype, device=self.device
            )
            for layer in range(handle.buffer.shape[0]):  # layer by layer, an event after each
                offset = 0
                for part in parts:
                    n = part.shape[1]
                    layer_rows[offset : offset + n].copy_(part[layer], non_blocking=True)
                    offset += n
                self._rows[layer].index_copy_(
                    self._axis - 1, index, layer_rows.movedim(0, self._axis - 1)
                )
                event = torch.cuda.Event()
                event.record(side)
                loads.record(layer, event, ahead)
        loads.add_slots(np.asarray(slots), ahead)

    def split(self, handle: HostBlock, k: int) -> tuple[HostBlock, HostBlock]:
        """The first k tokens and the rest: the arena's runs parted (no copy), a tensor of
        its own copied in two (the tier counts them apart)."""
        if self.arena is not None and handle.buffer is self.arena.buffer:
            upper, lower, seen = [], [], 0
            for start, n in handle.runs:
                if seen + n <= k:
                    upper.append((start, n))
                elif seen >= k:
                    lower.append((start, n))
                else:
                    upper.append((start, k - seen))
                    lower.append((start + k - seen, n - (k - seen)))
                seen += n
            assert handle.release is not None
            handle.release.detach()  # its runs are the parts' now
            return self._arena_block(upper), self._arena_block(lower)
        if self._cuda:  # the copy into this pinned handle may still be under way
            torch.cuda.current_stream(self.device).synchronize()
        rows = handle.parts()[0]
        return tuple(  # type: ignore[return-value]
            HostBlock(
                torch.empty(p.shape, dtype=p.dtype, pin_memory=self._cuda).copy_(p),
                [(0, p.shape[1])],
            )
            for p in (rows[:, :k], rows[:, k:])
        )

    def _arena_block(self, runs: list[Run]) -> HostBlock:
        """A block of the arena's `runs`, which go back to it with the block's last
        reference (on CUDA once the copies queued by then are done)."""
        assert self.arena is not None
        block = HostBlock(self.arena.buffer, runs)
        block.release = weakref.finalize(block, self._free_runs, runs)
        return block

    def _free_runs(self, runs: list[Run]) -> None:
        assert self.arena is not None
        event = None
        if self._cuda:  # after the save that wrote them and every load that reads them
            side = self._stream
            assert side is not None
            side.wait_stream(torch.cuda.current_stream(self.device))
            event = torch.cuda.Event()
            event.record(side)
        self.arena.give(runs, event)

    def _index(self, slots: np.ndarray) -> torch.Tensor:
        index = torch.from_numpy(np.asarray(slots, dtype=np.int64))
        if not self._cuda:
            return index
        # from pinned memory: a copy from pageable memory waits for the stream's work
        return index.pin_memory().to(self.device, non_blocking=True)

    # -- the disk tier ---------------------------------------------------------------------
    def spill(self, handle: Any) -> DiskBlock:
        """Write a host handle to a block file of its own; OSError when it cannot be
        written (nothing is left behind)."""
        assert self.disk is not None, "no disk tier"
        if self._cuda:  # the copy into this pinned handle may still be under way
            torch.cuda.current_stream(self.device).synchronize()
        parts = handle.parts()
        rows = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
        ref = self.disk.write(rows.contiguous().numpy().tobytes())
        return DiskBlock(ref, tuple(rows.shape))

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

    def _read(self, block: DiskBlock) -> HostBlock:
        """The block's rows in a (pinned) tensor of their own: a load reads them at once."""
        assert self.disk is not None
        data = self.disk.read(block.ref)
        rows = np.frombuffer(data, dtype=_NUMPY[self._rows.dtype]).reshape(block.shape)
        host = torch.from_numpy(rows.copy())
        return HostBlock(host.pin_memory() if self._cuda else host, [(0, block.shape[1])])
