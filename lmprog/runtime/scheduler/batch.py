"""ScheduledBatch: what the scheduler hands the engine for one forward pass. Plain data.

One entry per scheduled request, its tokens at [offset, offset + num_new) of the batch's
token arrays, their KV going to out_slots. Decode: num_new == 1; prefill chunk: `sample`
on the last chunk only; verify: m pending real tokens then k drafts, k + 1 rows sampled
(the drafts a chain, or a token tree: `draft_parents`, its attention mask built from `trees`).
Layout diagrams: docs/design/scheduling.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..request import Req

if TYPE_CHECKING:
    from .sinks import KVShift

_NEVER = np.iinfo(np.int64).max


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
    draft_ids: tuple[int, ...] = ()  # verify: the speculative tokens fed after the real ones
    evicted: int = 0  # req.num_evicted when scheduled (attention sinks: token indices of this
    # entry are shifted down by the tokens evicted since)
    draft_parents: tuple[int, ...] | None = None  # a token tree's parents (None: a chain);
    # draft i is fed at index end - num_draft + i, at position root + 1 + its depth

    @property
    def end(self) -> int:
        return self.start + self.num_new

    @property
    def num_draft(self) -> int:
        return len(self.draft_ids)

    def input_ids(self) -> list[int]:
        """The token ids fed (valid until the step's results are recorded)."""
        real = self.req.token_ids[self.start : self.end - len(self.draft_ids)]
        return real + list(self.draft_ids) if self.draft_ids else real


@dataclass(frozen=True)
class ScheduledBatch:
    """entries: what to run. out_slots (int32) and positions (int64): per fed token.
    retracted: requests retracted while building this batch (back in the queue, KV freed
    or cached; their generated tokens are kept).
    kv_shift: attention sinks' KV moves to do before this step (even an empty one)."""

    entries: tuple[ScheduledEntry, ...]
    out_slots: np.ndarray
    positions: np.ndarray
    retracted: tuple[Req, ...] = ()
    kv_shift: KVShift | None = None

    @property
    def is_empty(self) -> bool:
        return not self.entries

    @property
    def num_tokens(self) -> int:
        return len(self.positions)

    @property
    def num_decodes(self) -> int:
        return self._columns["num_new"].count(1)

    # The per-entry arrays below come from the entries' fields as columns, transposed once
    # per batch (one pass in C rather than a Python loop per array: they are rebuilt for
    # every running request every step).
    @cached_property
    def _columns(self) -> dict[str, tuple[Any, ...]]:
        columns = zip(*self.entries) if self.entries else [()] * len(ScheduledEntry._fields)
        return dict(zip(ScheduledEntry._fields, columns))

    def _ints(self, field: str) -> np.ndarray:
        return np.array(self._columns[field], dtype=np.int64)

    def input_ids(self) -> np.ndarray:
        if self.num_tokens == len(self.entries):  # decodes only: each feeds one pending token
            cols = self._columns
            return np.array(
                [req.token_ids[start] for req, start in zip(cols["req"], cols["start"])],
                dtype=np.int64,
            )
        ids: list[int] = []
        for e in self.entries:
            ids.extend(e.input_ids())
        return np.asarray(ids, dtype=np.int64)

    def rows(self) -> np.ndarray:
        return self._ints("row")

    def seq_lens(self) -> np.ndarray:
        lens: np.ndarray = self._ints("start") + self.extend_lens()
        return lens

    def extend_lens(self) -> np.ndarray:
        return self._ints("num_new")

    def logits_indices(self) -> np.ndarray:
        """Token indices (into the batch's token arrays) whose logits are wanted, in order:
        those at fed positions >= their entry's logits_from."""
        logits_from: Sequence[int | None] = self._columns["logits_from"]
        if None in logits_from:  # no logits: from a position never fed
            logits_from = [_NEVER if lf is None else lf for lf in logits_from]
        per_token = np.repeat(np.array(logits_from, dtype=np.int64), self.extend_lens())
        return np.flatnonzero(self.positions >= per_token)

    def trees(self) -> tuple[tuple[int, ...] | None, ...] | None:
        """Each entry's draft parents (None: a causal entry), None when no entry verifies a
        token tree; their attention masks: draft_tree.tree_masks."""
        if not any(e.draft_parents is not None for e in self.entries):
            return None
        return tuple(e.draft_parents for e in self.entries)
