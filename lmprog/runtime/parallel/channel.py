"""StepChannel: rank 0's model runner hands each step's inputs to every worker.

Per step a header and an int64 payload on the plan group (gloo, host memory), then, for
overlap steps, the previous step's tokens on the device group. Workers keep their own
request-to-token table in step. Wire format: docs/design/tensor-parallel.md.
"""

from __future__ import annotations

import numpy as np
import torch

from ..executor.model_runner import StepInputs
from .group import TPGroup

_STOP, _STEP = 0, 1
_DTYPES = (None, torch.int64, torch.int32)


class StepChannel:
    def __init__(self, group: TPGroup) -> None:
        self.group = group
        self._closed = False

    # ---- rank 0 ------------------------------------------------------------------------------
    def send(self, step: StepInputs, future: torch.Tensor | None, table: np.ndarray) -> None:
        fed = step.host[: step.num_tokens]
        future = future if future is not None and fed.min() < 0 else None
        header = [_STEP, step.num_tokens, step.batch_size, step.num_logits, len(step.sync)]
        header += [0, 0] if future is None else [future.shape[0], _DTYPES.index(future.dtype)]
        parts = [step.host]
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
        self.group.broadcast_host(torch.zeros(8, dtype=torch.int64))

    # ---- workers -----------------------------------------------------------------------------
    def recv(self, table: np.ndarray) -> tuple[StepInputs, torch.Tensor | None] | None:
        """The next step (its sync rows and fed slots already written into `table`), and
        its future tokens; None when rank 0 stops."""
        header = self.group.broadcast_host(torch.zeros(8, dtype=torch.int64)).tolist()
        kind, t, b, r, nsync, nfuture, dtype, size = header
        if kind == _STOP:
            return None
        host_len = 3 * t + 4 * b + r
        payload = self.group.broadcast_host(torch.empty(size, dtype=torch.int64)).numpy()
        host = payload[:host_len]
        sync: tuple[tuple[int, int], ...] = ()
        if nsync:
            pairs = payload[host_len : host_len + 2 * nsync].reshape(nsync, 2)
            sync = tuple((int(row), int(end)) for row, end in pairs)
            at = host_len + 2 * nsync
            for row, end in sync:
                table[row, :end] = payload[at : at + end]
                at += end
        positions, slots = host[t : 2 * t], host[2 * t : 3 * t]
        rows, ext = host[3 * t : 3 * t + b], host[3 * t + 2 * b : 3 * t + 3 * b]
        table[np.repeat(rows, ext), positions] = slots
        future = None
        if nfuture:
            future = torch.empty(nfuture, dtype=_DTYPES[dtype], device=self.group.device)
            self.group.broadcast(future)
        return StepInputs(host, t, b, r, sync), future
