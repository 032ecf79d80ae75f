"""StepChannel: rank 0's model runner hands each step's inputs to every worker.

Per step a header and an int64 payload on the plan group (gloo, host memory), then, for
overlap steps, the previous step's tokens on the device group. With LoRA adapters, what
rank 0's LoraManager did to its pool since the last step (adapters loaded or dropped, slots
paged in) goes first, and the step carries each entry's slot. Workers keep their own
request-to-token table in step. Wire format: docs/design/tensor-parallel.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..executor.model_runner import StepInputs
from ..lora.ops import plan_lora_step
from .group import TPGroup

_STOP, _STEP, _LORA = 0, 1, 2
_HEADER = 9  # kind, tokens, batch, logits, sync rows, future, its dtype, LoRA block_m, size
_DTYPES = (None, torch.int64, torch.int32)


class StepChannel:
    """lora: this rank's LoraManager (None: no adapters); rank 0's is mirrored, each
    worker's follows it."""

    def __init__(self, group: TPGroup, lora: Any = None) -> None:
        self.group = group
        self.lora = lora
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
        parts = [step.host]
        if plan is not None:
            parts.append(plan.entry_slots.astype(np.int64))
        if step.sync:
            parts.append(np.asarray(step.sync, dtype=np.int64).reshape(-1))
            parts.extend(table[row, :end].astype(np.int64) for row, end in step.sync)
        payload = np.concatenate(parts) if len(parts) > 1 else step.host
        self.group.broadcast_host(torch.tensor([*header, payload.size], dtype=torch.int64))
        self.group.broadcast_host(torch.from_numpy(payload))
        if future is not None:
            self.group.broadcast(future.contiguous())

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
        0's LoRA changes applied), and its future tokens; None when rank 0 stops."""
        while True:
            header = self.group.broadcast_host(_header(_STOP)).tolist()
            kind, t, b, r, nsync, nfuture, dtype, block_m, size = header
            if kind == _STOP:
                return None
            if kind != _LORA:
                break
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
        sync: tuple[tuple[int, int], ...] = ()
        if nsync:
            pairs = payload[at : at + 2 * nsync].reshape(nsync, 2)
            sync = tuple((int(row), int(end)) for row, end in pairs)
            at += 2 * nsync
            for row, end in sync:
                table[row, :end] = payload[at : at + end]
                at += end
        table[np.repeat(rows, ext), positions] = slots
        future = None
        if nfuture:
            future = torch.empty(nfuture, dtype=_DTYPES[dtype], device=self.group.device)
            self.group.broadcast(future)
        return StepInputs(host, t, b, r, sync, lora=plan), future


def _header(kind: int) -> torch.Tensor:
    t = torch.zeros(_HEADER, dtype=torch.int64)
    t[0] = kind
    return t
