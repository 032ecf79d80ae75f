"""StepChannel: rank 0's model runner hands each step's inputs to every worker.

Per step a header and an int64 payload on the plan group (gloo, host memory), then, for
overlap steps, the previous step's tokens on the device group. With LoRA adapters, what
rank 0's LoraManager did to its pool since the last step (adapters loaded or dropped, slots
paged in) goes first, and the step carries each entry's slot. A token-tree verify step
carries its entries' draft parents (each rank builds the masks), and the KV copies of the
accepted paths go as their own message when rank 0 makes them, each rank copying its own
heads. Workers keep their own request-to-token table in step. Wire format:
docs/design/tensor-parallel.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..executor.model_runner import StepInputs
from ..lora.ops import plan_lora_step
from ..scheduler.sinks import KVShift
from .group import TPGroup

_STOP, _STEP, _LORA, _MOVES = 0, 1, 2, 3
# kind, tokens, batch, logits, sync rows, future, its dtype, LoRA block_m, tree ints, size
_HEADER = 10
_DTYPES = (None, torch.int64, torch.int32)
_CAUSAL = -1  # a tree's length on the wire for an entry without one


class StepChannel:
    """lora: this rank's LoraManager (None: no adapters); rank 0's is mirrored, each
    worker's follows it. kv_moves: a worker's ModelRunner.copy_kv, which rank 0's token-tree
    KV copies are handed to (None on rank 0)."""

    def __init__(
        self, group: TPGroup, lora: Any = None, kv_moves: Callable[[KVShift], None] | None = None
    ) -> None:
        self.group = group
        self.lora = lora
        self.kv_moves = kv_moves
        self._closed = False

    # ---- rank 0 ------------------------------------------------------------------------------
    def send(self, step: StepInputs, future: torch.Tensor | None, table: np.ndarray) -> None:
        if self.lora is not None:
            changes = self.lora.take_changes()
            if changes:  # before the step: its page-ins may use them
                self.group.broadcast_host(_header(_LORA))
                self.group.send_object(changes)
        fed = step.host[: step.num_tokens]
        future = future if future is not None and fed.min() < 0 else None
        plan = step.lora
        header = [_STEP, step.num_tokens, step.batch_size, step.num_logits, len(step.sync)]
        header += [0, 0] if future is None else [future.shape[0], _DTYPES.index(future.dtype)]
        header.append(0 if plan is None else plan.block_m)
        trees = None if step.tree is None else _pack_trees(step.tree)
        header.append(0 if trees is None else trees.size)
        parts = [step.host]
        if plan is not None:
            parts.append(plan.entry_slots.astype(np.int64))
        if trees is not None:
            parts.append(trees)
        if step.sync:
            parts.append(np.asarray(step.sync, dtype=np.int64).reshape(-1))
            parts.extend(table[row, :end].astype(np.int64) for row, end in step.sync)
        payload = np.concatenate(parts) if len(parts) > 1 else step.host
        self.group.broadcast_host(torch.tensor([*header, payload.size], dtype=torch.int64))
        self.group.broadcast_host(torch.from_numpy(payload))
        if future is not None:
            self.group.broadcast(future.contiguous())

    def send_moves(self, moves: KVShift) -> None:
        """Rank 0: KV copies (src -> dst slots, in order) every worker makes in its own pool
        before the next step (token trees' accepted paths; delta unused)."""
        n = len(moves.src)
        header = _header(_MOVES)
        header[1] = header[-1] = 2 * n
        self.group.broadcast_host(header)
        payload = np.concatenate([moves.src, moves.dst]).astype(np.int64)
        self.group.broadcast_host(torch.from_numpy(payload))

    def close(self) -> None:
        """Rank 0: tell the workers to stop (when they can still hear it), close the group."""
        if not self._closed:
            self._closed = True
            self.group.close(farewell=self._stop)

    def _stop(self) -> None:
        self.group.broadcast_host(_header(_STOP))

    # ---- workers -----------------------------------------------------------------------------
    def recv(self, table: np.ndarray) -> tuple[StepInputs, torch.Tensor | None] | None:
        """The next step (its sync rows and fed slots already written into `table`, rank
        0's LoRA changes applied, its KV moves made), and its future tokens; None when rank
        0 stops."""
        while True:
            header = self.group.broadcast_host(_header(_STOP)).tolist()
            kind, t, b, r, nsync, nfuture, dtype, block_m, ntree, size = header
            if kind == _STOP:
                return None
            if kind == _STEP:
                break
            if kind == _MOVES:
                self._follow_moves(size)
                continue
            changes = self.group.recv_object()
            if self.lora is None:
                raise RuntimeError("rank 0 sent LoRA changes to a rank without adapters")
            self.lora.follow(changes)
        host_len = 3 * t + 4 * b + r
        payload = self.group.broadcast_host(torch.empty(size, dtype=torch.int64)).numpy()
        host, at = payload[:host_len], host_len
        positions, slots = host[t : 2 * t], host[2 * t : 3 * t]
        rows, ext = host[3 * t : 3 * t + b], host[3 * t + 2 * b : 3 * t + 3 * b]
        plan = None
        if block_m:  # the entries' slots, as rank 0 assigned them: the same layout
            plan = plan_lora_step(payload[at : at + b], ext, block_m)
            at += b
        trees = None
        if ntree:
            trees = _unpack_trees(payload[at : at + ntree], b)
            at += ntree
        sync: tuple[tuple[int, int], ...] = ()
        if nsync:
            pairs = payload[at : at + 2 * nsync].reshape(nsync, 2)
            sync = tuple((int(row), int(end)) for row, end in pairs)
            at += 2 * nsync
            for row, end in sync:
                table[row, :end] = payload[at : at + end]
                at += end
        # a fed token's column in its row: its position, but in a token tree (siblings share
        # a position, each has its own column)
        columns = positions if trees is None else _columns(host[3 * t + b : 3 * t + 2 * b], ext)
        table[np.repeat(rows, ext), columns] = slots
        future = None
        if nfuture:
            future = torch.empty(nfuture, dtype=_DTYPES[dtype], device=self.group.device)
            self.group.broadcast(future)
        return StepInputs(host, t, b, r, sync, lora=plan, tree=trees), future

    def _follow_moves(self, size: int) -> None:
        payload = self.group.broadcast_host(torch.empty(size, dtype=torch.int64)).numpy()
        if self.kv_moves is None:
            raise RuntimeError("rank 0 sent KV moves to a rank that cannot make them")
        src, dst = payload[: size // 2], payload[size // 2 :]
        self.kv_moves(KVShift(src, dst, np.zeros_like(src)))


def _header(kind: int) -> torch.Tensor:
    t = torch.zeros(_HEADER, dtype=torch.int64)
    t[0] = kind
    return t


def _pack_trees(trees: tuple[tuple[int, ...] | None, ...]) -> np.ndarray:
    """Per entry its number of drafts (_CAUSAL: no tree), then every tree's parents."""
    sizes = [_CAUSAL if p is None else len(p) for p in trees]
    flat = [x for p in trees if p is not None for x in p]
    return np.asarray(sizes + flat, dtype=np.int64)


def _unpack_trees(packed: np.ndarray, batch: int) -> tuple[tuple[int, ...] | None, ...]:
    out: list[tuple[int, ...] | None] = []
    at = batch
    for n in packed[:batch].tolist():
        if n == _CAUSAL:
            out.append(None)
            continue
        out.append(tuple(packed[at : at + n].tolist()))
        at += n
    assert at == packed.size, "a token-tree block of the wrong size"
    return tuple(out)


def _columns(seq_lens: np.ndarray, ext: np.ndarray) -> np.ndarray:
    """Per fed token, its column in its request's row: seq_len - extend_len + its index."""
    starts = np.cumsum(ext) - ext
    return np.repeat(seq_lens - ext - starts, ext) + np.arange(int(ext.sum()))
