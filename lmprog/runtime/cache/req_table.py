"""ReqToTokenTable: the request-to-token table and its free rows.

    table[row, j] = KV slot of token j of the request holding `row`   (int32)
    rows: 0 .. max_running_requests - 1; width: max_context_len rounded up to whole pages
    entries past a request's allocated length are 0 (the pool's dummy slot)

The table is a numpy array on the host. A CPU engine can wrap it without a copy
(`torch.from_numpy(table.table)`); a GPU engine mirrors it on the device and, per step,
copies the new out-slots (and whole rows whose prefix changed, see Req.row_dirty).
"""

from __future__ import annotations

import numpy as np

from .allocator import SLOT_DTYPE
from .base import require


class ReqToTokenTable:
    def __init__(self, max_running_requests: int, max_context_len: int, page_size: int = 1) -> None:
        if max_running_requests < 1 or max_context_len < 1:
            raise ValueError(
                f"need max_running_requests >= 1 and max_context_len >= 1, got "
                f"{max_running_requests} and {max_context_len}"
            )
        width = -(-max_context_len // page_size) * page_size
        self.table = np.zeros((max_running_requests, width), dtype=SLOT_DTYPE)
        self._free_rows = list(range(max_running_requests - 1, -1, -1))  # row 0 handed out first
        self._in_use = np.zeros(max_running_requests, dtype=bool)

    @property
    def num_rows(self) -> int:
        return self.table.shape[0]

    @property
    def width(self) -> int:
        return self.table.shape[1]

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        """A free row (all zeros), or None when every row is in use."""
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self._in_use[row] = True
        return row

    def free(self, row: int, used_len: int) -> None:
        """Return row; its first used_len entries are zeroed (the rest already are)."""
        assert self._in_use[row], f"row {row} freed twice"
        self.table[row, :used_len] = 0
        self._in_use[row] = False
        self._free_rows.append(row)

    def clear(self) -> None:
        """Every row free and zeroed; the table array itself is kept (a CPU runner wraps it)."""
        self.table[:] = 0
        self._free_rows = list(range(self.num_rows - 1, -1, -1))
        self._in_use[:] = False

    def rows_in_use(self) -> np.ndarray:
        return np.flatnonzero(self._in_use)

    def check_integrity(self) -> None:
        free = self._free_rows
        require(len(set(free)) == len(free), "req_to_token: a row is free twice")
        require(
            not self._in_use[free].any() if free else True,
            "req_to_token: a row is both free and in use",
        )
        require(
            len(free) + int(self._in_use.sum()) == self.num_rows,
            "req_to_token: a row is neither free nor in use",
        )
