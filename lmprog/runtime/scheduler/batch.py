"""ScheduledBatch: what the scheduler hands the engine for one forward pass. Plain data.

One entry per scheduled request; its tokens occupy [offset, offset + num_new) of the
batch's token arrays (`out_slots`, `positions`, `input_ids()`), entries in order:

    tokens:  | entry 0: num_new_0 | entry 1: num_new_1 | ...
    entry e feeds positions start .. end-1 of its request (end = start + num_new); their KV
    goes to out_slots[offset:offset+num_new], which equal req_to_token[row, start:end].

Decode: num_new == 1. Prefill chunk: num_new >= 1 and `sample` only on the last chunk.
Verify: the last `len(draft_ids)` fed tokens are speculative drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..request import Req


class ScheduledEntry(NamedTuple):
    """One request's share of the step (immutable; a NamedTuple because a batch builds one
    per running request per step)."""

    req: Req
    row: int  # req_to_token row
    start: int  # first fed position == tokens whose KV was computed before this step
    num_new: int  # tokens fed this step (>= 1)
    offset: int  # index of its first token in the batch token arrays
    logits_from: int | None  # logits wanted for fed positions >= this (None: no logits)
    sample: bool  # sample next token(s) from the logits of the last real fed position
    sync_row: bool  # row [0, start) changed since last scheduled: copy req_to_token[row, :end]
    draft_ids: tuple[int, ...] = ()  # verify: the speculative tokens fed after the real one

    @property
    def end(self) -> int:
        return self.start + self.num_new

    @property
    def num_draft(self) -> int:
        return len(self.draft_ids)

    def input_ids(self) -> list[int]:
        """The token ids fed (valid until the next process_results / replace_tokens)."""
        real = self.req.token_ids[self.start: self.end - len(self.draft_ids)]
        return real + list(self.draft_ids) if self.draft_ids else real


@dataclass(frozen=True)
class ScheduledBatch:
    """entries: what to run. out_slots (int32) and positions (int64): per fed token.
    retracted: requests retracted while building this batch (back in the queue, KV freed
    or cached; their generated tokens are kept)."""

    entries: tuple[ScheduledEntry, ...]
    out_slots: np.ndarray
    positions: np.ndarray
    retracted: tuple[Req, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.entries

    @property
    def num_tokens(self) -> int:
        return len(self.positions)

    @property
    def num_decodes(self) -> int:
        return sum(1 for e in self.entries if e.num_new == 1)

    def input_ids(self) -> np.ndarray:
        ids: list[int] = []
        for e in self.entries:
            ids.extend(e.input_ids())
        return np.asarray(ids, dtype=np.int64)

    def rows(self) -> np.ndarray:
        return np.fromiter((e.row for e in self.entries), np.int64, len(self.entries))

    def seq_lens(self) -> np.ndarray:
        return np.fromiter((e.end for e in self.entries), np.int64, len(self.entries))

    def extend_lens(self) -> np.ndarray:
        return np.fromiter((e.num_new for e in self.entries), np.int64, len(self.entries))

    def logits_indices(self) -> np.ndarray:
        """Token indices (into the batch's token arrays) whose logits are wanted, in order."""
        parts = [np.arange(e.offset + e.logits_from - e.start, e.offset + e.num_new)
                 for e in self.entries if e.logits_from is not None]
        return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)
